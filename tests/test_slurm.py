"""Multi-node launches: the `grpo-tui slurm` script (as text, and run as two "nodes" here) and per-node commands.

SLURM is not installed on these machines: `srun`, `scontrol` and `sbatch` are small stand-ins on PATH
that behave as a 2-node allocation of this one machine would (one task per node, SLURM_NODEID set).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from e2e_support import free_port

from grpo_tui.cli import main
from grpo_tui.runs.folder import RunDir
from grpo_tui.runs.metrics import read_records, step_records

SRUN = """#!/bin/bash
cmd="${@: -1}"
pids=()
for node in 0 1; do SLURM_NODEID=$node SLURM_PROCID=$node bash -c "$cmd" & pids+=($!); done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done; exit $rc
"""
# A long node list: a reader that stops after the first line would kill scontrol with SIGPIPE
SCONTROL = "#!/bin/bash\necho 127.0.0.1\nfor i in $(seq 2 20000); do echo node-$i; done\n"
SBATCH_OK = '#!/bin/bash\necho "$@" > "$(dirname "$0")/sbatch-args"\necho "Submitted batch job 4242"\n'
SBATCH_REFUSES = '#!/bin/bash\necho "sbatch: error: invalid partition specified: nope" >&2\nexit 1\n'


def _stub(folder: Path, name: str, text: str) -> None:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _prepare(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> RunDir:
    assert main(["slurm", "tiny-cpu", "--runs-dir", str(tmp_path / "runs"), *args]) == 0
    out = capsys.readouterr().out.splitlines()
    return RunDir(Path(out[0]))


def test_script_asks_for_the_nodes_and_starts_each_rank_with_its_node_id(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run = _prepare(
        capsys,
        tmp_path,
        "--set",
        "distributed.num_machines=3",
        "--set",
        "distributed.use_cpu=false",
        "--set",
        "distributed.num_processes=4",
        "--partition",
        "gpu",
        "--time",
        "04:00:00",
        "--sbatch",
        "cpus-per-task=16",
    )
    script = (run.path / "job.sbatch").read_text()
    for line in (
        "#SBATCH --nodes=3",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=04:00:00",
        "#SBATCH --cpus-per-task=16",
        f"#SBATCH --output={run.path}/slurm-%j.log",
        f"cd {os.getcwd()}",
    ):
        assert line in script.splitlines(), line
    node = next(line for line in script.splitlines() if line.startswith("NODE_COMMAND="))
    # launcher flags before the training module; the rank and address come from the allocation
    assert node.index('--machine_rank "$SLURM_NODEID"') < node.index("-m grpo_tui.train")
    assert '--main_process_ip "$MASTER_ADDR"' in node and f"--run-dir {run.path}" in node
    config = (run.path / "accelerate.yaml").read_text()
    assert "num_machines: 3" in config and "num_processes: 12" in config
    status = json.loads(run.status.read_text())
    assert status["status"] == "submitted" and status["launcher"] == "slurm"
    assert main(["runs", "--runs-dir", str(tmp_path / "runs")]) == 0
    assert "submitted" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--sbatch", "cpus per task=4"], "--sbatch: got 'cpus per task=4'; expected OPTION=VALUE"),
        (["--sbatch", "nodes"], "--sbatch: got 'nodes'; expected OPTION=VALUE"),
        (["--sbatch", "comment=a\nb"], "--sbatch: got 'comment=a\\nb'; expected OPTION=VALUE"),
        (["--time", "1:00\n#SBATCH --x=y"], "--time: got '1:00\\n#SBATCH --x=y'; expected one line of text"),
        (["--set", "grpo.num_generations=7"], "grpo.num_generations: got 7; must divide the generation batch"),
    ],
)
def test_bad_input_is_one_line_and_makes_no_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], expected: str
) -> None:
    assert main(["slurm", "tiny-cpu", "--runs-dir", str(tmp_path / "runs"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(expected)
    assert not (tmp_path / "runs").exists()


def test_submit_records_the_job_id_or_the_refusal(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stubs = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{stubs}:{os.environ['PATH']}")
    monkeypatch.setattr("shutil.which", lambda name: str(stubs / name) if (stubs / name).exists() else None)
    assert main(["slurm", "tiny-cpu", "--submit", "--runs-dir", str(tmp_path / "none")]) == 1
    assert "--submit needs sbatch on PATH" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()

    _stub(stubs, "sbatch", SBATCH_OK)
    run = _prepare(capsys, tmp_path, "--submit")
    status = json.loads(run.status.read_text())
    assert status["slurm_job"] == 4242 and status["status"] == "submitted"
    assert (stubs / "sbatch-args").read_text().strip() == str(run.path / "job.sbatch")

    _stub(stubs, "sbatch", SBATCH_REFUSES)
    assert main(["slurm", "tiny-cpu", "--submit", "--runs-dir", str(tmp_path / "refused")]) == 1
    assert capsys.readouterr().err.strip() == (
        "grpo-tui slurm: sbatch refused the job: sbatch: error: invalid partition specified: nope"
    )
    (refused,) = (tmp_path / "refused").iterdir()
    assert json.loads((refused / "run.json").read_text())["status"] == "failed"


# A reward module whose import registers a Python exit hook: report_to loggers (wandb, trackio) finish
# in such hooks, so a rank must run them even though it skips the interpreter's teardown.
EXIT_PROBE = """
import atexit, os

def _mark():
    if os.environ.get("EXIT_PROBE_DIR"):  # unset in the test process, which imports it to check the preset
        with open(os.path.join(os.environ["EXIT_PROBE_DIR"], f"exit-{os.getpid()}"), "w") as handle:
            handle.write("ran")

atexit.register(_mark)

def reward(completions, **kwargs):
    return [0.0] * len(completions)
"""


@pytest.mark.slow
def test_the_script_trains_on_two_nodes(
    tiny_model_path: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "exit_probe.py").write_text(EXIT_PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))
    rewards = '[{name = "addition_partial"}, {name = "exit_probe:reward", weight = 0.0}]'
    run = _prepare(
        capsys,
        tmp_path,
        "--set",
        "distributed.num_machines=2",
        "--set",
        "grpo.max_steps=2",
        "--set",
        f"distributed.main_process_port={free_port()}",
        "--set",
        f"rewards.functions={rewards}",
    )
    stubs = tmp_path / "bin"
    _stub(stubs, "srun", SRUN)
    _stub(stubs, "scontrol", SCONTROL)
    env = {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "OMP_NUM_THREADS": "1",
        "EXIT_PROBE_DIR": str(tmp_path),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(["bash", str(run.path / "job.sbatch")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_records(run.metrics)
    start = records[0]
    assert start["event"] == "start" and sorted(r["rank"] for r in start["ranks"]) == [0, 1]
    assert [r["step"] for r in step_records(records)] == [1, 2]
    assert main(["runs", "--runs-dir", str(tmp_path / "runs")]) == 0
    assert f"{run.name}  finished" in capsys.readouterr().out
    assert len(list(tmp_path.glob("exit-*"))) == 2  # each rank ran its exit hooks


@pytest.mark.slow
def test_per_node_commands_train_as_two_machines(tiny_model_path: Path, tmp_path: Path) -> None:
    # Without SLURM: command.json's per-node commands, started by hand on each machine (here both on this one)
    from grpo_tui.config.store import load_preset
    from grpo_tui.launch import supervisor

    preset, _ = load_preset(
        "tiny-cpu",
        [
            "distributed.num_machines=2",
            "distributed.main_process_ip=127.0.0.1",
            f"distributed.main_process_port={free_port()}",
            "grpo.max_steps=2",
        ],
    )
    run = supervisor.prepare_run(preset, [], tmp_path / "runs")
    command = json.loads(run.command.read_text())
    env = {**os.environ, **command["env"], "OMP_NUM_THREADS": "1"}
    nodes = [
        subprocess.Popen(
            argv, env=env, cwd=command["cwd"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for argv in command["per_node"]
    ]
    errors = [node.communicate(timeout=300)[1] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], errors[0][-2000:] + errors[1][-2000:]
    records = read_records(run.metrics)
    assert sorted(r["rank"] for r in records[0]["ranks"]) == [0, 1]
    assert [r["step"] for r in step_records(records)] == [1, 2]


def test_app_follows_a_submitted_run_through_its_stream(tmp_path: Path) -> None:
    from grpo_tui.runs.listing import run_info
    from grpo_tui.runs.metrics import MetricsWriter
    from grpo_tui.runs.status import judge

    run = RunDir.create(tmp_path, "tiny-cpu")
    run.update_status(status="submitted", launcher="slurm", created=1.0)
    assert run_info(run.path).status == "submitted"  # queued: nothing in the stream yet
    writer = MetricsWriter(run.metrics)
    # ranks on other hosts: their pids mean nothing here, the stream alone tells
    writer.event("start", ranks=[{"rank": 0, "pid": 999_999_999}])
    assert run_info(run.path).status == "running"
    # a long run: its start event is far behind the tail that the lists read
    for step in range(1, 400):
        writer.write({"step": step, "time": float(step), "reward": 0.5, "note": "x" * 400})
    assert run_info(run.path).status == "running"
    assert judge(run.path).state == "running"
    writer.event("error", message="boom")
    writer.close()
    assert run_info(run.path).status == "failed"
    assert judge(run.path).state == "failed"


def test_a_newline_in_the_runs_folder_cannot_add_a_line_to_the_job_script(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Issue 11 item 11: `logging.runs_dir="/tmp/x/r\\ntouch INJECTED\\n#"` once wrote a shell line into job.sbatch."""
    injected = tmp_path / "INJECTED"
    runs = f"{tmp_path}/r\ntouch {injected}\n#"
    code = main(["slurm", "tiny-cpu", "--set", f'logging.runs_dir="{runs}"'.replace("\n", "\\n")])
    err = capsys.readouterr().err
    assert code != 0
    assert "logging.runs_dir" in err and "one printable line" in err
    assert len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir()), "no run folder may be created for a refused path"


def test_every_value_in_the_job_script_is_quoted(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    runs = tmp_path / "runs with spaces; $(touch x)"
    run = _prepare(capsys, tmp_path, "--runs-dir", str(runs), "--sbatch", "comment=a b;c")
    script = (run.path / "job.sbatch").read_text()
    lines = script.splitlines()
    output_line = next(line for line in lines if line.startswith("#SBATCH --output="))
    assert output_line == f"#SBATCH --output='{run.path}/slurm-%j.log'"
    assert "#SBATCH --comment='a b;c'" in lines
    # the folder's name never appears unquoted
    assert all(str(runs) not in line or f"'{runs}" in line or "NODE_COMMAND" in line for line in lines)
