"""Checkpoints that don't fill the disk: save_total_limit, disk use in the runs list, delete and prune."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest
from test_trainer import make_run

from grpo_tui import cli
from grpo_tui.config.store import load_preset
from grpo_tui.runs.folder import RunDir
from grpo_tui.runs.housekeeping import HousekeepingError, delete_run, prune_run
from grpo_tui.runs.listing import run_info
from grpo_tui.tools.demo import make_run as make_recorded_run
from grpo_tui.train import entry
from grpo_tui.train.config_map import grpo_config


def _with_files(run: Path, checkpoints: int = 0, model: bool = True) -> None:
    for step in range(1, checkpoints + 1):
        folder = run / "checkpoints" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "optimizer.pt").write_bytes(b"x" * 1000)
    if model:
        (run / "model").mkdir()
        (run / "model" / "model.safetensors").write_bytes(b"w" * 500)


def test_save_total_limit_is_the_trainer_option(tmp_path: Path) -> None:
    preset, _ = load_preset("tiny-cpu", ["logging.save_total_limit=2", "logging.save_steps=1"])
    assert grpo_config(preset, RunDir(tmp_path)).save_total_limit == 2
    default, _ = load_preset("tiny-cpu")
    assert default.logging.save_total_limit is None and grpo_config(default, RunDir(tmp_path)).save_total_limit is None


def test_a_run_keeps_only_the_newest_checkpoints(tiny_model_path: Path, tmp_path: Path) -> None:
    run = make_run(tmp_path, "limited", grpo={"max_steps": 5}, logging={"save_steps": 1, "save_total_limit": 2})
    assert entry.main(["--run-dir", str(run.path)]) == 0
    kept = sorted(p.name for p in run.checkpoints.glob("checkpoint-*"))
    assert kept == ["checkpoint-4", "checkpoint-5"]


def test_the_runs_list_shows_disk_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_recorded_run(tmp_path / "runs" / "20260101-000000-tiny-cpu", steps=5).path
    before = run_info(run).disk_bytes
    _with_files(run, checkpoints=2)
    assert run_info(run).disk_bytes == before + 2500
    assert cli.main(["runs", "--runs-dir", str(tmp_path / "runs")]) == 0
    header, row = capsys.readouterr().out.splitlines()[:2]
    assert "DISK" in header and "KiB" in row


def test_prune_drops_checkpoints_and_keeps_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_recorded_run(tmp_path / "20260101-000000-tiny-cpu", steps=5).path
    _with_files(run, checkpoints=3)
    assert cli.main(["runs", "--prune", str(run), "--yes"]) == 0
    assert not (run / "checkpoints").exists() and (run / "model" / "model.safetensors").is_file()
    assert (run / "metrics.jsonl").is_file()
    out = capsys.readouterr().out
    assert out.startswith("pruned ") and "(2.93 KiB freed)" in out


def test_prune_refuses_a_run_without_a_model(tmp_path: Path) -> None:
    run = make_recorded_run(tmp_path / "20260101-000000-tiny-cpu", steps=5).path
    _with_files(run, checkpoints=1, model=False)
    with pytest.raises(HousekeepingError, match="no model/"):
        prune_run(run)
    assert (run / "checkpoints" / "checkpoint-1").is_dir()


def test_delete_removes_the_folder_and_refuses_live_runs_and_other_folders(tmp_path: Path) -> None:
    done = make_recorded_run(tmp_path / "20260101-000000-tiny-cpu", steps=5).path
    live = make_recorded_run(tmp_path / "20260101-010000-tiny-cpu", steps=5, finished=False, status="running").path
    # This process stands in for the live run's supervisor
    RunDir(live).update_status(pid=os.getpid(), pid_started=psutil.Process().create_time(), started=time.time())
    freed = delete_run(done)
    assert not done.exists() and freed.bytes > 0
    with pytest.raises(HousekeepingError, match="running; stop it first"):
        delete_run(live)
    with pytest.raises(HousekeepingError, match="not a run folder"):
        delete_run(tmp_path)
    assert live.is_dir() and tmp_path.is_dir()


def test_cli_asks_for_yes_off_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_recorded_run(tmp_path / "20260101-000000-tiny-cpu", steps=5).path
    assert cli.main(["runs", "--delete", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--yes" in err and len(err.splitlines()) == 1 and run.is_dir()
    assert cli.main(["runs", "--delete", str(tmp_path / "missing"), "--yes"]) == 2
    assert "not a run folder" in capsys.readouterr().err
    assert cli.main(["runs", "--yes"]) == 2


@pytest.mark.parametrize("verb", [delete_run, prune_run])
def test_a_folder_holding_more_than_a_run_is_never_touched(tmp_path: Path, verb) -> None:
    # A run.json alone does not make a run folder: `runs --delete /` once took a machine's /etc with it
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "run.json").write_text("{}")
    (folder / "checkpoints").mkdir()
    (folder / "model").mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(HousekeepingError, match="holds 'notes.txt', which no run writes"):
        verb(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoints", "model", "notes.txt", "run.json"]


def test_home_mount_points_and_the_current_folder_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_recorded_run(tmp_path / "20260101-000000-tiny-cpu", steps=2).path
    monkeypatch.setenv("HOME", str(run))
    with pytest.raises(HousekeepingError, match="the home folder"):
        delete_run(run)
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    monkeypatch.chdir(run)
    with pytest.raises(HousekeepingError, match="the current folder"):
        delete_run(run)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os.path, "ismount", lambda path: Path(path) == run)
    with pytest.raises(HousekeepingError, match="a file system root"):
        delete_run(run)
    monkeypatch.undo()
    assert run.is_dir()


def test_what_runs_write_beside_their_files_does_not_block_a_delete(tmp_path: Path) -> None:
    run = make_recorded_run(tmp_path / "20260101-000000-tiny-cpu", steps=2).path
    _with_files(run, checkpoints=1)
    for name in ("heartbeat-rank0.json", "run.lock", "profile-step3.txt", ".metrics.jsonl.tmp-1", "slurm-42.log"):
        (run / name).write_text("")
    delete_run(run)
    assert not run.exists()
