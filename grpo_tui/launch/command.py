"""From a preset to the exact `accelerate launch` invocation: a generated config file plus argv.

The trainer is started as `python -m grpo_tui.launch.launcher --config_file <yaml> -m grpo_tui.train
--run-dir <dir>` (the running interpreter, so the venv is the one in use; argv only, never a shell): that
is `accelerate launch` with a one-machine run's listening sockets kept on loopback (see launch/launcher.py).
CPU runs need one environment variable as well (`launch_env`): accelerate's config file alone
cannot start several CPU processes (see `build_accelerate_config`).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from grpo_tui.config.schema import DistributedSection, Preset
from grpo_tui.runs.folder import RunDir, write_private_text

TRAIN_MODULE = "grpo_tui.train"
# accelerate's launcher, run in-process by ours: on one machine it binds the rendezvous store and the
# collectives' sockets to loopback; runs over several machines pass through to accelerate untouched.
LAUNCHER_MODULE = "grpo_tui.launch.launcher"
# The preset's port when none was chosen. On one machine it is replaced by 0, a free port per run
# (reserved on 127.0.0.1 by the launcher), so two runs at once never fight over 29500.
DEFAULT_PORT = DistributedSection.model_fields["main_process_port"].default


def build_accelerate_config(preset: Preset, machine_rank: int | None = None) -> dict[str, Any]:
    """The accelerate config (the keys `accelerate config` writes) for this preset.

    CPU with several processes uses MULTI_GPU plus ACCELERATE_USE_CPU=true in the environment: that
    path goes through torchrun and gives MULTI_CPU with gloo, whereas a `use_cpu` config or `--cpu`
    starts a single process whatever num_processes says.
    """
    d = preset.distributed
    total = d.num_processes * d.num_machines
    distributed = total > 1
    if d.fsdp:
        # Even with one process: FSDP on a single GPU is how the sharded code path is tried out.
        distributed_type = "FSDP"
    elif distributed:
        distributed_type = "MULTI_GPU"
    else:
        distributed_type = "NO"
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": distributed_type,
        "downcast_bf16": "no",
        "enable_cpu_affinity": False,
        "machine_rank": d.machine_rank if machine_rank is None else machine_rank,
        "main_training_function": "main",
        "mixed_precision": d.mixed_precision,
        # Total over all machines: accelerate divides by num_machines for the per-node count.
        "num_machines": d.num_machines,
        "num_processes": total,
        "rdzv_backend": "static",
        "same_network": True,
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
        "use_cpu": d.use_cpu,
    }
    if not d.use_cpu:
        config["gpu_ids"] = "all"
    if distributed or d.fsdp:
        one_machine_default = d.num_machines == 1 and d.main_process_port == DEFAULT_PORT
        config["main_process_port"] = 0 if one_machine_default else d.main_process_port
    if d.num_machines > 1:
        config["main_process_ip"] = d.main_process_ip
    if distributed_type == "FSDP":
        config["fsdp_config"] = _fsdp_config(preset)
    return config


def _fsdp_config(preset: Preset) -> dict[str, Any]:
    d = preset.distributed
    fsdp: dict[str, Any] = {
        "fsdp_version": d.fsdp_version,
        # Wrap each decoder layer: the model's own `_no_split_modules` names them.
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_offload_params": False,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        # LoRA leaves most parameters frozen; FSDP must keep the original parameter objects.
        "fsdp_use_orig_params": True,
        "fsdp_sync_module_states": True,
        # TRL/transformers handle activation checkpointing from grpo.gradient_checkpointing.
        "fsdp_activation_checkpointing": False,
    }
    if d.fsdp_version == 2:
        fsdp["fsdp_reshard_after_forward"] = True
    else:
        fsdp["fsdp_sharding_strategy"] = "FULL_SHARD"
        fsdp["fsdp_backward_prefetch"] = "BACKWARD_PRE"
        fsdp["fsdp_forward_prefetch"] = False
    return fsdp


def accelerate_config_yaml(preset: Preset, machine_rank: int | None = None) -> str:
    import yaml  # accelerate depends on PyYAML

    return yaml.safe_dump(build_accelerate_config(preset, machine_rank), sort_keys=True)


def write_accelerate_config(preset: Preset, path: Path, machine_rank: int | None = None) -> Path:
    path = Path(path)
    write_private_text(path, accelerate_config_yaml(preset, machine_rank))
    return path


def build_launch_command(preset: Preset, run_dir: Path, config_file: Path | None = None) -> list[str]:
    """argv that starts the trainer on this machine for the run folder `run_dir`."""
    run_dir = Path(run_dir)
    config_file = config_file or RunDir(run_dir).accelerate_config
    return [
        sys.executable,
        "-m",
        LAUNCHER_MODULE,
        "--config_file",
        str(config_file),
        "-m",
        TRAIN_MODULE,
        "--run-dir",
        str(run_dir),
    ]


def launch_env(preset: Preset) -> dict[str, str]:
    """Environment variables the launch needs on top of the caller's."""
    env = {"PYTHONUNBUFFERED": "1"}  # stdout.log shows prints as they happen
    if preset.distributed.use_cpu:
        env["ACCELERATE_USE_CPU"] = "true"
    return env


def per_node_commands(preset: Preset, run_dir: Path) -> list[list[str]]:
    """One argv per machine (index = machine_rank), for multi-node runs started by hand or ssh."""
    base = build_launch_command(preset, run_dir)
    commands = []
    for rank in range(preset.distributed.num_machines):
        # Flags given on the command line win over the config file's values.
        commands.append(base[:5] + ["--machine_rank", str(rank)] + base[5:])
    return commands


def format_command(argv: list[str], env: dict[str, str] | None = None) -> str:
    """A copy-pasteable shell rendering of argv (display only; never executed through a shell)."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items() if k != "PYTHONUNBUFFERED")
    return (prefix + " " if prefix else "") + shlex.join(argv)
