"""Finished rows stop costing: the decoder moves the rows still decoding to the front and decodes only those.
Greedy completions and their log-probs are those of the decoder that keeps every row (the eager twin on CPU)."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_decode_model import on_copy
from test_generation import PAD
from transformers import AutoModelForCausalLM

from grpo_tui.train.generation import ROW_MULTIPLE, Sampling, StaticDecoder, _halved_rows

MAX_NEW = 48
# A token the tiny model never decodes greedily from these prompts: rows end where `lengths` ends them
NEVER = 2


@pytest.fixture(scope="module")
def decoded(tiny_model_path: Path) -> torch.nn.Module:
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    return on_copy(model)[1]


def prompts(count: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(rng.randrange(3, 9))] for _ in range(count)]


def rollout(decoder: StaticDecoder, model, rows: list[list[int]], lengths, eos=(NEVER,), sampling=None):
    with torch.no_grad():
        return decoder.generate(model, rows, MAX_NEW, list(eos), PAD, sampling or Sampling(greedy=True), lengths)


def test_compacted_greedy_rollout_is_the_full_one(decoded: torch.nn.Module) -> None:
    rows = prompts(37, decoded.config.vocab_size)
    rng = random.Random(1)
    # Most rows end early, a few run to the cap: the active rows fall below half the bucket twice
    lengths = [MAX_NEW if i % 9 == 0 else rng.randrange(1, 12) for i in range(len(rows))]
    full, compact = StaticDecoder(use_graph=False), StaticDecoder(use_graph=False, compact=True)
    expected, got = rollout(full, decoded, rows, lengths), rollout(compact, decoded, rows, lengths)
    assert full.row_counts == [40]
    assert compact.row_counts[0] == 40 and len(compact.row_counts) >= 3  # 40 -> 8 active rows at most
    assert compact.row_counts[-1] == ROW_MULTIPLE
    assert got.ids == expected.ids
    for a, b in zip(got.logprobs, expected.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-5)


def test_positions_count_what_each_decode_step_computed(decoded: torch.nn.Module) -> None:
    rows = prompts(16, decoded.config.vocab_size, seed=5)
    lengths = [2] * 8 + [MAX_NEW] * 8
    width = max(map(len, rows))
    kept, compact = StaticDecoder(use_graph=False), StaticDecoder(use_graph=False, compact=True)
    rollout(kept, decoded, rows, lengths)
    rollout(compact, decoded, rows, lengths)
    # The prefill's prompt tokens (packed on the fused copy: no padding), then one position per bucket row and
    # decode step (the first token comes from the prefill): every row to the end when kept; 8 rows from the first
    # compaction on.
    prompt = sum(map(len, rows))
    assert prompt < 16 * width
    assert kept.positions == prompt + 16 * (MAX_NEW - 1)
    assert compact.row_counts == [16, 8]
    assert prompt + 8 * (MAX_NEW - 1) < compact.positions < kept.positions


def test_the_preset_field_turns_compaction_on(tiny_model_path: Path) -> None:
    from test_decode_copy import fake_trainer

    from grpo_tui.config.schema import Preset
    from grpo_tui.train.options import TrainerOptions
    from grpo_tui.train.rollouts import Rollouts

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    for mode in ("keep", "compact"):
        options = TrainerOptions.from_preset(Preset.model_validate({"grpo": {"finished_rows": mode}}))
        rollouts = Rollouts(fake_trainer(model), "graph", compact=options.finished_rows == "compact")
        assert rollouts.decoder.compact is (mode == "compact")


def test_rows_end_at_their_forced_length_or_their_own_eos(decoded: torch.nn.Module) -> None:
    rows = prompts(24, decoded.config.vocab_size, seed=2)
    lengths = [random.Random(i).randrange(1, MAX_NEW + 1) for i in range(len(rows))]
    eos = NEVER
    for compact in (False, True):
        got = rollout(StaticDecoder(use_graph=False, compact=compact), decoded, rows, lengths, eos=(eos,))
        for ids, logps, cap in zip(got.ids, got.logprobs, lengths, strict=True):
            assert len(ids) <= cap and len(logps) == len(ids)
            assert ids[-1] == eos  # forced or its own: every row ends before MAX_NEW here
            assert eos not in ids[:-1]


def test_compaction_halves_at_least_and_not_near_the_end(decoded: torch.nn.Module) -> None:
    rows = prompts(16, decoded.config.vocab_size, seed=3)
    decoder = StaticDecoder(use_graph=False, compact=True)
    cases = [
        ([2] * 8 + [MAX_NEW] * 8, [16, 8]),  # half the rows end before the first check
        ([2] * 7 + [MAX_NEW] * 9, [16]),  # 9 active rows still need 16
        ([40] * 8 + [MAX_NEW] * 8, [16]),  # within the capture's warm-up room of the end
        ([MAX_NEW - 2] * 16, [16]),
    ]
    for lengths, counts in cases:
        rollout(decoder, decoded, rows, lengths)
        assert decoder.row_counts == counts, lengths


def test_sampled_compacted_rollouts_are_valid_completions(decoded: torch.nn.Module) -> None:
    rows = prompts(20, decoded.config.vocab_size, seed=4)
    lengths = [MAX_NEW if i < 3 else 4 for i in range(len(rows))]
    torch.manual_seed(0)
    decoder = StaticDecoder(use_graph=False, compact=True)
    got = rollout(decoder, decoded, rows, lengths, sampling=Sampling(temperature=0.9, top_k=20))
    assert decoder.row_counts == [24, 8]
    assert [len(ids) for ids in got.ids[3:]] == [4] * 17 or all(len(ids) <= 4 for ids in got.ids[3:])
    assert all(all(lp <= 0.0 for lp in row) for row in got.logprobs)
    assert len({tuple(ids) for ids in got.ids[:3]}) == 3


def test_compaction_moves_along_the_buckets_halvings_whatever_the_active_count() -> None:
    # A rollout's lengths change every step; the row counts it compacts to must not, or each step captures anew
    for bucket, chain in ((128, {128, 64, 32, 16, 8}), (40, {40, 24, 16, 8}), (8, {8})):
        seen = {_halved_rows(bucket, active) for active in range(bucket + 1)}
        assert seen == chain
        for active in range(1, bucket + 1):
            rows = _halved_rows(bucket, active)
            assert rows >= active and (rows == bucket or _halved_rows(rows, active) == rows)


def test_a_finished_row_attends_to_its_own_new_slot_only() -> None:
    from grpo_tui.train.decode_step import step_keys

    length, rows = 10, 3
    key_valid = torch.ones((rows, length), dtype=torch.bool)
    key_valid[:, :2] = torch.tensor([[False, True], [True, True], [False, False]])  # left-padded prompts
    state = SimpleNamespace(
        key_valid=key_valid,
        key_index=torch.arange(length),
        cache_index=torch.tensor(5),
        finished=torch.tensor([False, True, False]),
    )
    allowed = step_keys(state)
    slots = torch.arange(length)
    # Unfinished rows: their prompt and every slot written so far, the new one included
    assert torch.equal(allowed[0], key_valid[0] & (slots <= 5))
    assert torch.equal(allowed[2], key_valid[2] & (slots <= 5))
    # The finished row: its new slot alone, so the decode kernel reads one block of its cache
    assert allowed[1].nonzero().flatten().tolist() == [5]


@pytest.mark.parametrize("kernel_choice", [False, True], ids=["torch-choice", "kernel-choice"])
def test_the_halvings_share_one_compiled_step(
    decoded: torch.nn.Module, request: pytest.FixtureRequest, kernel_choice: bool
) -> None:
    """Each halving's row count would compile the step again (~25 s each on a GPU): the compacted views mark their
    rows dynamic, so the bucket's own step and one for every halving are all that compile. Inductor on the CPU;
    also with grpo_kernels' token choice (interpreted), which must not break the graph (forced EOS included)."""
    from torch._dynamo.utils import counters

    if kernel_choice:
        request.getfixturevalue("token_kernel")
    attention = () if kernel_choice else None  # sdpa: the attention kernel stays out of the interpreter

    torch._dynamo.reset()  # nothing compiled by earlier tests is reused, nor counted
    counters.clear()
    rows = prompts(37, decoded.config.vocab_size, seed=3)
    rng = random.Random(2)
    lengths = [MAX_NEW if i % 9 == 0 else rng.randrange(1, 12) for i in range(len(rows))]
    compiled = StaticDecoder(use_graph=False, compiled=True, compact=True, sdpa_backends=attention)
    got = rollout(compiled, decoded, rows, lengths)
    assert len(compiled.row_counts) >= 3  # the bucket and at least two halvings
    assert counters["stats"]["unique_graphs"] == 2 and not counters["graph_break"]
    assert (compiled.state.seed is not None) == kernel_choice
    assert got.ids == rollout(StaticDecoder(use_graph=False, sdpa_backends=attention), decoded, rows, lengths).ids
