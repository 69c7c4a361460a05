"""``python -m spark_jobs <command>``: the job commands of :mod:`spark_jobs.cli`, and ``server``.

Exit codes: 0 ok, 1 unexpected failure, 2 bad arguments or spec, 3 bad or missing input,
4 lake (Delta) problem, 5 a data-quality suite failed (``validate``; the report says which checks),
6 Spark cannot be reached (no Java, a Spark Connect server that is down).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

if __name__ == "__main__" and __spec__ is None and sys.path:
    # Run as a file (``spark-submit .../spark_jobs/__main__.py``), Python put this package's own folder
    # first on sys.path, where its modules (errors, session, jobs, lake, ...) would be importable as
    # top-level names and could shadow another distribution's. Put the folder holding the package there
    # instead: ``spark_jobs`` then imports as with ``python -m spark_jobs``, installed or not. The imports
    # above are the standard library's, which has none of those names.
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
    """Run one command (see :func:`spark_jobs.cli.main`)."""
    return cli.main(argv, keep_session=keep_session, commands=[_add_server])


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
