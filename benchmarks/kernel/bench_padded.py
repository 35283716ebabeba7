"""Padded mode of the kernel benchmark: real GRPO batches, where part of every [B, T] batch is padding.

Run: `python benchmarks/kernel/bench.py --padding 0,25,50,75 --valid-tokens 4096,16384,32768 --scoring --out p.json`.
Each case holds a fixed number of *valid* tokens; padding adds positions around them. Completion lengths are
drawn per sequence (fixed seed) from Beta(4 mu, 4 (1 - mu)) scaled to [1, T], a bounded distribution whose
mean mu (T - 1) + 1 = (1 - padding) T, then nudged by single tokens so they sum to the valid count exactly;
masks are right padding (TRL's completion mask). `--lengths` adds one case from a real run: a JSON list of
lengths (drawn from with replacement), or a run's metrics.jsonl, whose per-step `completions/mean_length`
(or `completion_length`) gives the mean of the same Beta draw (the stream has no per-sequence lengths).
Providers, timed as in `timing.measure`: floor (the GEMMs over the valid tokens only), trl (TRL 1.16's fused
head as its trainer calls it: valid rows only, labels -100 at padding), chunked, chunked-lean, naive
(materialised logits over every position); loss + backward, and with `--scoring` no-grad scoring (floor:
the logits GEMM; ours: `selective_logprobs(..., mask=)`; lean is loss-only). `--scoring-chunks 256,512,1536`
also times our scoring at those chunk sizes (providers `chunked-c<rows>`) beside its default.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import random
import sys

import bench_providers
import timing
import torch

PADDED_PROVIDERS = ("floor", "trl", "chunked", "chunked-lean", "naive")
# Beta concentration a + b of the length draw: 4 spreads lengths over most of [1, T] at every mean
LENGTH_CONCENTRATION = 4.0


def draw_lengths(n_valid: int, seq: int, mean: float, seed: int = 0, pool: list[int] | None = None) -> list[int]:
    """Completion lengths in [1, seq] that sum to exactly `n_valid`, about `mean` each.

    Args:
        n_valid: valid tokens in the batch; seq: T, the padded length; mean: the mean length to aim at.
        seed: the draw's seed (same lengths every run).
        pool: real lengths to draw from with replacement (clipped to [1, seq]) instead of the Beta draw.

    Returns:
        B lengths, B = round(n_valid / mean) (at least n_valid / seq rounded up, at most n_valid).
    """
    if n_valid <= 0 or seq <= 0:
        raise ValueError(f"n_valid and seq must be positive, got {n_valid}, {seq}")
    rng = random.Random(seed)
    mean = min(max(mean, 1.0), float(seq))
    batch = min(n_valid, max(math.ceil(n_valid / seq), round(n_valid / mean)))
    if pool:
        lengths = [min(max(int(rng.choice(pool)), 1), seq) for _ in range(batch)]
    elif mean >= seq:
        lengths = [seq] * batch
    else:
        mu = (mean - 1) / (seq - 1)  # mean on [0, 1]; 0 < mu < 1 here
        a, b = LENGTH_CONCENTRATION * mu, LENGTH_CONCENTRATION * (1 - mu)
        lengths = [1 + round(rng.betavariate(a, b) * (seq - 1)) if mu > 0 else 1 for _ in range(batch)]
    # Single-token nudges on random sequences with room until the sum is exact (room exists: B <= n_valid <= B T)
    diff = n_valid - sum(lengths)
    step = 1 if diff > 0 else -1
    while diff:
        room = [i for i, n in enumerate(lengths) if 1 <= n + step <= seq]
        for i in rng.sample(room, min(abs(diff), len(room))):
            lengths[i] += step
            diff -= step
    return lengths


def lengths_from_file(path: str) -> tuple[float, list[int] | None]:
    """(mean length, pool of lengths or None) from a JSON list of lengths or a run's metrics.jsonl."""
    with open(path) as f:
        text = f.read()
    if path.endswith(".jsonl"):
        means = []
        for line in text.splitlines():
            rec = json.loads(line) if line.strip() else {}
            value = rec.get("completions/mean_length", rec.get("completion_length"))
            if isinstance(value, int | float):
                means.append(float(value))
        if not means:
            raise ValueError(f"--lengths: no completions/mean_length (or completion_length) in {path}")
        return sum(means) / len(means), None
    pool = json.loads(text)
    if not isinstance(pool, list) or not pool or not all(isinstance(x, int) and x > 0 for x in pool):
        raise ValueError(f"--lengths: {path} must hold a JSON list of positive ints (or be a metrics.jsonl)")
    return sum(pool) / len(pool), pool


def right_padding_mask(lengths: list[int], seq: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[B, T] int64 completion mask: 1 for the first `length` positions of each sequence."""
    return (torch.arange(seq, device=device) < torch.tensor(lengths, device=device).unsqueeze(1)).long()


def padded_inputs(lengths: list[int], seq: int, hidden: int, vocab: int, seed: int = 0, device: str = "cuda") -> dict:
    """`bench_providers.make_inputs` for len(lengths) sequences, with their right-padding mask."""
    inp = bench_providers.make_inputs(len(lengths), seq, hidden, vocab, seed, device)
    inp["mask"] = right_padding_mask(lengths, seq, inp["ids"].device)
    return inp


def cases(args: argparse.Namespace) -> list[dict]:
    """The (valid tokens, padding) cases to time: each with its label and lengths."""
    out = []
    mean, pool = lengths_from_file(args.lengths) if args.lengths else (None, None)  # read once
    for n_valid in timing.int_list(args.valid_tokens, "--valid-tokens"):
        for pct in _percent_list(args.padding):
            lengths = draw_lengths(n_valid, args.seq, args.seq * (1 - pct / 100), seed=args.seed)
            out.append({"valid_tokens": n_valid, "padding": f"{pct}%", "lengths": lengths})
        if args.lengths:
            lengths = draw_lengths(n_valid, args.seq, mean, seed=args.seed, pool=pool)
            out.append({"valid_tokens": n_valid, "padding": "real", "lengths": lengths, "mean_length": mean})
    return out


def _percent_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = [-1]
    if any(not 0 <= v < 100 for v in values):
        raise ValueError(f"--padding: expected comma-separated percentages in [0, 100), got {text!r}")
    return values


def table(records: list[dict]) -> str:
    """Markdown: one row per (mode, valid tokens, padding); ms per provider with its ratio to the floor."""
    provs = list(dict.fromkeys(r["provider"] for r in records))
    keys = list(dict.fromkeys((r["mode"], r["valid_tokens"], r["padding"]) for r in records))
    keys.sort(key=lambda k: k[0] != "loss")  # the loss rows first (a stable sort keeps the rest in order)
    get = {(r["mode"], r["valid_tokens"], r["padding"], r["provider"]): r for r in records}
    lines = ["| mode | valid tokens | padding (B x T) | " + " | ".join(provs) + " |", "|---" * (len(provs) + 3) + "|"]
    for key in keys:
        floor = get.get((*key, "floor"), {}).get("ms")
        trl = get.get((*key, "trl"), {}).get("ms")
        cells = [timing.cell(p, get.get((*key, p)), floor, trl) for p in provs]
        timed = [r for p in provs if (r := get.get((*key, p))) is not None and r.get("ms") is not None]
        shape = f" ({timed[-1]['padding_frac']:.1%} of {timed[-1]['batch']} x {timed[-1]['seq']})" if timed else ""
        label = key[2] if key[2] != "real" else "real lengths"
        lines.append(f"| {key[0]} | {key[1]:,} | {label}{shape} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(args: argparse.Namespace, argv: list[str] | None) -> int:
    """The padded mode of `bench.main` (already parsed `args`); returns the exit status."""
    providers = [p.strip() for p in (args.providers or ",".join(PADDED_PROVIDERS)).split(",") if p.strip()]
    bad = [p for p in providers if p not in PADDED_PROVIDERS]
    try:
        if bad:
            raise ValueError(f"--providers: unknown {', '.join(bad)}; allowed: {', '.join(PADDED_PROVIDERS)}")
        if args.reps <= 0:
            raise ValueError("--reps/--liger-reps: expected a positive integer")
        todo = cases(args)
        scoring_chunks = timing.int_list(args.scoring_chunks, "--scoring-chunks")
        if scoring_chunks and not args.scoring:
            raise ValueError("--scoring-chunks: needs --scoring")
    except (ValueError, OSError) as exc:
        print(str(exc).splitlines()[0], file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("benchmarks/kernel/bench.py: needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    modes = ("loss", "scoring") if args.scoring else ("loss",)
    records, checks = [], []
    for case in todo:
        lengths = case.pop("lengths")
        inp = padded_inputs(lengths, args.seq, args.hidden, args.vocab, seed=args.seed)
        shape = {"batch": len(lengths), "seq": args.seq, "padding_frac": 1 - case["valid_tokens"] / inp["mask"].numel()}
        for mode in modes:
            # (name, provider, chunk rows): the scoring sweep times ours again at each of --scoring-chunks
            runs = [(p, p, args.chunk_tokens) for p in providers]
            if mode == "scoring" and "chunked" in providers:
                runs += [(f"chunked-c{c}", "chunked", c) for c in scoring_chunks]
            for name, provider, chunk in runs:
                if mode == "scoring" and provider == "chunked-lean":
                    continue  # lean changes only the dW accumulation: scoring has none
                rec = {"mode": mode, "provider": name, **case, **shape, "ms": None, "extra_peak_mib": None}
                if mode == "loss":
                    make = functools.partial(bench_providers.loss_fn, provider, inp, args.beta, chunk)
                else:
                    make = functools.partial(bench_providers.score_fn, provider, inp, chunk)
                rec.update(reps=args.reps, **timing.timed(make, inp, args.reps))
                records.append(rec)
                print(json.dumps(rec), flush=True)
        if not args.no_check:
            try:
                checks.append({**case, **timing.check(inp, args.beta, args.chunk_tokens)})
            except torch.cuda.OutOfMemoryError:  # naive over every position: too big at high padding
                checks.append({**case, "error": "OOM"})
            print(json.dumps(checks[-1]), flush=True)
        del inp
        torch.cuda.empty_cache()
    distribution = f"Beta({LENGTH_CONCENTRATION:g} mu, {LENGTH_CONCENTRATION:g} (1 - mu)) on [1, T]"
    lengths = {"distribution": distribution, "seed": args.seed, "file": args.lengths}
    result = {**timing.header(argv, args), "reps": args.reps, "lengths": lengths, "records": records, "checks": checks}
    return timing.finish(result, args.out, table(records))
