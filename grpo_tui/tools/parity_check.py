"""`grpo-tui check PRESET`: the parity probe between the chunked kernel and a baseline.

One generation batch of the preset (real model, real prompts, real rewards) goes through `chunked` and
the baseline (`loss.baseline`, or `--baseline`) on the same inputs: scoring (log-probs without grad)
and the loss forward + backward. Printed side by side: loss, grad norm, max |Δ log-prob|, max |Δ grad|
of the lm_head weight (relative to its largest entry), and peak memory and time per phase. Exit 0 when
all differences are within the tolerance of the model's dtype, 1 beyond it, 2 on bad input.

It runs in this process on one device (the first GPU, else the CPU), whatever the preset's
[distributed] section says: the point is the numerics of one batch, not the launch.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_tui.config.cli_args import add_set_option

# Relative tolerance per compute dtype: fp32 differs only by summation order; bf16/fp16 round the
# logits (TRL's fused head and the kernel accumulate differently), so a looser bound.
TOLERANCE = {"float32": 1e-4, "float64": 1e-8, "bfloat16": 3e-2, "float16": 1e-2}


@dataclass
class ImplResult:
    impl: str
    loss: float
    grad_norm: float
    logps: Any  # [B, T] masked log-probs of the completion tokens
    head_grad: Any  # lm_head weight gradient
    peaks: dict[str, float]
    times: dict[str, float]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpo-tui check", description=__doc__.splitlines()[0])
    parser.add_argument("preset", help="preset name or .toml path")
    add_set_option(parser)
    parser.add_argument("--baseline", choices=("naive", "trl"), help="default: the preset's loss.baseline")
    parser.add_argument("--rtol", type=float, help="relative tolerance (default by dtype: fp32 1e-4, bf16 3e-2)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from grpo_tui.config.schema import PresetError
    from grpo_tui.config.store import load_preset

    try:
        preset, _ = load_preset(args.preset, args.overrides)
    except PresetError as exc:
        for line in exc.lines:
            print(line, file=sys.stderr)
        return 2
    # The libraries' deprecation chatter would bury the side-by-side table this command exists to print.
    warnings.filterwarnings("ignore", category=FutureWarning)
    baseline = args.baseline or preset.loss.baseline
    _quiet_progress_bars()
    try:
        results, dtype = run_probe(preset, baseline)
    except (ValueError, OSError) as exc:
        print(f"grpo-tui check: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    rtol = args.rtol if args.rtol is not None else TOLERANCE.get(dtype, 3e-2)
    ok, lines = compare(results[0], results[1], rtol)
    print(f"parity probe: {preset.name}, dtype {dtype}, tolerance {rtol:g} (relative)")
    for line in lines:
        print(line)
    print("OK: chunked matches " + baseline if ok else "FAIL: chunked differs from " + baseline + " beyond tolerance")
    return 0 if ok else 1


def _quiet_progress_bars() -> None:
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()


def run_probe(preset: Any, baseline: str) -> tuple[list[ImplResult], str]:
    """Generate one batch, then score and differentiate it with chunked and `baseline`."""
    import torch

    from grpo_tui.runs.folder import RunDir
    from grpo_tui.train.assemble import build_trainer

    cuda = torch.cuda.is_available()
    preset = preset.model_copy(deep=True)
    preset.distributed.num_processes = 1
    preset.distributed.use_cpu = not cuda
    preset.loss.impl = "chunked"
    preset.logging.report_to = ["none"]
    with tempfile.TemporaryDirectory(prefix="grpo-tui-check-") as tmp:
        trainer = build_trainer(preset, RunDir(Path(tmp)))
        # Set by Trainer.train(); the loss normalisers read it
        trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
        model = trainer.model
        model.train()
        batch = next(iter(trainer.get_train_dataloader()))
        with trainer.phases.track("generation_and_scoring"):
            inputs = trainer._prepare_inputs(batch)
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        results = [_measure(trainer, inputs, impl) for impl in ("chunked", baseline)]
    return results, dtype


def _measure(trainer: Any, inputs: dict[str, Any], impl: str) -> ImplResult:
    import torch

    from grpo_tui.losses.chunked import lm_head_of

    trainer.switch_loss_impl(impl)
    model = trainer.model
    model.zero_grad(set_to_none=True)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    keep = inputs["completion_ids"].size(1)
    times, phases = {}, trainer.phases
    phases.take_step()
    start = _now()
    with torch.no_grad(), phases.track("scoring"):
        logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, keep, compute_entropy=True)
    times["scoring"] = _now() - start
    start = _now()
    with phases.track("loss"):
        loss = trainer.compute_loss(model, inputs)
        loss.backward()
    times["loss"] = _now() - start
    grads = [p.grad.float().norm() for p in model.parameters() if p.grad is not None]
    grad_norm = torch.linalg.vector_norm(torch.stack(grads)).item() if grads else 0.0
    head = lm_head_of(model).weight
    head_grad = (
        head.grad.detach().float().clone() if head.grad is not None else torch.zeros_like(head, dtype=torch.float32)
    )
    completion_mask = inputs["completion_mask"].bool()
    return ImplResult(
        impl,
        loss.item(),
        grad_norm,
        logps.float().masked_fill(~completion_mask, 0.0),
        head_grad,
        phases.take_step(),
        times,
    )


def _now() -> float:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def compare(chunked: ImplResult, base: ImplResult, rtol: float) -> tuple[bool, list[str]]:
    """Side-by-side lines and whether every difference is within `rtol`."""
    d_logp = (chunked.logps - base.logps).abs().max().item()
    scale = max(base.head_grad.abs().max().item(), 1e-12)
    d_grad = (chunked.head_grad - base.head_grad).abs().max().item() / scale
    # A loss that is a cancellation of near-equal terms gets an absolute floor: the grad norm judges it.
    loss_ok = _rel(chunked.loss, base.loss) <= rtol or abs(chunked.loss - base.loss) <= rtol * 1e-2
    checks = {
        "loss": loss_ok,
        "grad_norm": _rel(chunked.grad_norm, base.grad_norm) <= rtol,
        "logp": d_logp <= rtol * 10,  # log-probs are O(1-10): an absolute bound scaled like the others
        "head_grad": d_grad <= rtol,
    }
    lines = [f"{'':24}{'chunked':>16}{base.impl:>16}{'diff':>14}  ok"]
    lines.append(
        f"{'loss':24}{chunked.loss:16.8g}{base.loss:16.8g}{_rel(chunked.loss, base.loss):14.3g}  {_mark(checks['loss'])}"
    )
    lines.append(
        f"{'grad_norm':24}{chunked.grad_norm:16.8g}{base.grad_norm:16.8g}{_rel(chunked.grad_norm, base.grad_norm):14.3g}  {_mark(checks['grad_norm'])}"
    )
    lines.append(f"{'max |Δ log-prob|':24}{'':32}{d_logp:14.3g}  {_mark(checks['logp'])}")
    lines.append(f"{'max |Δ grad lm_head|/max':24}{'':32}{d_grad:14.3g}  {_mark(checks['head_grad'])}")
    for phase in ("scoring", "loss"):
        lines.append(f"{'peak MiB ' + phase:24}{chunked.peaks.get(phase, 0):16.1f}{base.peaks.get(phase, 0):16.1f}")
        lines.append(f"{'time ms ' + phase:24}{chunked.times[phase] * 1e3:16.1f}{base.times[phase] * 1e3:16.1f}")
    return all(checks.values()), lines


def _mark(ok: bool) -> str:
    return "yes" if ok else "NO"


if __name__ == "__main__":
    sys.exit(main())
