"""The decode copy on CUDA: FSDP2 at world size 1 (NCCL), the captured graph on the copy of the shards."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

# tests/ is on sys.path (its conftest.py, pytest's prepend import mode)
from test_decode_copy import run_probe

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("adapters", ["lora", "full"])
def test_fsdp2_graph_on_the_copy_is_generate_in_fp32(tiny_model_path: Path, tmp_path: Path, adapters: str) -> None:
    (r,) = run_probe(tiny_model_path, adapters, tmp_path, "cuda", "greedy", ranks=1)
    assert r["sharded"]
    assert r["before"] == r["before_ref"] and r["after"] == r["after_ref"]
    assert r["after"] != r["before"]
    # Refreshed in place: the graph captured on the first rollout replays the new weights
    assert r["builds"] == 1 and r["captures"] == 1


def test_fsdp2_graph_samples_as_generate_in_bf16(tiny_model_path: Path, tmp_path: Path) -> None:
    """bf16 merges and kernels are not bit-equal to the sharded model's: over 512 completions the sampled
    tokens' mean log-prob and the mean length match generate's within 3 combined standard errors."""
    (r,) = run_probe(tiny_model_path, "lora", tmp_path, "cuda", "sampling", ranks=1)
    graph, generate = r["graph"], r["generate"]
    assert graph["completions"] == generate["completions"] == 512
    for key in ("mean_logprob", "length_mean"):
        spread = (graph[f"{key}_se"] ** 2 + generate[f"{key}_se"] ** 2) ** 0.5
        assert abs(graph[key] - generate[key]) <= 3 * spread, (key, graph, generate)
