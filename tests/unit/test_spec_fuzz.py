"""Fuzzing the spec: any mutation of the sample spec (a value's type, a key, a value, the YAML text) either
loads, or is refused with exit 2 and messages that each name a field; never a traceback."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_jobs.errors import SpecError
from spark_jobs.lake.spec_record import fingerprint, normalise
from spark_jobs.spec import load_spec
from spark_jobs.spec_plan import make_plan

REPO = Path(__file__).resolve().parents[2]
SAMPLE_TEXT = (REPO / "pipelines" / "page_views.yaml").read_text()
SAMPLE: dict[str, Any] = yaml.safe_load(SAMPLE_TEXT)
FUZZ = settings(max_examples=int(os.environ.get("SPEC_FUZZ_EXAMPLES", "300")), deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# module names a mutated `fn` may import: only these (an arbitrary name could import anything installed)
_SAFE_TEXT = st.sampled_from(["", "x", "page", "event_time", "1 hour", "0 seconds", "-1 day", "count", "sum",
                              "nope", "spark_jobs.aggregates.examples:WeightedAvg", "spark_jobs:Nope",
                              "spark_jobs.aggregates.examples:Nope", "a b", "../x", "Page", "ümlaut", "1e9",
                              "timestamp", "string", "long", "q", "views", "page_views", ":", "x:"])
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                     _SAFE_TEXT, st.text(max_size=12).filter(lambda t: ":" not in t))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.one_of(_SAFE_TEXT, st.integers(), st.booleans()), inner,
                                                 max_size=3)), max_leaves=6)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in the spec a value sits, as a key path."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


PATHS = _paths(SAMPLE)


@st.composite
def mutated_specs(draw: st.DrawFn) -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        parent: Any = spec
        try:
            for key in path[:-1]:
                parent = parent[key]
            last = path[-1]
            parent[last]  # the path may be gone after an earlier mutation
        except (KeyError, IndexError, TypeError):
            continue
        action = draw(st.sampled_from(["replace", "delete", "add_key", "rename"]))
        if action == "replace":
            parent[last] = draw(_VALUES)
        elif action == "delete":
            del parent[last]
        elif isinstance(parent, dict):
            new_key = draw(st.one_of(_SAFE_TEXT, st.integers(0, 3), st.booleans()))
            if action == "add_key":
                parent[new_key] = draw(_VALUES)
            else:
                parent[new_key] = parent.pop(last)
    return spec


def _write(tmp: Path, text: str) -> Path:
    path = tmp / "spec.yaml"
    path.write_text(text)
    return path


def assert_refused_or_loads(path: Path) -> None:
    """The spec loads (and its record, fingerprint and plan on an empty lake compute), or SpecError names fields."""
    try:
        spec = load_spec(path)
    except SpecError as exc:
        assert exc.problems, exc
        for problem in exc.problems:
            field, sep, message = problem.partition(": ")
            assert sep and field.strip() and message.strip(), f"a problem without a field: {problem!r}"
        return
    fingerprint(normalise(spec))
    make_plan(spec, []).text()


@FUZZ
@given(spec=mutated_specs())
def test_a_mutated_spec_loads_or_names_its_fields(tmp_path_factory, spec):
    tmp = tmp_path_factory.mktemp("fuzz")
    assert_refused_or_loads(_write(tmp, yaml.safe_dump(spec, allow_unicode=True, sort_keys=False)))


@FUZZ
@given(cut=st.integers(0, len(SAMPLE_TEXT)), length=st.integers(0, 8),
       insert=st.text(alphabet=":{}[]-#&*!|>'\"%@` \n\tab1", max_size=4))
def test_mutated_yaml_text_loads_or_names_its_fields(tmp_path_factory, cut, length, insert):
    text = SAMPLE_TEXT[:cut] + insert + SAMPLE_TEXT[cut + length:]
    assert_refused_or_loads(_write(tmp_path_factory.mktemp("fuzz"), text))


@settings(max_examples=4, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=mutated_specs())
def test_the_cli_answers_a_mutated_spec_without_a_traceback(tmp_path_factory, spec):
    path = _write(tmp_path_factory.mktemp("fuzz"), yaml.safe_dump(spec, allow_unicode=True, sort_keys=False))
    proc = subprocess.run([sys.executable, "-m", "spark_jobs", "plan", "--pipeline", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 2), proc.stderr
    if proc.returncode == 2:
        assert proc.stderr.startswith("error: "), proc.stderr
