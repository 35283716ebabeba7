"""A stand-in for `grpo_tui.train` that keeps the trainer's side of the run-folder contract.

Test-only. Reads <run>/config.toml for max_steps, appends step records to metrics.jsonl, honours
control.json ({"stop": true} -> stop_requested event, exit 0). FAKE_TRAINER_MODE picks a failure:
"error" (error event, exit 1), "oom" (oom event, exit 1), "crash" (an uncaught exception, no event), "selfkill" (SIGKILL, as the OOM killer does),
"hang" (steps until stopped). FAKE_TRAINER_IGNORE_STOP=1 ignores stop requests (only a signal ends
it). FAKE_TRAINER_STEP_S is the time per step.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import tomllib
from pathlib import Path

from grpo_tui.runs.folder import RunDir, read_json
from grpo_tui.runs.metrics import MetricsWriter


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--resume", action="store_true")  # accepted as the trainer does; steps restart at 1
    args = parser.parse_args()
    config = tomllib.loads((args.run_dir / "config.toml").read_text())
    max_steps = config["grpo"]["max_steps"]
    mode = os.environ.get("FAKE_TRAINER_MODE", "")
    step_s = float(os.environ.get("FAKE_TRAINER_STEP_S", "0.02"))
    impl = config["loss"]["impl"]
    print("fake trainer starting", flush=True)
    with MetricsWriter(args.run_dir / "metrics.jsonl") as writer:
        writer.event("start", max_steps=max_steps)
        step = 0
        while mode == "hang" or step < max_steps:
            step += 1
            time.sleep(step_s)
            if mode == "crash" and step == 2:
                raise ValueError("fake trainer blew up at step 2")
            if mode == "error" and step == 2:
                writer.event("error", step=step, type="RuntimeError", message="reward function raised at step 2")
                return 1
            if mode == "selfkill" and step == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "oom" and step == 2:
                writer.event("oom", step=step, phase="generation", peak_mib=1234.0)
                return 1
            writer.write(
                {
                    "step": step,
                    "reward": step / max_steps,
                    "loss": 0.1,
                    "kl": 0.0,
                    "step_time": step_s,
                    "loss_impl": impl,
                    "memory": {"device": "cpu", "gpus": [], "rss_mib": 100.0},
                }
            )
            control = read_json(RunDir(args.run_dir).control) or {}
            if control.get("stop") and not os.environ.get("FAKE_TRAINER_IGNORE_STOP"):
                writer.event("stop_requested", step=step)
                return 0
        writer.event("finish", step=step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
