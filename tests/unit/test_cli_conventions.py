"""The command line's conventions: --version, -v anywhere, exit codes in --help, server status --json."""

from __future__ import annotations

import json

import pytest

from spark_jobs import __version__
from spark_jobs.__main__ import build_parser, main
from spark_jobs.errors import ComputeError, InputError, InspectError, LakeError, QualityError, SpecError, UsageError


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip().endswith(__version__)


@pytest.mark.parametrize("argv", [
    ["-v", "reduce", "--pipeline", "p.yaml"],
    ["reduce", "--pipeline", "p.yaml", "-v"],
    ["inspect", "tables", "--verbose"],
    ["server", "status", "-v"],
])
def test_verbose_before_or_after_the_command(argv):
    assert build_parser().parse_args(argv).verbose is True


def test_verbose_defaults_to_off():
    assert build_parser().parse_args(["inspect", "tables"]).verbose is False


def test_help_lists_each_exit_code(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for error in (SpecError, UsageError, InspectError, InputError, LakeError, QualityError, ComputeError):
        assert f"\n  {error.exit_code}  " in out.split("exit codes:")[1], error


def test_server_status_json_when_nothing_runs(tmp_path, capsys):
    assert main(["server", "status", "--json", "--state-dir", str(tmp_path)]) == 1
    status = json.loads(capsys.readouterr().out)
    assert status["connect"]["up"] is False and status["runner"]["up"] is False
    assert status["state_dir"] == str(tmp_path.resolve())


def test_job_commands_take_spark_settings_for_their_own_application():
    from spark_jobs.cli import _session_config

    args = build_parser().parse_args(["reduce", "--pipeline", "p.yaml", "--master", "local[1]",
                                      "--conf", "spark.archives=env.tar.gz#env", "--conf", "spark.x=a=b"])
    assert _session_config(args, "reduce").extra == (("spark.archives", "env.tar.gz#env"), ("spark.x", "a=b"))
