"""``python -m spark_jobs <command>``: the job commands of :mod:`spark_jobs.cli`, and ``server``; exit codes as
:data:`spark_jobs.cli.EXIT_CODES` (``--help`` lists them)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

if __name__ == "__main__" and __spec__ is None and sys.path:
    # Run as a file (``spark-submit .../spark_jobs/__main__.py``), Python put this package's folder first on
    # sys.path, where its modules (errors, jobs, lake, ...) could shadow another distribution's top-level names
    # (the standard library's, imported above, has none of them). Put the package's parent there instead: it then
    # imports as with ``python -m spark_jobs``, installed or not.
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if os.path.abspath(sys.path[0] or os.curdir) == _HERE:
        sys.path[0] = os.path.dirname(_HERE)

from spark_jobs import cli

__all__ = ["build_parser", "main"]


def _add_server(sub: Any) -> None:
    from spark_jobs.server.server_cli import add_server_parser, run_server

    add_server_parser(sub).set_defaults(func=run_server)


def build_parser() -> argparse.ArgumentParser:
    return cli.build_parser([_add_server])


def main(argv: Sequence[str] | None = None, *, keep_session: bool = False) -> int:
    """Run one command (see :func:`spark_jobs.cli.run_parsed`)."""
    return cli.run_parsed(build_parser(), argv, keep_session=keep_session)


def run() -> None:
    """The command line's entry point: exit with :func:`main`'s code without the interpreter's teardown, where
    delta-rs' native threads may abort the process ("terminate called without an active exception") after the
    work is done and turn exit code 0 into 134 or 139. Spark's JVM ends when its gateway's pipe closes."""
    try:
        code = main()
    except Exception:  # the process's last boundary: a bug, logged with its traceback; exit code 1 (see --help)
        logging.getLogger("spark_jobs").exception("unexpected error (a bug: please report it with this log)")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
