"""`grpo-tui tune PRESET --memory-cap GiB`: the fastest batch and memory settings that fit a memory cap.

The search is in tune_search.py. Every trial is a fresh `grpo-tui run PRESET --headless` of a few
steps (bench_memory.run_trial), so allocator state never leaks between trials. Throughput is
completion tokens per second of wall time, measured on the trial's last step (the first carries
warm-up):

    tokens/s = completions/mean_length x completions per step / (time(last step) - time(step before))

with completions per step = per_device_batch_size x gradient_accumulation_steps x processes; with a
single step the record's `step_time` stands in for the wall time. A trial fits when it finished
without an OOM and its peak is under the cap: on CUDA the allocator also enforces the cap
($GRPO_TUI_MEMORY_CAP_GIB); on the CPU nothing enforces it, so the peak RSS is compared with the cap.
With `--lengths realistic` the trials' completions end at realistic lengths (`tasks.workload`) instead of all
running to the cap, as an untrained model's do: the batch that wins is the one a real run can afford.
The winner is saved as the user preset `<preset>-tuned-<cap>g`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from grpo_tui.config.cli_args import add_lengths_option, add_set_option
from grpo_tui.config.overrides import apply_overrides
from grpo_tui.config.schema import Preset
from grpo_tui.tools.tune_search import (
    ACCUM,
    BATCH,
    BATCH_LIMIT,
    MEMORY_OPTIONS,
    STATUS_ERROR,
    Measurement,
    TrialRunner,
    TuneResult,
    TuneSearch,
    TuneTrial,
    available_options,
    preset_value,
)

DEFAULT_BUDGET_MIN = 30.0  # a search at 2x/4x the max batch stays well inside half an hour on one GPU
EXIT_USAGE = 2  # bad input, as argparse


def toml_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else json.dumps(value)


def as_sets(settings: dict[str, Any]) -> list[str]:
    return [f"{path}={toml_value(value)}" for path, value in settings.items()]


def measure_steps(steps: list[dict[str, Any]], completions_per_step: int) -> tuple[float | None, float | None]:
    """(seconds, completion tokens per second) of a run's last step, from its step records; see the
    module docstring."""
    from grpo_tui.runs.metrics import GENERATION_TOKENS_KEY, as_float

    if not steps:
        return None, None
    last = steps[-1]
    tokens = as_float(last.get(GENERATION_TOKENS_KEY))  # measured; older runs lack it
    if tokens is None or tokens <= 0:
        length = as_float(last.get("completions/mean_length"))
        tokens = None if length is None else length * completions_per_step
    wall = as_float(last.get("step_time"))
    if len(steps) >= 2:
        later, earlier = as_float(last.get("time")), as_float(steps[-2].get("time"))
        if later is not None and earlier is not None and later > earlier:
            wall = later - earlier
    if wall is None or wall <= 0 or tokens is None:
        return wall, None
    return wall, tokens / wall


def real_runner(
    preset_arg: str, preset: Preset, sets: list[str], cap_gib: float, steps: int, runs_dir: Path, lengths: str = "cap"
) -> TrialRunner:
    """A TrialRunner running `grpo-tui run PRESET --headless` under the memory cap, at `lengths` (`--lengths`)."""
    from grpo_tui.tools.bench_memory import run_trial

    processes = preset.distributed.num_processes * preset.distributed.num_machines

    def run(settings: dict[str, Any], left_s: float) -> Measurement:
        batch = settings.get(BATCH, preset.grpo.per_device_batch_size)
        accum = settings.get(ACCUM, preset.grpo.gradient_accumulation_steps)
        extra = [*sets, "logging.logging_steps=1", *as_sets({k: v for k, v in settings.items() if k != BATCH})]
        got, steps_seen = run_trial(
            preset_arg,
            preset.loss.impl,
            batch,
            steps=steps,
            runs_dir=runs_dir,
            extra_sets=extra,
            memory_cap_gib=cap_gib,
            timeout_s=max(60.0, left_s),  # a trial may overrun the budget by a minute at most
            lengths=lengths,
        )
        step_s, rate = measure_steps(steps_seen, batch * accum * processes)
        reason = got.reason or (f"OOM in {got.oom_phase}" if got.oom_phase else "")
        oom = got.oom_phase is not None
        return Measurement(got.ok, oom, got.peak_gib, step_s, rate, reason, got.wall_s)

    return run


def describe(settings: dict[str, Any]) -> str:
    """`batch 64, accum 2, loss_sub_batch=16, lean` (short names, booleans as bare words)."""
    parts = []
    for path, value in settings.items():
        name = {BATCH: "batch", ACCUM: "accum"}.get(path, path.split(".")[-1])
        parts.append(name if value is True else f"{name} {value}" if path in (BATCH, ACCUM) else f"{name}={value}")
    return ", ".join(parts)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def trial_line(trial: TuneTrial) -> str:
    index, phase, settings, peak, _, rate, status = table_cells(trial)
    return f"trial {index} [{phase}] {settings}: {status}, peak {peak} GiB, {rate} tokens/s"


TABLE_COLUMNS = ("#", "phase", "settings", "peak GiB", "step s", "tokens/s", "result")


def table_cells(trial: TuneTrial, best: bool = False) -> list[str]:
    """One row of the trials table (the text table here, the app's DataTable from the JSON lines)."""
    status = trial.status + (f" ({trial.reason})" if trial.reason and not trial.fits else "")
    cells = [str(trial.index), trial.phase, describe(trial.settings), _fmt(trial.peak_gib), _fmt(trial.step_s, 3)]
    return [*cells, _fmt(trial.tokens_per_s, 0), status + (" (best)" if best else "")]


def trials_table(trials: list[TuneTrial], best: TuneTrial | None) -> str:
    rows = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    rows += ["| " + " | ".join(table_cells(t, t is best)) + " |" for t in trials]
    return "\n".join(rows)


def progress_bar(elapsed: float, budget: float, width: int = 24) -> str:
    done = min(1.0, elapsed / budget) if budget > 0 else 1.0
    return (
        "["
        + "#" * round(done * width)
        + "." * (width - round(done * width))
        + f"] {elapsed / 60:.1f}/{budget / 60:.0f} min"
    )


def tuned_name(preset_name: str, cap_gib: float) -> str:
    return f"{preset_name}-tuned-{cap_gib:g}g"


def build_parser() -> argparse.ArgumentParser:
    description = "The fastest batch and memory settings that fit a memory cap, saved as <preset>-tuned-<cap>g."
    parser = argparse.ArgumentParser(prog="grpo-tui tune", description=description)
    parser.add_argument("preset", help="preset name or path to a .toml")
    parser.add_argument("--memory-cap", type=float, required=True, metavar="GiB", help="memory each device may use")
    parser.add_argument(
        "--time-budget",
        type=float,
        default=DEFAULT_BUDGET_MIN,
        metavar="MIN",
        help="minutes the search may take (default 30)",
    )
    add_set_option(parser, dest="sets")  # applied to every trial
    parser.add_argument(
        "--runs-dir", type=Path, default=Path("tune-runs"), help="where trial runs go (default ./tune-runs)"
    )
    parser.add_argument("--steps", type=int, default=2, help="steps per trial; the last one is measured (default 2)")
    parser.add_argument("--limit", type=int, default=BATCH_LIMIT, help="largest per-device batch tried (default 4096)")
    parser.add_argument("--jsonl", action="store_true", help="one JSON object per trial on stdout (for the app)")
    add_lengths_option(parser)
    return parser


def check_arguments(args: argparse.Namespace) -> tuple[Preset, list[str]] | str:
    """The preset with --set applied and the overrides, or a one-line error."""
    from grpo_tui.config.checks import check_preset
    from grpo_tui.config.schema import PresetError
    from grpo_tui.config.store import load_preset

    for flag, value in (("--memory-cap", args.memory_cap), ("--time-budget", args.time_budget)):
        if not (value > 0 and math.isfinite(value)):  # NaN compares False: refused here too
            return f"{flag}: got {value}; allowed: a positive number"
    for flag, value in (("--steps", args.steps), ("--limit", args.limit)):
        if value < 1:
            return f"{flag}: got {value}; allowed: a positive integer"
    try:
        preset = load_preset(args.preset, args.sets)[0]
    except PresetError as exc:
        return "; ".join(exc.lines)
    errors = check_preset(preset, environment=False).errors
    return "; ".join(errors) if errors else (preset, args.sets)


def wire_output(search: TuneSearch, jsonl: bool) -> None:
    """Print each trial: as a JSON line (for the app), under a redrawn progress bar on a TTY, or plainly."""
    tty = sys.stdout.isatty() and not jsonl

    def started(index: int, settings: dict[str, Any]) -> None:
        if tty:
            bar = progress_bar(search.elapsed(), search.budget_s)
            print(f"\r\x1b[K{bar} trial {index}: {describe(settings)}", end="", flush=True)

    def finished(trial: TuneTrial) -> None:
        if jsonl:
            event = {"trial": asdict(trial), "row": table_cells(trial), "elapsed_s": round(search.elapsed(), 1)}
            print(json.dumps(event), flush=True)
        else:
            print(("\r\x1b[K" if tty else "") + trial_line(trial), flush=True)

    search.on_start, search.on_trial = started, finished
    if jsonl:
        print(json.dumps({"columns": TABLE_COLUMNS}), flush=True)


def main(argv: list[str] | None = None) -> int:
    """`grpo-tui tune PRESET --memory-cap GiB [--time-budget MIN] [--set K=V ...] [--runs-dir DIR] [--steps N]`."""
    args = build_parser().parse_args(argv)
    checked = check_arguments(args)
    if isinstance(checked, str):
        print(f"grpo-tui tune: {checked}", file=sys.stderr)
        return EXIT_USAGE
    preset, sets = checked
    runs_dir = args.runs_dir.resolve()
    search = TuneSearch(
        real_runner(args.preset, preset, sets, args.memory_cap, args.steps, runs_dir, args.lengths),
        cap_gib=args.memory_cap,
        budget_s=args.time_budget * 60,
        batch_step=preset.grpo.num_generations,
        base={path: preset_value(preset, path) for path in (BATCH, ACCUM, *(o.path for o in MEMORY_OPTIONS))},
        options=available_options(),
        limit=args.limit,
    )
    wire_output(search, args.jsonl)
    return report(args, preset, search.run())


def report(args: argparse.Namespace, preset: Preset, result: TuneResult) -> int:
    """Print the table and the verdict; save the winner as a user preset. Exit 1 when nothing fits."""
    from grpo_tui.config.store import save_user_preset

    budget_note = " (stopped: time budget reached)" if result.out_of_budget else ""
    lengths_note = f" (completion lengths: {args.lengths})"
    if not args.jsonl:  # the app builds its table from the trial events
        print(trials_table(result.trials, result.best))
    if result.best is None:
        peaks = [t.peak_gib for t in result.trials if t.peak_gib is not None]
        smallest = f"; smallest peak {min(peaks):.2f} GiB" if peaks else ""
        errors = [t.reason for t in result.trials if t.status == STATUS_ERROR]
        if errors and len(errors) == len(result.trials):
            smallest = f"; every trial failed, e.g. {errors[0] or 'no step record'}"
        line = f"nothing fits under {args.memory_cap:g} GiB in {len(result.trials)} trials{smallest}{budget_note}"
        done = {"best": None, "lengths": args.lengths, "message": line + lengths_note}
        print(json.dumps({"done": done}) if args.jsonl else line + lengths_note, flush=True)
        return 1
    best = result.best
    tuned = apply_overrides(preset, as_sets(best.settings))  # `preset` already has --set applied
    path = save_user_preset(tuned, tuned_name(preset.name, args.memory_cap), overwrite=True)
    line = (
        f"best: {describe(best.settings)} at {best.tokens_per_s:.0f} tokens/s, peak {_fmt(best.peak_gib)} GiB"
        f"{lengths_note}{budget_note}; saved {path}"
    )
    done = {"best": asdict(best), "preset": str(path), "lengths": args.lengths, "message": line}
    print(json.dumps({"done": done}) if args.jsonl else line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
