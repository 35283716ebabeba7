"""The generated accelerate config and argv: checked against accelerate's own config loader, and one
real 2-process CPU launch to prove the MULTI_CPU path starts two ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from accelerate.commands.config import load_config_from_file
from accelerate.utils import DistributedType

from grpo_tui.config.schema import Preset
from grpo_tui.launch.command import (
    build_accelerate_config,
    build_launch_command,
    launch_env,
    per_node_commands,
    write_accelerate_config,
)


def preset(**distributed: object) -> Preset:
    return Preset.model_validate({"distributed": distributed})


def loaded(p: Preset, tmp_path: Path):
    """accelerate's parsed view of our file (raises on unknown keys or bad values)."""
    return load_config_from_file(str(write_accelerate_config(p, tmp_path / "accelerate.yaml")))


def test_one_gpu(tmp_path: Path) -> None:
    p = preset(num_processes=1, mixed_precision="bf16")
    config = loaded(p, tmp_path)
    assert config.distributed_type == DistributedType.NO
    assert config.num_processes == 1 and config.mixed_precision == "bf16" and not config.use_cpu
    assert config.gpu_ids == "all" and config.fsdp_config == {}
    assert launch_env(p) == {"PYTHONUNBUFFERED": "1"}


def test_n_gpus_fsdp2(tmp_path: Path) -> None:
    p = preset(num_processes=4, fsdp=True, fsdp_version=2, mixed_precision="bf16", main_process_port=29600)
    config = loaded(p, tmp_path)
    assert config.distributed_type == DistributedType.FSDP
    assert config.num_processes == 4 and config.num_machines == 1 and config.main_process_port == 29600
    assert config.fsdp_config["fsdp_version"] == 2
    assert config.fsdp_config["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert config.fsdp_config["fsdp_reshard_after_forward"] is True
    assert "fsdp_sharding_strategy" not in config.fsdp_config  # an FSDP1 option


def test_fsdp_on_one_gpu_stays_fsdp(tmp_path: Path) -> None:
    config = loaded(preset(num_processes=1, fsdp=True), tmp_path)
    assert config.distributed_type == DistributedType.FSDP and config.num_processes == 1


def test_fsdp1_uses_sharding_strategy(tmp_path: Path) -> None:
    config = loaded(preset(num_processes=2, fsdp=True, fsdp_version=1), tmp_path)
    assert config.fsdp_config["fsdp_version"] == 1 and config.fsdp_config["fsdp_sharding_strategy"] == "FULL_SHARD"


def test_n_gpus_without_fsdp_is_ddp(tmp_path: Path) -> None:
    config = loaded(preset(num_processes=2), tmp_path)
    assert config.distributed_type == DistributedType.MULTI_GPU and config.num_processes == 2


def test_multi_node(tmp_path: Path) -> None:
    p = preset(num_processes=8, num_machines=2, machine_rank=1, main_process_ip="10.1.2.3", fsdp=True)
    config = loaded(p, tmp_path)
    # accelerate counts processes over all machines.
    assert config.num_processes == 16 and config.num_machines == 2 and config.machine_rank == 1
    assert config.main_process_ip == "10.1.2.3" and config.main_process_port == 29500
    commands = per_node_commands(p, tmp_path)
    assert len(commands) == 2
    for rank, argv in enumerate(commands):
        i = argv.index("--machine_rank")
        assert argv[i + 1] == str(rank)
        # Launcher flags must come before the training module.
        assert i < argv.index("grpo_tui.train")


def test_cpu_one_process(tmp_path: Path) -> None:
    p = preset(use_cpu=True, num_processes=1)
    config = loaded(p, tmp_path)
    assert config.distributed_type == DistributedType.NO and config.use_cpu and config.num_processes == 1
    assert launch_env(p)["ACCELERATE_USE_CPU"] == "true"


def test_cpu_two_processes_config(tmp_path: Path) -> None:
    p = preset(use_cpu=True, num_processes=2)
    config = loaded(p, tmp_path)
    # MULTI_GPU + ACCELERATE_USE_CPU goes through torchrun and gives MULTI_CPU (gloo) in the ranks.
    assert config.distributed_type == DistributedType.MULTI_GPU and config.num_processes == 2
    assert launch_env(p)["ACCELERATE_USE_CPU"] == "true"
    assert "gpu_ids" not in build_accelerate_config(p)


def test_launch_argv(tmp_path: Path) -> None:
    argv = build_launch_command(preset(), tmp_path)
    assert argv == [
        sys.executable,
        "-m",
        "grpo_tui.launch.launcher",  # accelerate launch, one-machine sockets on loopback
        "--config_file",
        str(tmp_path / "accelerate.yaml"),
        "-m",
        "grpo_tui.train",
        "--run-dir",
        str(tmp_path),
    ]


PROBE = """
import sys
from accelerate import Accelerator
state = Accelerator().state
# One file per rank: two ranks printing to one pipe can interleave mid-line.
line = " ".join(map(str, ("PROBE", state.distributed_type, state.num_processes, state.process_index, sys.argv[1:])))
with open(f"{sys.argv[2]}/probe-{state.process_index}.txt", "w") as handle:
    handle.write(line)
state.destroy_process_group()
"""


@pytest.mark.slow
def test_cpu_two_processes_really_start_two_ranks(tmp_path: Path) -> None:
    (tmp_path / "probe_rank.py").write_text(PROBE)
    p = preset(use_cpu=True, num_processes=2, main_process_port=29731)
    write_accelerate_config(p, tmp_path / "accelerate.yaml")
    argv = build_launch_command(p, tmp_path)
    argv[argv.index("grpo_tui.train")] = "probe_rank"
    env = {**os.environ, **launch_env(p), "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [path.read_text() for path in sorted(tmp_path.glob("probe-*.txt"))]
    assert len(lines) == 2, done.stdout + done.stderr[-2000:]
    for rank, line in enumerate(lines):
        assert line.startswith(f"PROBE DistributedType.MULTI_CPU 2 {rank} ['--run-dir', '{tmp_path}']")
