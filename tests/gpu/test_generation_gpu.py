"""grpo.generation_backend = graph on CUDA: the captured decode step against `model.generate`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

# tests/ is on sys.path (its conftest.py, pytest's prepend import mode): the CPU test's fixtures and reference
from test_generation import EOS, MAX_NEW, PAD, PROMPTS, reference
from transformers import AutoModelForCausalLM

from grpo_tui.train.generation import Sampling, StaticDecoder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

# bf16 rounds the logits to 8 bits of mantissa: near-ties may flip later in a completion, and one flip shifts
# everything after it, so bf16 compares the first tokens, where the two paths have the same inputs.
BF16_FIRST_TOKENS, BF16_ROWS_AGREEING = 3, 0.9


def load(path: Path, dtype: torch.dtype, attn: str = "sdpa") -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn).cuda().eval()


def many_prompts(count: int, vocab: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 12, (count,), generator=generator).tolist()
    return [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in lengths]


def graph_decode(decoder: StaticDecoder, model: torch.nn.Module, prompts: list[list[int]], eos: list[int]):
    with torch.no_grad():
        return decoder.generate(model, prompts, MAX_NEW, eos, PAD, Sampling(greedy=True)).ids


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_graph_greedy_matches_generate_fp32(tiny_model_path: Path, attn: str) -> None:
    model = load(tiny_model_path, torch.float32, attn)
    decoder = StaticDecoder(use_graph=True)
    assert graph_decode(decoder, model, PROMPTS, EOS) == reference(model, PROMPTS, EOS, do_sample=False)
    assert decoder.captures == 1


def test_graph_greedy_agrees_with_generate_bf16(tiny_model_path: Path) -> None:
    model = load(tiny_model_path, torch.bfloat16)
    prompts = many_prompts(64, model.config.vocab_size)
    got = graph_decode(StaticDecoder(use_graph=True), model, prompts, [1])
    expected = reference(model, prompts, [1], do_sample=False)
    k = BF16_FIRST_TOKENS
    agreeing = sum(a[:k] == b[:k] for a, b in zip(got, expected, strict=True)) / len(prompts)
    assert agreeing >= BF16_ROWS_AGREEING
    # The graph replays the eager twin's kernels: the two agree exactly, whatever the dtype.
    twin = graph_decode(StaticDecoder(use_graph=False), model, prompts, [1])
    assert got == twin


@pytest.mark.parametrize("compiled", [False, True], ids=["plain", "compiled"])
def test_graph_follows_weights_updated_in_place(tiny_model_path: Path, compiled: bool) -> None:
    model = load(tiny_model_path, torch.float32)
    decoder = StaticDecoder(use_graph=True, compiled=compiled)
    before = graph_decode(decoder, model, PROMPTS, [1])
    generator = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():  # as the optimizer does: same storage, new values
        for p in model.parameters():
            p.add_(torch.randn(p.shape, device="cuda", generator=generator) * 0.05)
    after = graph_decode(decoder, model, PROMPTS, [1])
    assert decoder.captures == 1 and decoder.compiled == compiled  # replayed, not captured again
    assert after == reference(model, PROMPTS, [1], do_sample=False)
    assert after != before


@pytest.mark.parametrize("compiled", [False, True], ids=["plain", "compiled"])
def test_graph_with_lora_adapters_updated_in_place(tiny_model_path: Path, compiled: bool) -> None:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        load(tiny_model_path, torch.float32),
        LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"]),
    ).eval()
    decoder = StaticDecoder(use_graph=True, compiled=compiled)
    graph_decode(decoder, model, PROMPTS, [1])
    with torch.no_grad():  # lora_B starts at zero: give the adapters an effect, in place
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    assert graph_decode(decoder, model, PROMPTS, [1]) == reference(model, PROMPTS, [1], do_sample=False)
    assert decoder.captures == 1 and decoder.compiled == compiled


@pytest.mark.parametrize(
    "sampling",
    [
        Sampling(temperature=0.8, top_k=30, top_p=0.95, min_p=0.05),
        Sampling(repetition_penalty=1.3),
        Sampling(temperature=0.9),  # GRPOConfig's kind: grpo_kernels' one-pass token choice
    ],
    ids=["warpers", "repetition", "temperature-only"],
)
def test_graph_samples_what_the_eager_twin_samples(tiny_model_path: Path, sampling: Sampling) -> None:
    """The graph holds the sampling too: under the same seed its replays draw the eager twin's tokens (the
    one-pass kernel reads its seed and step from device tensors, so each replay draws anew)."""
    model = load(tiny_model_path, torch.float32)
    prompts = many_prompts(16, model.config.vocab_size, seed=1)

    def sampled(decoder: StaticDecoder) -> list[list[int]]:
        with torch.no_grad():
            decoder.generate(model, prompts, MAX_NEW, EOS, PAD, sampling)  # fits (and captures) the bucket
            torch.manual_seed(7)
            return decoder.generate(model, prompts, MAX_NEW, EOS, PAD, sampling).ids

    graph = StaticDecoder(use_graph=True)
    got = sampled(graph)
    assert got == sampled(StaticDecoder(use_graph=False))
    assert graph.captures == 1 and (graph.state.seed is not None) == (sampling == Sampling(temperature=0.9))
    assert len({tuple(row) for row in got}) > 1  # sampled, not one repeated row


def test_training_on_cuda_uses_the_graph(tiny_model_path: Path, tmp_path: Path) -> None:
    from test_trainer import make_run, run_steps

    run = make_run(
        tmp_path, "graph-cuda", grpo={"max_steps": 3, "generation_backend": "graph"}, distributed={"use_cpu": False}
    )
    code, steps, events = run_steps(run)
    assert code == 0 and len(steps) == 3
    assert not [e for e in events if e["event"] == "generation_fallback"]
    assert all(s["generation/backend"] == "graph" and s["generation/tokens_per_s"] > 0 for s in steps)
    assert all(s["completions/mean_length"] > 0 for s in steps)


def test_one_compiled_captured_step_serves_every_cache_length(tiny_model_path: Path) -> None:
    """The cache is as long as each rollout needs: prompts of other widths capture again but do not compile
    again (the length is a dynamic dimension of the compiled step), and the tokens stay generate's."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = load(tiny_model_path, torch.float32)
    decoder = StaticDecoder(use_graph=True, compiled=True)
    compiled: list[int] = []  # graphs dynamo has made, after each rollout
    for extra in (0, 3, 10):
        prompts = [p + [5] * extra for p in PROMPTS]
        assert graph_decode(decoder, model, prompts, [1]) == reference(model, prompts, [1], do_sample=False)
        assert decoder.state.length == max(map(len, prompts)) + MAX_NEW
        decoder.release()  # as the trainer does after each rollout
        compiled.append(counters["stats"]["unique_graphs"])
    assert decoder.compiled and decoder.captures == 3
    assert compiled[0] > 0 and compiled == compiled[:1] * 3
