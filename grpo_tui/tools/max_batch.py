"""`grpo-tui max-batch PRESET`: the largest per-device batch whose step fits (under a memory cap, if given), found
by doubling and then bisecting over fresh-process trials (`bench_memory.run_trial`)."""

from __future__ import annotations

import shlex
import sys
from dataclasses import asdict
from typing import Any

from grpo_tui.tools.bench_memory import (
    checked_or_exit,
    common_parser,
    environment_info,
    fmt_gib,
    lengths_line,
    run_trial,
    write_report,
)


def find_max_batch(try_batch, step: int, start: int, limit: int) -> tuple[int, list[int]]:
    """Largest multiple of `step` in [step, limit] for which `try_batch(b)` is True (monotone: fits below, OOM above).

    Doubles from `start` until a failure, then bisects between the last success and the failure.
    Returns (best, tried) with best 0 when even `step` fails.
    """
    tried: list[int] = []

    def ok(b: int) -> bool:
        tried.append(b)
        return try_batch(b)

    lo, hi = 0, None  # lo: largest known good; hi: smallest known bad
    b = max(step, (start // step) * step)
    while b <= limit:
        if ok(b):
            lo, b = b, b * 2
        else:
            hi = b
            break
    if hi is None:
        return lo, tried
    if lo == 0 and hi > step:
        lo_probe = step
        if not ok(lo_probe):
            return 0, tried
        lo = lo_probe
    while hi - lo > step:
        mid = ((lo + hi) // 2 // step) * step
        if mid <= lo:
            break
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo, tried


def max_batch_main(argv: list[str] | None = None) -> int:
    """`grpo-tui max-batch PRESET [--memory-cap GiB] [--impl chunked,naive]`."""
    parser = common_parser("grpo-tui max-batch", "Largest per-device batch that completes a step without OOM.")
    parser.add_argument(
        "--memory-cap",
        type=float,
        default=None,
        metavar="GiB",
        help="cap this process's GPU memory to emulate a smaller card",
    )
    parser.add_argument("--start", type=int, default=16, help="first batch tried (default 16)")
    parser.add_argument("--limit", type=int, default=4096, help="largest batch tried (default 4096)")
    parser.add_argument(
        "--multiple",
        type=int,
        default=None,
        help="batches are multiples of this (default: the preset's num_generations)",
    )
    args = parser.parse_args(argv)
    if args.memory_cap is not None and args.memory_cap <= 0:
        parser.error(f"--memory-cap: got {args.memory_cap}; allowed: a positive number of GiB")
    step = args.multiple or checked_or_exit(parser, args.preset, args.sets).grpo.num_generations
    runs_dir = (args.runs_dir or args.out / "runs").resolve()
    command = "grpo-tui max-batch " + shlex.join(argv if argv is not None else sys.argv[1:])
    environment = environment_info()
    results: list[dict[str, Any]] = []  # one entry per impl, the one searching last (max_batch None until done)

    def report() -> str:
        """Written after every trial: a search cut short still leaves its trials."""
        payload = {"command": command, "environment": environment, "lengths": args.lengths, "results": results}
        lines = ["| impl | max per-device batch | memory cap GiB |", "|---|---|---|"]
        lines += [
            f"| {r['impl']} | {'searching' if r['max_batch'] is None else r['max_batch']} "
            f"| {r['memory_cap_gib'] or 'none'} |"
            for r in results
        ]
        lines += ["", lengths_line(args.lengths)]
        write_report(args.out, "max-batch", payload, "\n".join(lines))
        return "\n".join(lines)

    for impl in args.impl:
        entry: dict[str, Any] = {"impl": impl, "max_batch": None, "memory_cap_gib": args.memory_cap, "trials": []}
        results.append(entry)

        def attempt(batch: int, impl: str = impl, entry: dict[str, Any] = entry) -> bool:
            trial = run_trial(
                args.preset,
                impl,
                batch,
                steps=1,
                runs_dir=runs_dir,
                extra_sets=args.sets,
                memory_cap_gib=args.memory_cap,
                lengths=args.lengths,
            ).trial
            entry["trials"].append(asdict(trial))
            why = "" if trial.ok else ": " + (f"OOM in {trial.oom_phase}" if trial.oom_phase else trial.reason)
            print(
                f"{impl:8s} batch {batch:5d}: {'fits' if trial.ok else 'does not fit'}"
                f" (peak {fmt_gib(trial.peak_gib)} GiB){why}",
                flush=True,
            )
            report()
            return trial.ok

        entry["max_batch"], _ = find_max_batch(attempt, step, args.start, args.limit)
    print(report())
    return 0 if any(r["max_batch"] > 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(max_batch_main())
