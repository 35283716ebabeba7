"""Completion lengths forced on a run's rollouts ($GRPO_TUI_COMPLETION_LENGTHS): rows end at their drawn lengths on
TRL's generate path and on the graph decoder's (its eager twin on the CPU), draws repeat under one seed, the tools
pass the variable to their trials, and a bad value stops a run before it starts."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest
import torch
from test_generation import tiny_trainer

from grpo_tui.tasks.workload import LENGTHS_ENV, ForcedLengths
from grpo_tui.train.forced_lengths import EndAtLengths
from grpo_tui.train.generation import StaticDecoder
from grpo_tui.train.sampling import Sampling

CAP = 16
# A token the tiny model seldom chooses greedily from these prompts: made the EOS, most rows run to the cap freely
NEVER = 2


def test_rows_choose_eos_at_their_length_and_nothing_else_changes() -> None:
    lengths, eos = [1, 3, 3, 5], 4
    processor = EndAtLengths(lengths, eos)
    prompt = torch.zeros((4, 6), dtype=torch.long)
    for taken in range(5):
        scores = torch.randn(4, 9)
        out = processor(torch.cat([prompt, torch.ones((4, taken), dtype=torch.long)], 1), scores.clone())
        for row, length in enumerate(lengths):
            if length == taken + 1:
                assert out[row].argmax() == eos and torch.isinf(out[row]).sum() == 8
            else:
                assert torch.equal(out[row], scores[row])


@pytest.fixture(scope="module")
def trainer(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(LENGTHS_ENV, "realistic:3")  # read once, when the trainer is built
        trainer = tiny_trainer(tmp_path_factory.mktemp("forced"), f"grpo.max_completion_length={CAP}")
    assert trainer.rollouts.forced == ForcedLengths(3)
    trainer.generation_config.do_sample = False  # greedy: a forced row is its free completion cut short
    trainer.generation_config.eos_token_id, trainer.eos_token_ids = NEVER, [NEVER]
    return trainer


def prompts(count: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(5, 60) for _ in range(rng.randrange(3, 9))] for _ in range(count)]


def free_and_forced(trainer, rows: list[list[int]], slices: list[int]) -> tuple[list, list, list[int]]:
    """The greedy completions without and with forced lengths, and the lengths drawn for the slices' sizes."""
    forced, trainer.rollouts.forced = trainer.rollouts.forced, None
    free, _ = trainer._generate_single_turn(rows, None, {}, 8)
    trainer.rollouts.forced = forced
    step = trainer.state.global_step = trainer.state.global_step + 1  # a new step: its slices count from 0
    got, _ = trainer._generate_single_turn(rows, None, {}, 8)
    drawn = [n for part, size in enumerate(slices) for n in forced.draw(size, CAP, step, 0, part)]
    return free, got, drawn


@pytest.mark.parametrize("decoder", ["generate", "graph (eager twin)"])
def test_rows_end_at_the_drawn_lengths(trainer, decoder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    trainer.generation_sub_batch = 8  # two slices: each draws its own lengths
    monkeypatch.setattr(Sampling, "of_trainer", classmethod(lambda cls, _: cls(greedy=True)))  # the decoder's
    trainer.rollouts.decoder = StaticDecoder(use_graph=False) if decoder != "generate" else None
    try:
        free, got, drawn = free_and_forced(trainer, prompts(16), [8, 8])
    finally:
        trainer.rollouts.decoder, trainer.generation_sub_batch = None, None
    # A row ends at its drawn length, or where it chose the EOS itself before (the free completion shows where)
    expected = [row if row[-1] == NEVER and len(row) <= n else row[: n - 1] + [NEVER] for row, n in zip(free, drawn)]
    assert got == expected
    assert sum(len(row) == n < len(own) for row, own, n in zip(got, free, drawn)) >= len(free) // 2


def test_a_row_that_ends_itself_ends_sooner(trainer) -> None:
    rows = prompts(8)
    free, got, drawn = free_and_forced(trainer, rows, [8])
    own = free[0][1]  # a token of the first row's free completion: made an EOS too, it ends the row there
    ends = free[0].index(own) + 1
    trainer.generation_config.eos_token_id, trainer.eos_token_ids = [own, NEVER], [NEVER, own]
    try:
        got, _ = trainer._generate_single_turn(rows, None, {}, 8)  # the same step again: its next slice
        drawn = trainer.rollouts.forced.draw(8, CAP, trainer.state.global_step, 0, 1)
    finally:
        trainer.generation_config.eos_token_id, trainer.eos_token_ids = NEVER, [NEVER]
    assert len(got[0]) == min(ends, drawn[0])
    assert all(len(row) <= n for row, n in zip(got, drawn, strict=True))


def test_the_same_step_draws_the_same_lengths_again(trainer) -> None:
    rows = prompts(8)
    _, first, _ = free_and_forced(trainer, rows, [8])
    trainer.state.global_step += 1  # another step draws other lengths ...
    other, _ = trainer._generate_single_turn(rows, None, {}, 8)
    trainer.state.global_step -= 1  # ... and coming back to the step starts its slices again
    again, _ = trainer._generate_single_turn(rows, None, {}, 8)
    assert again == first and [len(r) for r in other] != [len(r) for r in first]


def trial_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, main, argv: list[str]) -> list[dict]:
    """The environments a tool's trials were started with (each trial's `grpo-tui run` is faked)."""
    from grpo_tui.tools import bench_memory

    envs: list[dict] = []

    def fake_run(args, env, **kwargs):
        envs.append(env)
        return subprocess.CompletedProcess(args, 1, "", "grpo-tui: faked trial")

    monkeypatch.setattr(bench_memory.subprocess, "run", fake_run)
    monkeypatch.setenv(LENGTHS_ENV, "realistic:9")  # the caller's own value never reaches a trial
    main([*argv, "--runs-dir", str(tmp_path / "runs")])
    return envs


@pytest.mark.parametrize("lengths", [None, "realistic", "realistic:5"])
def test_max_batch_and_bench_memory_pass_the_lengths_to_each_trial(monkeypatch, tmp_path: Path, lengths) -> None:
    from grpo_tui.tools.bench_memory import main
    from grpo_tui.tools.max_batch import max_batch_main

    flag = [] if lengths is None else ["--lengths", lengths]
    for tool, argv, stem in (
        (max_batch_main, ["tiny-cpu", "--impl", "chunked", *flag], "max-batch"),
        (main, ["tiny-cpu", "--impl", "chunked", "--batch", "8,16", *flag], "e2e"),
    ):
        argv = [*argv, "--out", str(tmp_path / "out")]
        envs = trial_env(monkeypatch, tmp_path, tool, argv)
        assert envs and all(env[LENGTHS_ENV] == (lengths or "cap") for env in envs)
        assert json.loads((tmp_path / "out" / f"{stem}.json").read_text())["lengths"] == (lengths or "cap")
        assert f"completion lengths: {lengths or 'cap'}" in (tmp_path / "out" / f"{stem}.md").read_text()


def test_tune_passes_the_lengths_to_each_trial(monkeypatch, tmp_path: Path, capsys) -> None:
    from grpo_tui.tools import tune

    argv = [
        "tiny-cpu",
        "--memory-cap",
        "8",
        "--lengths",
        "realistic:2",
        "--jsonl",
        "--time-budget",
        "0.5",
        "--limit",
        "8",
    ]
    envs = trial_env(monkeypatch, tmp_path, tune.main, argv)
    assert envs and all(env[LENGTHS_ENV] == "realistic:2" for env in envs)
    done = json.loads(capsys.readouterr().out.splitlines()[-1])["done"]
    assert done["lengths"] == "realistic:2" and "completion lengths: realistic:2" in done["message"]


@pytest.mark.parametrize("tool", ["tune", "max-batch", "bench memory"])
def test_a_bad_lengths_flag_is_one_argparse_line(tool: str, capsys) -> None:
    from grpo_tui.tools import bench_memory, max_batch, tune

    main = {"tune": tune.main, "max-batch": max_batch.max_batch_main, "bench memory": bench_memory.main}[tool]
    with pytest.raises(SystemExit) as exc:
        main(["tiny-cpu", *(["--memory-cap", "8"] if tool == "tune" else []), "--lengths", "x"])
    assert exc.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if not line.startswith(("usage:", " "))]
    assert line.endswith(
        "argument --lengths: got 'x'; allowed: cap, realistic or realistic:SEED (SEED a whole number of up to 19 digits)"
    )


def test_run_refuses_a_bad_variable_before_creating_anything(tmp_path: Path, monkeypatch, capsys) -> None:
    from grpo_tui import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(LENGTHS_ENV, "realistic:seven")
    assert cli.main(["run", "tiny-cpu", "--headless"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"{LENGTHS_ENV}: got 'realistic:seven'; allowed: cap, realistic or realistic:SEED (SEED a whole number of up to 19 digits)"
    ]
    assert not (tmp_path / "runs").exists()
