"""Rollout peak memory and time with and without `grpo.generation_sub_batch` / `grpo.scoring_sub_batch`.

    python benchmarks/rollout_memory.py PRESET --rollout 32 --settings none,gen=8,gen=8+score=8 \
        [--set dotted.key=value ...] --out DIR

A setting is `none` or `+`-joined `gen=N` / `score=N`. Each one runs in a fresh process that builds the
preset's trainer (real model, real data, the trainer's own phase tracking), then runs TRL's
generate-and-score once on `--rollout` completions (rollout / num_generations prompts, each repeated)
and records the per-phase peaks (CUDA allocator on a GPU; the RSS high-water mark on a Linux CPU), the
memory held just before the rollout and the wall time. On the CPU, glibc is told to give freed blocks
of 128 KiB and more straight back to the OS (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) and
trims before the rollout, so RSS follows the tensors alive rather than what malloc keeps cached. The rollout is what `generation_sub_batch` and
`scoring_sub_batch` act on; the loss phase is unchanged by them, so it is not run here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KEYS = {"gen": "grpo.generation_sub_batch", "score": "grpo.scoring_sub_batch"}


def parse_setting(text: str) -> list[str]:
    """`gen=8+score=8` -> the `--set` overrides it stands for; `none` -> []."""
    if text == "none":
        return []
    out = []
    for part in text.split("+"):
        key, _, value = part.partition("=")
        if key not in KEYS or not value.isdigit() or int(value) < 1:
            raise argparse.ArgumentTypeError(f"{part!r}: expected gen=N or score=N with N >= 1, or none")
        out.append(f"{KEYS[key]}={value}")
    return out


def child(preset_name: str, rollout: int, overrides: list[str]) -> dict[str, Any]:
    import torch

    from grpo_tui.config.store import load_preset
    from grpo_tui.runs.folder import RunDir
    from grpo_tui.train.assemble import build_trainer
    from grpo_tui.train.phase_memory import MIB, rss_mib

    preset, _ = load_preset(
        preset_name, [*overrides, f"grpo.per_device_batch_size={rollout}", "grpo.gradient_accumulation_steps=1"]
    )
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(preset, RunDir(Path(tmp)))
        trainer.model.train()  # as in the training loop: TRL scores in per_device_batch_size slices, not eval's
        g = preset.grpo.num_generations
        rows = [trainer.train_dataset[i] for i in range(rollout // g) for _ in range(g)]
        cuda = trainer.phases.cuda
        if not cuda:
            import ctypes
            import gc

            gc.collect()
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        before = torch.cuda.memory_allocated() / MIB if cuda else rss_mib()
        trainer.phases.take_step()
        start = time.perf_counter()
        out = trainer._generate_and_score_completions(rows)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        lengths = out["completion_mask"].sum(1).float()
        return {
            "device": "cuda" if cuda else "cpu",
            "before_mib": round(before, 1),
            "phases_mib": trainer.phases.take_step(),
            "rollout_s": round(seconds, 2),
            "completion_tokens_mean": round(lengths.mean().item(), 1),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset")
    parser.add_argument("--rollout", type=int, default=32, help="completions per rollout on this device")
    parser.add_argument("--settings", default="none,gen=8", help="comma-separated: none | gen=N[+score=N]")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print("RESULT " + json.dumps(child(args.preset, args.rollout, [*args.sets, *parse_setting(args.child)])))
        return 0
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    for s in settings:
        parse_setting(s)  # bad settings fail before any run
    results = []
    for setting in settings:
        cmd = [
            sys.executable,
            __file__,
            args.preset,
            "--rollout",
            str(args.rollout),
            "--child",
            setting,
            *(f"--set={s}" for s in args.sets),
        ]
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024), "MALLOC_TRIM_THRESHOLD_": "0"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode or line is None:
            print(
                f"{setting}: failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr
            )
            results.append({"setting": setting, "ok": False})
            continue
        results.append({"setting": setting, "ok": True, **json.loads(line.removeprefix("RESULT "))})
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "command": shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(argv),
        "preset": args.preset,
        "rollout": args.rollout,
        "sets": args.sets,
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "results": results,
    }
    (args.out / "rollout-memory.json").write_text(json.dumps(record, indent=1))
    print(f"{'setting':<18}{'before MiB':>11}{'generation':>12}{'scoring':>10}{'peak - before':>15}{'rollout s':>11}")
    for r in results:
        if not r["ok"]:
            print(f"{r['setting']:<18} failed")
            continue
        ph = r["phases_mib"]
        peak = max(ph.values())
        print(
            f"{r['setting']:<18}{r['before_mib']:>11.0f}{ph.get('generation', 0):>12.0f}{ph.get('scoring', 0):>10.0f}"
            f"{peak - r['before_mib']:>15.0f}{r['rollout_s']:>11.1f}"
        )
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
