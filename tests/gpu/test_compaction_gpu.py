"""Compaction on CUDA: graphs captured in the middle of a rollout for the rows still decoding replay what the
bucket's full graph decodes (fp32 greedy), and sampled bf16 completions keep their log-prob distribution."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from test_compaction import MAX_NEW, prompts, rollout
from test_decode_model import on_copy
from test_generation_gpu import load

from grpo_tui.train.generation import Sampling, StaticDecoder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def skewed_lengths(count: int, seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    return [MAX_NEW if i % 9 == 0 else rng.randrange(1, 12) for i in range(count)]


@pytest.mark.parametrize("compiled", [False, True], ids=["plain", "compiled"])
def test_compacted_graph_decodes_what_the_full_graph_decodes_in_fp32(tiny_model_path: Path, compiled: bool) -> None:
    _, decoded = on_copy(load(tiny_model_path, torch.float32))
    rows, lengths = prompts(37, decoded.config.vocab_size), skewed_lengths(37)
    full = StaticDecoder(use_graph=True, compiled=compiled)
    compact = StaticDecoder(use_graph=True, compiled=compiled, compact=True)
    expected = rollout(full, decoded, rows, lengths)
    for _ in range(2):  # the second rollout replays the graphs the first captured mid-rollout
        got = rollout(compact, decoded, rows, lengths)
        assert got.ids == expected.ids
        assert len(compact.row_counts) >= 3
    assert compact.captures == len(compact.row_counts)  # one graph per row count, kept with the bucket
    for a, b in zip(got.logprobs, expected.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-5)


def test_sampled_compacted_rollouts_keep_the_log_prob_distribution_in_bf16(tiny_model_path: Path) -> None:
    _, decoded = on_copy(load(tiny_model_path, torch.bfloat16))
    rows, lengths = prompts(256, decoded.config.vocab_size, seed=5), skewed_lengths(256, seed=5)
    sampling = Sampling(temperature=1.0)

    def mean_and_se(compact: bool) -> tuple[float, float]:
        decoder = StaticDecoder(use_graph=True, compiled=True, compact=compact)
        logps = []
        for seed in range(2):
            torch.manual_seed(seed)
            logps += [lp for row in rollout(decoder, decoded, rows, lengths, sampling=sampling).logprobs for lp in row]
        values = torch.tensor(logps)
        return float(values.mean()), float(values.std() / len(values) ** 0.5)

    (kept, kept_se), (compacted, compacted_se) = mean_and_se(False), mean_and_se(True)
    assert abs(kept - compacted) <= 3 * (kept_se**2 + compacted_se**2) ** 0.5, (kept, compacted)
