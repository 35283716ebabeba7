"""Whole training steps at realistic completion lengths: ours against TRL, per shape, and what padding costs.

    python benchmarks/real_length_steps.py --data GSM8K.jsonl --out DIR [--shapes 0.6b:128x1024,...] [--specs ...]
    python benchmarks/real_length_steps.py --tiny --out DIR          # CPU smoke run (tests)
    python benchmarks/real_length_steps.py --merge A.json B.json --out DIR [--specs ...]   # one result from several calls

Each (shape, spec) is a fresh headless run of `--steps` steps (default 3; its row is the mean of steps 2 on: step 1
compiles) with $GRPO_TUI_COMPLETION_LENGTHS=realistic (grpo_tui/tasks/workload.py: each row's completion ends at a
seeded drawn length, mean ~35% of the cap, ~10% of rows at it; the same draw for every spec), except `ours-to-cap`,
whose completions run to the cap (random weights never emit EOS): the no-padding reference. Specs:

    trl-user        TRL 1.16 as a user has it: TRL's head, transformers' generate, padded scoring and loss
    trl-head-graph  TRL's head on our graph rollouts (finished rows kept), padded: against `ours`, what is left
                    is the padding work alone; against `ours-compact`, compaction's gain in the rollout too
    ours            our head on our graph rollouts, scoring and loss without padding (grpo.padding_free), the
                    decoder's finished rows kept (grpo.finished_rows = keep)
    ours-compact    ours with the finished rows compacted away (grpo.finished_rows = compact, the default)
    ours-efficient  ours-compact with the training step's attention held to memory-efficient kernels: cuDNN's
                    (torch's choice on Hopper) are planned again for each new sequence length, and grouped rows
                    meet a few new lengths every step (model.sdpa_kernels)
    ours-compiled   ours-compact with the decoder layers compiled for scoring and the loss (model.compile_layers)
    ours-4groups    ours-compact with four length groups per scoring batch and loss micro-batch, not the packed
                    default of one (grpo.length_groups = 4): packed, the groups only bound the activation peak
    ours-to-cap     ours with every completion at the cap

Targets, per shape (the `targets` of the result; None where a run is missing):
    step_vs_trl_head   ours step / trl-head-graph step          <= 0.5
    step_vs_trl_user   ours step / trl-user step                 <= 0.15
    train_allowance    ours (scoring + loss) / (1.3 x train valid share x ours-to-cap (scoring + loss)) <= 1
    decode_allowance   ours generation / (1.3 x valid share x ours-to-cap generation)           <= 1 (no prefill
                       credit here: benchmarks/real_lengths.py times the rollout alone, prefill apart)
with valid share = generated tokens of `ours` / those of `ours-to-cap` (the decode target counts completions), and
train valid share = the real tokens scoring and the loss compute in `ours` (prompts and completions, as the
phases' valid share counts them; a row's `valid_tokens`, from TRL's `num_tokens`) / those of `ours-to-cap`.
`train_allowance_completions` is the train ratio with the completions' share instead: it charges ours for the
prompts, which both runs compute in full. `ours-compact` gets the same ratios as `compact_*`, `ours-efficient` as
`efficient_*`, `ours-compiled` as `compiled_*`, `ours-4groups` as `fourgroups_*`. Writes DIR/real-length-steps.json.
`--merge` joins the rows of results measured on one device by separate calls (a short GPU session may not hold every
spec; a later file's row replaces an earlier one of the same label; with --specs, only those specs' rows), keeps
each file's command, and computes the targets again; with `--reread`, each row whose run folder is still beside its
file (runs/MODEL-ROWSxCAP-SPEC) is read again from that run's metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from step_times import device_name, mean_of, mean_step, peak_mib, pick_steps

from grpo_tui.runs.metrics import (
    GENERATION_BACKEND_KEY,
    GENERATION_TOKENS_KEY,
    STEP_TIME_KEY,
    TOKEN_PHASES,
    phase_time_key,
    read_records,
    step_records,
    valid_share_key,
)
from grpo_tui.tasks.workload import LENGTHS_ENV

# shape -> (preset, model); a shape's rows x cap come with it on the command line (0.6b:128x1024)
MODELS = {
    "0.6b": ("qwen3-0.6b-gsm8k", "builtin:qwen3-0.6b-shape"),
    "1.7b-lora": ("qwen3-1.7b-gsm8k-fsdp-lora", "builtin:qwen3-1.7b-shape"),
    "tiny": ("tiny-cpu", "builtin:tiny-qwen3"),
}
# spec -> (loss.impl, generation backend, padding_free, realistic lengths, more --set overrides)
SPECS: dict[str, tuple[str, str, bool, bool, tuple[str, ...]]] = {
    "trl-user": ("trl", "generate", False, True, ()),
    "trl-head-graph": ("trl", "graph", False, True, ("grpo.finished_rows=keep",)),
    "ours": ("chunked", "graph", True, True, ("grpo.finished_rows=keep",)),
    "ours-compact": ("chunked", "graph", True, True, ("grpo.finished_rows=compact",)),
    "ours-efficient": (
        "chunked",
        "graph",
        True,
        True,
        ("grpo.finished_rows=compact", 'model.sdpa_kernels=["efficient"]'),
    ),
    "ours-compiled": ("chunked", "graph", True, True, ("grpo.finished_rows=compact", "model.compile_layers=true")),
    "ours-4groups": ("chunked", "graph", True, True, ("grpo.finished_rows=compact", "grpo.length_groups=4")),
    "ours-to-cap": ("chunked", "graph", True, False, ()),
}
DEFAULT_SHAPES = "0.6b:128x1024,0.6b:64x2048,1.7b-lora:32x1024"
ALLOWANCE = 1.3


def parse_shapes(text: str) -> list[tuple[str, int, int]]:
    shapes = []
    for item in text.split(","):
        model, _, size = item.strip().partition(":")
        rows, _, cap = size.partition("x")
        if model not in MODELS or not (rows.isdecimal() and cap.isdecimal() and int(rows) > 0 and int(cap) > 0):
            allowed = ", ".join(MODELS)
            raise ValueError(f"--shapes: got {item!r}; allowed: MODEL:ROWSxCAP with MODEL one of {allowed}")
        shapes.append((model, int(rows), int(cap)))
    return shapes


def run_sets(model: str, data: str, rows: int, cap: int, steps: int, spec: str, device: str) -> list[str]:
    impl, backend, padding_free, _, extra = SPECS[spec]
    sets = [
        f"model.name_or_path={model}",
        "distributed.num_processes=1",
        f"grpo.per_device_batch_size={rows}",
        "grpo.gradient_accumulation_steps=1",
        f"grpo.max_completion_length={cap}",
        f"grpo.max_steps={steps}",
        f"loss.impl={impl}",
        f"grpo.generation_backend={backend}",
        f"grpo.padding_free={'true' if padding_free else 'false'}",
        "logging.save_steps=0",
        "logging.completions_per_step=0",
        *extra,
    ]
    if data:
        sets.append(f"data.source={data}")
    if device == "cpu":  # the smoke run: no graph decoder, a few rows
        sets += ["grpo.generation_backend=generate", "grpo.num_generations=4", "eval.at_end=false"]
    return sets


def run_folder(out: Path, model: str, rows: int, cap: int, spec: str) -> Path:
    return out / "runs" / f"{model}-{rows}x{cap}-{spec}"


def run_row(shape: tuple[str, int, int], spec: str, sets: list[str], out: Path, timeout: int) -> dict[str, Any]:
    """One fresh headless run and its row (the mean of steps 2 on)."""
    model, rows, cap = shape
    preset = MODELS[model][0]
    runs = run_folder(out, model, rows, cap, spec)
    argv = [sys.executable, "-m", "grpo_tui.cli", "run", preset, "--headless", "--runs-dir", str(runs)]
    for item in sets:
        argv += ["--set", item]
    env = {**os.environ, LENGTHS_ENV: "realistic" if SPECS[spec][3] else "cap"}
    start = time.perf_counter()
    log = out / f"{model}-{rows}x{cap}-{spec}.log"
    with log.open("w") as handle:
        try:
            code = subprocess.run(argv, stdout=handle, stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = None
    impl, backend = SPECS[spec][:2]
    row: dict[str, Any] = {
        "label": f"{model} {rows}x{cap} {spec}",
        "spec": spec,
        "impl": impl,
        "backend": backend,
        "batch": rows,
        "cap": cap,
    }
    row.update(exit=code, wall_s=round(time.perf_counter() - start, 1))
    return read_row(row, runs)


def valid_tokens(steps: list[dict[str, Any]]) -> dict[int, float]:
    """Real tokens (prompts and completions) each step's scoring and loss computed, by step: the growth of TRL's
    running `num_tokens`, which counts them from the attention masks whatever the layout (padded or packed)."""
    out: dict[int, float] = {}
    before: tuple[int, float] = (0, 0.0)  # the last step whose count was read, and its count
    for record in steps:
        step, total = record.get("step"), record.get("num_tokens")
        if type(step) is not int or not isinstance(total, (int, float)) or isinstance(total, bool):
            continue
        if before[0] == step - 1:  # a step without a count in between leaves the next one unknown
            out[step] = total - before[1]
        before = (step, total)
    return out


def read_row(row: dict[str, Any], runs: Path, only: list[int] | None = None) -> dict[str, Any]:
    """`row` (label, spec, exit, ...) with the figures of the run under `runs`: the mean of steps 2 on, or of the
    steps `only` names."""
    row = {key: value for key, value in row.items() if key in ROW_KEYS}
    metrics = sorted(runs.glob("*/metrics.jsonl"))
    records = read_records(metrics[-1]) if metrics else []
    every = step_records(records)
    steps = pick_steps(every, set()) if only is None else [r for r in every if r.get("step") in only]
    if not steps:
        errors = [r.get("message") for r in records if r.get("event") in ("error", "oom")]
        row["error"] = (errors or ["timed out" if row.get("exit") is None else "no step record"])[-1]
        return row
    merged = mean_step(steps)
    peak = peak_mib(merged["memory"])

    tokens = valid_tokens(every)
    row.update(
        backend=merged[GENERATION_BACKEND_KEY],
        mean_length=merged["completions/mean_length"],
        step_s=merged[STEP_TIME_KEY],
        generation_s=merged[phase_time_key("generation")],
        scoring_s=merged[phase_time_key("scoring")],
        loss_s=merged[phase_time_key("loss")],
        peak_gib=round(peak / 1024, 2) if peak else None,
        generated_tokens=mean_of([s.get(GENERATION_TOKENS_KEY) for s in steps]),
        valid_tokens=mean_of([tokens.get(s["step"]) for s in steps]),
        valid_share={phase: mean_of([s.get(valid_share_key(phase)) for s in steps]) for phase in TOKEN_PHASES},
        steps=[s["step"] for s in steps],
    )
    return row


# What a row keeps when it is read again from its run folder (`read_row`): who ran, not what was measured
ROW_KEYS = ("label", "spec", "impl", "backend", "batch", "cap", "exit", "wall_s")


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def targets(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """The issue's ratios per shape (see the module docstring)."""
    out: dict[str, dict[str, float | None]] = {}
    by_shape: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if "error" not in r:
            by_shape.setdefault(r["label"].rsplit(" ", 1)[0], {})[r["spec"]] = r
    for shape, specs in by_shape.items():
        cap, user, head = (specs.get(s) or {} for s in ("ours-to-cap", "trl-user", "trl-head-graph"))
        out[shape] = {}
        for name, prefix in (
            ("ours", ""),
            ("ours-compact", "compact_"),
            ("ours-efficient", "efficient_"),
            ("ours-compiled", "compiled_"),
            ("ours-4groups", "fourgroups_"),
        ):
            ours = specs.get(name)
            if ours is None:
                continue
            share = _ratio(ours.get("generated_tokens"), cap.get("generated_tokens"))
            train_share = _ratio(ours.get("valid_tokens"), cap.get("valid_tokens"))
            train = [(r.get("scoring_s") or 0.0) + (r.get("loss_s") or 0.0) for r in (ours, cap)]
            out[shape].update(
                {
                    f"{prefix}valid_share": share,
                    f"{prefix}train_valid_share": train_share,
                    f"{prefix}step_vs_trl_head": _ratio(ours.get("step_s"), head.get("step_s")),
                    f"{prefix}step_vs_trl_user": _ratio(ours.get("step_s"), user.get("step_s")),
                    f"{prefix}train_allowance": None
                    if train_share is None
                    else _ratio(train[0], ALLOWANCE * train_share * train[1]),
                    f"{prefix}train_allowance_completions": None
                    if share is None or not cap
                    else _ratio(train[0], ALLOWANCE * share * train[1]),
                    f"{prefix}decode_allowance": None
                    if share is None or cap.get("generation_s") is None
                    else _ratio(ours.get("generation_s"), ALLOWANCE * share * cap["generation_s"]),
                }
            )
    return out


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'label':34} {'mean len':>8} {'step s':>7} {'gen s':>7} {'score s':>7} {'loss s':>7} {'peak GiB':>8}"
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['label']:34} failed (exit {r.get('exit')}): {r['error']}")
            continue
        cells = [r.get(k) for k in ("mean_length", "step_s", "generation_s", "scoring_s", "loss_s", "peak_gib")]
        lines.append(f"{r['label']:34} " + " ".join(f"{'-' if c is None else c:>7}" for c in cells))
    return "\n".join(lines)


ROW_FIGURES = ("step_s", "generation_s", "scoring_s", "loss_s", "generated_tokens", "valid_tokens")


def _is_row(row: Any) -> bool:
    """A row `targets` can read: label and spec, and each figure a number or absent."""
    return (
        isinstance(row, dict)
        and isinstance(row.get("label"), str)
        and isinstance(row.get("spec"), str)
        and all(row.get(k) is None or type(row[k]) in (int, float) for k in ROW_FIGURES)
    )


def merge(paths: list[Path], specs: list[str] | None = None, reread: bool = False) -> dict[str, Any]:
    """One result from the results of several calls on one device (see the module docstring), only the rows of
    `specs` where given; ValueError (one line) for a file that is not such a result, or results from different
    devices."""
    parts = []
    for path in paths:
        try:
            part = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"--merge: cannot read {path}: {type(exc).__name__}") from None
        if not (isinstance(part, dict) and isinstance(part.get("rows"), list) and isinstance(part.get("command"), str)):
            raise ValueError(f"--merge: {path} is not a real-length-steps.json (rows and command)")
        if not all(_is_row(r) for r in part["rows"]):
            raise ValueError(f"--merge: {path} has a row without a label and spec, or a figure that is not a number")
        parts.append(part)
    devices = sorted({str(p.get("device")) for p in parts})
    if len(devices) > 1:
        raise ValueError(f"--merge: one device per result; got {', '.join(devices)}")
    rows: dict[str, dict[str, Any]] = {}
    for path, part in zip(paths, parts):
        for row in part["rows"]:
            if specs is None or row["spec"] in specs:
                rows[row["label"]] = _read_again(row, path.parent) if reread else row
    commands = "\n".join(p["command"] for p in parts).splitlines()
    # A file merged again with one of its parts lists that part's command once
    merged = {**parts[0], "command": "\n".join(dict.fromkeys(commands)), "rows": list(rows.values())}
    merged["targets"] = targets(merged["rows"])
    return merged


def _read_again(row: dict[str, Any], folder: Path) -> dict[str, Any]:
    """`row` read again from its run folder under `folder` when that folder is there (the same steps as before,
    so every figure it had stays), else as it is."""
    model = row["label"].split(" ", 1)[0]
    batch, cap, steps = row.get("batch"), row.get("cap"), row.get("steps")
    if model not in MODELS or type(batch) is not int or type(cap) is not int or row["spec"] not in SPECS:
        return row
    if not (isinstance(steps, list) and steps and all(type(s) is int for s in steps)):
        steps = None
    runs = run_folder(folder, model, batch, cap, row["spec"])
    return read_row(row, runs, steps) if runs.is_dir() else row


def save(result: dict[str, Any], out: Path) -> None:
    (out / "real-length-steps.json").write_text(json.dumps(result, indent=1) + "\n")


def show(result: dict[str, Any]) -> None:
    print(table(result["rows"]))
    print(json.dumps(result["targets"], indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="", help="GSM8K-style .jsonl (default: each preset's own data)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"MODEL:ROWSxCAP,... (default {DEFAULT_SHAPES})")
    parser.add_argument("--specs", default=",".join(SPECS), help=f"any of: {', '.join(SPECS)}")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per run")
    parser.add_argument("--tiny", action="store_true", help="the smoke run: tiny-cpu at 8x4 on the CPU")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="JSON", help="join the results of several calls")
    parser.add_argument(
        "--reread", action="store_true", help="with --merge: rows read again from the run folders beside their files"
    )
    args = parser.parse_args(argv)
    specs = [s.strip() for s in args.specs.split(",") if s.strip()]
    if not specs or any(s not in SPECS for s in specs):
        parser.error(f"--specs: got {args.specs!r}; allowed: {', '.join(SPECS)}")
    if args.reread and not args.merge:
        parser.error("--reread: allowed only with --merge (it reads the rows of merged files again)")
    if args.merge:
        try:
            result = merge(args.merge, specs, args.reread)
        except ValueError as exc:
            parser.error(str(exc))
        args.out.mkdir(parents=True, exist_ok=True)
        save(result, args.out)
        show(result)
        return 0
    try:
        shapes = parse_shapes("tiny:8x4" if args.tiny else args.shapes)
    except ValueError as exc:
        parser.error(str(exc))
    args.out.mkdir(parents=True, exist_ok=True)
    data = str(Path(args.data).resolve()) if args.data else ""
    device = "cpu" if args.tiny else "cuda"
    result: dict[str, Any] = {
        "what": "whole steps at realistic completion lengths: ours, TRL's head on our rollouts, TRL as a user has it",
        "command": " ".join(
            ["python", "benchmarks/real_length_steps.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "device": device_name(),
        "python": platform.python_version(),
        "rows": [],
    }
    for shape in shapes:
        model = MODELS[shape[0]][1]
        for spec in specs:
            sets = run_sets(model, data, shape[1], shape[2], args.steps, spec, device)
            result["rows"].append(run_row(shape, spec, sets, args.out, args.timeout))
            print(json.dumps(result["rows"][-1]), flush=True)
            result["targets"] = targets(result["rows"])
            save(result, args.out)  # after every run: a stopped call keeps its rows
    show(result)
    return 0 if all("error" not in r for r in result["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
