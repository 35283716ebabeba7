"""Time and size of `grpo-tui export` on a LoRA run of the Qwen3-0.6B shape: the adapter as it is, and --merged.

GPU machine (the repository copied there, not installed; the wheels of benchmarks/gpu_env.sh in .whl/):

    source benchmarks/gpu_env.sh && python benchmarks/export_bench.py --out benchmarks/results/export-h200.json

CPU smoke mode (seconds; what the tests run):

    python benchmarks/export_bench.py --tiny --out /tmp/export.json

The run folder is built without training: the model (builtin:qwen3-0.6b-shape, random bf16 weights, or the
tiny model with --tiny) gets a LoRA adapter (r 16 on every projection, as the GSM8K LoRA presets) whose B
matrices are made non-zero, saved by the trainer's own final-save code into RUN/model/. Each variant then
runs the export command's function into a fresh folder (--repeats times; the median is reported), so what is
timed is what `grpo-tui export RUN --to DIR [--merged]` does. Export runs on the CPU: it loads, merges and
writes with transformers and peft there, whatever accelerator the machine has.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VARIANTS = {"adapter": {"merged": False}, "merged": {"merged": True}}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_run(root: Path, tiny: bool, rank: int = 16) -> Path:
    """A run folder whose model/ holds a LoRA adapter on the chosen base; returns the run folder."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_tui.train.final_model import write_model

    if tiny:
        from grpo_tui.tasks.tiny import ensure_tiny_model

        base, name = ensure_tiny_model(), "builtin:tiny-qwen3"
    else:
        from grpo_tui.tasks.shapes import build_shaped_model

        base, name = build_shaped_model("qwen3-0.6b-shape"), "builtin:qwen3-0.6b-shape"
    model = AutoModelForCausalLM.from_pretrained(base)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "lora_B" in param_name:  # zero at init: a trained adapter is not
                param.copy_(torch.randn(param.shape, generator=generator) * 1e-2)
    run = root / "run"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    info = {"run": run.name, "preset": "export-bench", "step": 0, "base_model": name, "base_path": str(base)}
    write_model(model, model.state_dict(), AutoTokenizer.from_pretrained(base), run / "model", info)
    return run


def time_variant(run: Path, root: Path, merged: bool, repeats: int) -> dict[str, Any]:
    from grpo_tui.runs.model_dir import folder_bytes
    from grpo_tui.train.export import ExportRequest, export

    seconds = []
    for i in range(repeats):
        target = root / f"{'merged' if merged else 'adapter'}-{i}"
        start = time.perf_counter()
        export(ExportRequest(run, target, merged=merged))
        seconds.append(time.perf_counter() - start)
        size = folder_bytes(target)
        shutil.rmtree(target)
    return {"seconds": statistics.median(seconds), "all_seconds": seconds, "bytes": size, "mib": size / 2**20}


def _versions() -> dict[str, str]:
    import peft
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
    }


def _device() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0) + " (export itself runs on the CPU)"
    return platform.processor() or "cpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--tiny", action="store_true", help="the tiny model on the CPU: seconds (smoke mode)")
    parser.add_argument("--repeats", type=int, default=3, help="exports per variant (the median is reported)")
    # Before transformers: importing grpo_tui moves the checkout root (PYTHONPATH on the GPU machine) behind
    # the installed packages, so its kernels/ folder cannot shadow Hugging Face's `kernels` package.
    import grpo_tui  # noqa: F401

    args = parser.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    root = Path(tempfile.mkdtemp(prefix="export-bench-"))
    try:
        start = time.perf_counter()
        run = build_run(root, args.tiny)
        build_s = time.perf_counter() - start
        result: dict[str, Any] = {
            "what": "grpo-tui export of a LoRA run: the adapter as it is, and merged into its base",
            "command": " ".join(
                ["python", "benchmarks/export_bench.py", *(argv if argv is not None else sys.argv[1:])]
            ),
            "device": _device(),
            "cpu_cores": __import__("os").cpu_count(),
            "versions": _versions(),
            "model": "builtin:tiny-qwen3" if args.tiny else "builtin:qwen3-0.6b-shape",
            "lora": {"r": 16, "alpha": 32, "target_modules": TARGETS},
            "build_run_s": build_s,
            "run_model_bytes": sum(p.stat().st_size for p in (run / "model").rglob("*") if p.is_file()),
            "variants": {
                name: time_variant(run, root, options["merged"], args.repeats) for name, options in VARIANTS.items()
            },
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name, row in result["variants"].items():
        print(f"{name:8} {row['seconds']:8.2f} s {row['mib']:10.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
