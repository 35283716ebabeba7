"""Timing and result plumbing shared by the kernel benchmark's modes (`bench.py`, `bench_padded.py`)."""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from bench_providers import MIB, loss_fn


def run_step(step: Callable[[], object], inp: dict) -> None:
    """One call of a provider's `step` as it is timed: the inputs' grads cleared, then `step()` and, when it
    returns a loss, its backward."""
    inp["hidden"].grad = inp["weight"].grad = None
    out = step()
    if isinstance(out, torch.Tensor):
        out.backward()


def measure(step: Callable[[], object], inp: dict, reps: int, warmup: int = 2) -> tuple[float, float, float, dict]:
    """(median ms over `reps`, extra peak MiB, median host ms to enqueue, `state_summary` of the GPU's clock and
    power read after each rep) of `step` (+ its backward)."""
    once = functools.partial(run_step, step, inp)
    for _ in range(warmup):
        once()
    inp["hidden"].grad = inp["weight"].grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    once()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / MIB
    times, host, states = [], [], []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        once()
        end.record()
        # Host time to enqueue everything: close to the device time means the host is the bottleneck
        host.append((time.perf_counter() - t0) * 1e3)
        end.synchronize()
        times.append(start.elapsed_time(end))
        states.append(gpu_state())  # after the rep's sync: not inside its time
    inp["hidden"].grad = inp["weight"].grad = None
    return statistics.median(times), peak, statistics.median(host), state_summary(states)


def gpu_state() -> tuple[float, float] | None:
    """The current GPU's (SM clock MHz, power W), read through NVML by torch; None where NVML cannot say."""
    try:
        return float(torch.cuda.clock_rate()), torch.cuda.power_draw() / 1e3
    except Exception:  # no NVML, no GPU, a driver without the counter: the timing stands without it
        return None


def state_summary(samples: list[tuple[float, float] | None]) -> dict:
    """{sm_mhz, power_w}: medians over a provider's reps, {} when none was read.

    An H200 running these GEMMs sits at its power limit (700 W), where the SM clock moves with the work and with
    what ran just before (1.1-1.9 GHz against 1.98 in `benchmarks/results/kernel-padded-h200/`): these say
    under which clock each provider's time was taken.
    """
    got = [s for s in samples if s is not None]
    if not got:
        return {}
    return {
        "sm_mhz": statistics.median(s[0] for s in got),
        "power_w": round(statistics.median(s[1] for s in got), 1),
    }


def check(inp: dict, beta: float, chunk_tokens: int | None) -> dict:
    """Ours (and lean) against naive (bf16 GEMM, fp32 softmax) on the same inputs."""
    out = {}
    grads = {}
    for provider in ("naive", "chunked", "chunked-lean"):
        inp["hidden"].grad = inp["weight"].grad = None
        loss = loss_fn(provider, inp, beta, chunk_tokens)()
        loss.backward()
        grads[provider] = (loss.detach().double(), inp["hidden"].grad.double(), inp["weight"].grad.double())
        inp["hidden"].grad = inp["weight"].grad = None
    ref = grads.pop("naive")
    for provider, (loss, gh, gw) in grads.items():
        out[provider] = {
            "loss_rel_err": ((loss - ref[0]).abs() / ref[0].abs()).item(),
            "grad_hidden_cos": F.cosine_similarity(gh.flatten(), ref[1].flatten(), dim=0).item(),
            "grad_weight_cos": F.cosine_similarity(gw.flatten(), ref[2].flatten(), dim=0).item(),
        }
    return out


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import triton

    out = {"torch": torch.__version__, "triton": triton.__version__}
    for name, dist in (("trl", "trl"), ("liger", "liger-kernel")):
        try:
            out[name] = version(dist)
        except PackageNotFoundError:  # absent is a fine answer here
            out[name] = None
    return out


def cell(provider: str, record: dict | None, floor: float | None, trl: float | None) -> str:
    """One table cell: ms / extra MiB, with the ratio to the floor and (ours) the speed-up over trl;
    the error, or n/a, when the provider has no time there."""
    if record is None or record.get("ms") is None:
        return record.get("error", "n/a") if record else "n/a"
    ms = record["ms"]
    text = f"{ms:.1f} ms / {record['extra_peak_mib']:,.0f} MiB"
    if floor and provider != "floor":
        text += f" ({ms / floor:.2f}x floor"
        text += f", {trl / ms:.2f}x faster than trl)" if trl and provider.startswith("chunked") else ")"
    return text


def int_list(text: str, option: str) -> list[int]:
    """Parse "8,32,64" into positive ints; ValueError with a one-line message otherwise."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option}: expected comma-separated positive integers, got {text!r}") from None
    if any(v <= 0 for v in values):
        raise ValueError(f"{option}: expected comma-separated positive integers, got {text!r}")
    return values


def header(argv: list[str] | None, args: argparse.Namespace) -> dict:
    """What every result file starts with: the command, the GPU, the versions and the head's shape."""
    return {
        "command": " ".join(["python benchmarks/kernel/bench.py", *(argv if argv is not None else sys.argv[1:])]),
        "gpu": torch.cuda.get_device_name(),
        "versions": versions(),
        "shape": {"seq": args.seq, "hidden": args.hidden, "vocab": args.vocab, "beta": args.beta, "dtype": "bf16"},
    }


def finish(result: dict, out: str | None, markdown: str) -> int:
    """Write `result` as JSON to `out` (if given), print the markdown table last; exit status 0."""
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    print(markdown)
    return 0


def timed(make_step: Callable[[], Callable[[], object]], inp: dict, reps: int, warmup: int = 2) -> dict:
    """{ms, extra_peak_mib, host_ms, sm_mhz, power_w} of the step `make_step` builds (the last two where NVML
    answers), or {error} (OOM, not installed, a failure)."""
    try:
        ms, peak, host, state = measure(make_step(), inp, reps, warmup=warmup)
        out = {"ms": ms, "extra_peak_mib": peak, "host_ms": host, **state}
    except torch.cuda.OutOfMemoryError:
        out = {"error": "OOM"}
    except ImportError as exc:
        out = {"error": f"not installed ({exc.name})"}
    except Exception as exc:  # one provider failing must not lose the others' numbers
        out = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"}
    inp["hidden"].grad = inp["weight"].grad = None
    torch.cuda.empty_cache()
    return out
