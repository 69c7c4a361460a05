"""The README's examples run, so they cannot go stale: its spec is the sample pipeline, every
command in its table parses, and its worked example prints what it says."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from spark_jobs.__main__ import build_parser, main
from spark_jobs.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SAMPLE = ROOT / "pipelines" / "page_views.yaml"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def _table_commands() -> list[str]:
    """The first cell of each row of the Commands table, as a command line."""
    section = README.split("## Commands", 1)[1].split("\n## ", 1)[0]
    cells = re.findall(r"^\| `([^`]+)` \|", section, flags=re.M)
    assert len(cells) >= 8, "the Commands table lost its rows"
    return cells


def _expand(cell: str) -> list[str]:
    """Arguments of a table cell: SPEC is the sample, ``a\\|b`` takes each branch, ``[...]`` is included."""
    cell = cell.replace("SPEC", str(SAMPLE)).replace("[", "").replace("]", "").replace(" ...", "")
    first, *rest = cell.split(" ", 1)
    branches = first.split("\\|") if "\\|" in first else [first]
    tail = rest[0] if rest else ""
    if "\\|" in tail:  # an option with choices: take the first (the others are checked by the parser's choices)
        tail = re.sub(r"(\S+?)\\\|\S+", r"\1", tail)
    return [f"{b} {tail}".strip() for b in branches]


def test_the_readme_spec_is_the_sample_pipeline():
    (spec_block,) = [b for b in _blocks("yaml") if b.startswith("name: page_views")]
    assert yaml.safe_load(spec_block) == yaml.safe_load(SAMPLE.read_text())
    load_spec(SAMPLE)  # and it is valid


@pytest.mark.parametrize("cell", _table_commands())
def test_every_command_in_the_readme_parses(cell):
    parser = build_parser()
    for line in _expand(cell):
        args = parser.parse_args(shlex.split(line))
        assert callable(args.func)


def test_the_two_commands_exist_and_ci_runs_the_test_command():
    (first, *_) = _blocks("bash")
    assert first.split() == ["bin/demo", "bin/test"]
    assert all((ROOT / c).exists() for c in first.split())
    assert "bin/test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.spark
def test_the_worked_inspect_example_prints_the_top_pages(spark, tmp_path, capsys):
    (example,) = re.findall(r"`python -m spark_jobs (inspect show [^`]+)`", README.replace("\n", " "))
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    assert main(["generate", "--out", str(landing), "--days", "1", "--rows-per-day", "3000", "--quiet"]) == 0
    spec_args = ["--pipeline", str(SAMPLE), "--lake", str(lake), "--source-path", str(landing)]
    assert main(["run", *spec_args, "--from", "2024-03-01"]) == 0
    capsys.readouterr()
    argv = [*shlex.split(example.replace("pipelines/page_views.yaml", str(SAMPLE))), "--lake", str(lake)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "views" in text.splitlines()[0], text
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = data["rows"] if isinstance(data, dict) else data
    views = [r["views"] for r in rows]
    assert 1 <= len(views) <= 10 and views == sorted(views, reverse=True)
