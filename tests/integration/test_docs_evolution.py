"""docs/evolution.md's worked example, run as written: its spec edits, its commands, and the output it shows.

The page's fenced blocks are read in order: a ``yaml`` block replaces those sections of the sample spec, a
``bash`` block's ``python -m spark_jobs`` lines run (in a copy of the repo's ``pipelines/``, so the spec's
relative paths land in a temporary ``data/``), and a ``text`` block right after a ``bash`` block lists
lines its output must hold.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from spark_jobs.__main__ import main
from spark_jobs.lake import PipelineTables
from spark_jobs.spec import load_spec
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "evolution.md"


def _normal(line: str) -> str:
    return " ".join(line.split())


def test_the_worked_example_runs_as_written(spark, tmp_path, monkeypatch, capsys):
    shutil.copytree(ROOT / "pipelines", tmp_path / "pipelines")
    monkeypatch.chdir(tmp_path)
    spec_path = tmp_path / "pipelines" / "page_views.yaml"
    blocks = re.findall(r"```(\w+)\n(.*?)```", DOC.read_text(), flags=re.S)
    output: str | None = None
    ran = checked = 0
    for language, body in blocks:
        if language == "yaml":
            raw = yaml.safe_load(spec_path.read_text())
            raw.update(yaml.safe_load(body))
            spec_path.write_text(yaml.safe_dump(raw, sort_keys=False))
            output = None
        elif language == "bash":
            capsys.readouterr()
            for line in body.splitlines():
                if line.startswith("python -m spark_jobs "):
                    assert main(shlex.split(line)[3:]) == 0, line
                    ran += 1
            output = capsys.readouterr().out
        elif language == "text" and output is not None:
            lines = {_normal(line) for line in output.splitlines()}
            for want in body.splitlines():
                if want.strip():
                    assert _normal(want) in lines, f"{want!r} is not in the output:\n{output}"
            checked += 1
            output = None
    assert ran >= 8 and checked >= 4
    spec = load_spec(spec_path)  # the last version equals a computation from scratch
    assert_matches(actual(PipelineTables(spec.lake, spec.name).aggregates, spec),
                   expected(read_landing(spec.source.path), spec), spec)
