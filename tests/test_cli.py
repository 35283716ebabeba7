"""The command line: subcommands, pass-throughs, bare `grpo-tui`, import cost, and no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_tui import cli
from grpo_tui.launch import supervisor
from grpo_tui.runs.folder import RunDir, list_runs
from grpo_tui.runs.metrics import read_records, step_records

FAKE = str(Path(__file__).with_name("fake_trainer.py"))


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Runs land in tmp_path/runs; user presets in tmp_path; the trainer is the fake one."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRPO_TUI_PRESETS_DIR", str(tmp_path / "user-presets"))
    monkeypatch.setenv("FAKE_TRAINER_STEP_S", "0.001")
    monkeypatch.setattr(
        supervisor, "build_launch_command", lambda preset, run_dir: [sys.executable, FAKE, "--run-dir", str(run_dir)]
    )
    return tmp_path


def test_run_headless_with_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "tiny-cpu", "--headless", "--set", "grpo.max_steps=4"]) == 0
    out = capsys.readouterr().out
    (run,) = list_runs(tmp_path / "runs")
    assert run.read_status()["status"] == "finished"
    assert [r["step"] for r in step_records(read_records(run.metrics))] == [1, 2, 3, 4]
    assert f"run folder: {run.path}" in out and "4/4 steps, finished" in out


def test_run_uses_runs_dir_option(tmp_path: Path) -> None:
    assert cli.main(["run", "tiny-cpu", "--headless", "--set", "grpo.max_steps=2", "--runs-dir", "elsewhere"]) == 0
    assert len(list_runs(tmp_path / "elsewhere")) == 1 and not (tmp_path / "runs").exists()


def test_bare_command_runs_tiny_cpu_headless(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Under pytest stdin/stdout are not terminals, so no app: the default preset runs headless.
    assert cli.main([]) == 0
    (run,) = list_runs(tmp_path / "runs")
    assert run.name.endswith("-tiny-cpu") and run.read_status()["status"] == "finished"


def test_run_refuses_bad_input_before_creating_anything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "tiny-cpu", "--set", "grpo.per_device_batch_size=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("grpo.num_generations: got 8; must divide the generation batch")
    assert not (tmp_path / "runs").exists()


def test_run_refuses_more_processes_than_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    from grpo_tui.config import checks

    monkeypatch.setattr(checks, "visible_gpu_count", lambda: 0)
    assert cli.main(["run", "qwen3-0.6b-gsm8k", "--headless"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # The model is not cached here either (tests run offline): each problem is its own line.
    assert err[-1:] == [
        "distributed.num_processes: got 1; 0 GPU(s) visible on this machine (one process per GPU; or set distributed.use_cpu=true)"
    ]
    assert all(line.startswith(("model.name_or_path: ", "distributed.num_processes: ")) for line in err), err


def test_run_detach_runs_and_lists(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --detach starts `python -m grpo_tui.cli supervise` which reads the argv recorded in command.json.
    assert cli.main(["run", "tiny-cpu", "--detach", "--set", "grpo.max_steps=3"]) == 0
    run_path = Path(capsys.readouterr().out.split(" (supervisor pid")[0])
    run = RunDir(run_path)
    assert json.loads(run.command.read_text())["argv"][1] == FAKE
    from test_runner import wait_for  # tests/ is on sys.path (pytest prepend import mode)

    wait_for(lambda: run.read_status().get("status") == "finished", "the detached run")
    assert cli.main(["runs"]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith(run.name)]
    assert row.split()[1:3] == ["finished", "3"]


def test_control_writes_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = RunDir.create(tmp_path / "runs", "x")
    run.update_status(status="running")
    assert cli.main(["control", str(run.path), "--loss-impl", "naive"]) == 0
    assert cli.main(["control", str(run.path), "--stop"]) == 0
    control = json.loads(run.control.read_text())
    assert control["loss_impl"] == "naive" and control["stop"] is True and control["request_id"] == 2


def test_control_refuses_an_ended_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = RunDir.create(tmp_path / "runs", "x")
    run.update_status(status="finished")
    assert cli.main(["control", str(run.path), "--loss-impl", "naive"]) == 1
    assert (
        capsys.readouterr().err.strip() == f"{run.path}: the run is finished; nothing reads control requests any more"
    )
    assert not run.control.exists()


def test_control_refuses_a_folder_that_is_not_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["control", str(tmp_path), "--stop"]) == 2
    assert capsys.readouterr().err.strip() == f"{tmp_path}: not a run folder (no run.json or metrics.jsonl)"


def test_control_rejects_unknown_impl(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["control", "somewhere", "--loss-impl", "fast"])
    assert info.value.code == 2
    assert "invalid choice: 'fast'" in capsys.readouterr().err


def test_passthrough_calls_the_module_with_the_rest(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "fake_bench_mod.py").write_text("seen = []\ndef main(argv):\n    seen.append(argv)\n    return 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.PASSTHROUGH, ("bench", "memory"), cli.Passthrough("fake_bench_mod", "main", "a stand-in"))
    assert cli.main(["bench", "memory", "tiny-cpu", "--batch", "8,16"]) == 3
    import fake_bench_mod

    assert fake_bench_mod.seen == [["tiny-cpu", "--batch", "8,16"]]


def test_passthrough_to_a_missing_module_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setitem(
        cli.PASSTHROUGH, ("screenshots",), cli.Passthrough("grpo_tui.no_such_module", "main", "a stand-in")
    )
    assert cli.main(["screenshots", "--out", "x"]) == 1
    assert (
        capsys.readouterr().err.strip()
        == "grpo-tui screenshots: not available in this version (grpo_tui.no_such_module is missing)"
    )


def test_bench_needs_a_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "gpu"]) == 2
    assert "bench kernel" in capsys.readouterr().err


def test_help_hides_the_internal_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "presets" in out and "control" in out and "max-batch" in out and "supervise" not in out


def test_import_is_light() -> None:
    code = "import sys, grpo_tui.cli; heavy = {'torch', 'transformers', 'textual', 'trl', 'pydantic'} & set(sys.modules); print(sorted(heavy))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["presets", "show", "no-such-preset"],
        ["presets", "validate", "/no/such/file.toml"],
        ["run", "tiny-cpu", "--set", "grpo.beta=-1"],
        ["run", "tiny-cpu", "--set", "nonsense"],
        ["control", "/no/such/run", "--stop"],
    ],
)
def test_console_script_bad_input_is_one_line_no_traceback(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "grpo_tui.cli", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_help_gives_every_subcommand_a_real_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 15 item 7: passthrough subcommands showed placeholders ("(see grpo-tui check --help; from ...)")."""
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for words, entry in cli.PASSTHROUGH.items():
        if len(words) == 1:
            assert entry.summary.split()[0] in out
    assert "from grpo_tui" not in out and "(see " not in out
