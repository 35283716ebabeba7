"""The graph decoder's own forward on the decode copy (grpo_tui/train/decode_model.py): fused q/k/v and gate/up.

On the CPU (fp32) its eager twin must decode what `generate` decodes on the trained model, token for token, for
each model type it covers (Qwen3 with q/k norms, Qwen2 with q/k/v biases, Llama with biases everywhere), follow
the copy's refresh, and name what it does not cover.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_decode_copy import fake_trainer, lora_model
from test_generation import EOS, MAX_NEW, PAD, PROMPTS, reference
from transformers import AutoModelForCausalLM

from grpo_tui.train.decode_copy import DecodeCopy
from grpo_tui.train.decode_model import KvCache, fused_blockers, fused_model
from grpo_tui.train.generation import Sampling, StaticDecoder

# Small configs of the other covered types: their attention and MLP biases are the parts Qwen3 lacks
SMALL = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4}


def small_model(kind: str, **extra) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    shape = {**SMALL, "num_key_value_heads": 2, "vocab_size": 96, **extra}
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**shape))
    else:
        model = LlamaForCausalLM(LlamaConfig(**shape, attention_bias=True, mlp_bias=True))
    with torch.no_grad():  # transformers' init (std 0.02) decodes one token everywhere; zero biases hide any left out
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0, 0.3)
    return model.eval()


def on_copy(model: torch.nn.Module) -> tuple[DecodeCopy, torch.nn.Module]:
    copy = DecodeCopy("keep")
    copy.build(model)
    return copy, copy.refresh(model)


def greedy(decoded: torch.nn.Module, decoder: StaticDecoder | None = None, sampling: Sampling | None = None):
    with torch.no_grad():
        out = (decoder or StaticDecoder(use_graph=False)).generate(
            decoded, PROMPTS, MAX_NEW, EOS, PAD, sampling or Sampling(greedy=True)
        )
    return out.ids


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_the_fused_copy_decodes_what_generate_decodes(tiny_model_path: Path, attn: str) -> None:
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32, attn_implementation=attn)
    model.eval()
    _, decoded = on_copy(model)
    assert fused_model(decoded) is not None and fused_model(model) is None  # the copy is fused, the model not
    assert greedy(decoded) == reference(model, PROMPTS, EOS, do_sample=False)
    params = {"temperature": 0.8, "top_k": 30, "top_p": 0.95}
    torch.manual_seed(3)
    expected = reference(model, PROMPTS, EOS, do_sample=True, **params)
    torch.manual_seed(3)
    assert greedy(decoded, sampling=Sampling(**params)) == expected


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_other_covered_model_types_decode_as_generate(kind: str) -> None:
    model = small_model(kind)
    assert fused_blockers(model) == []
    _, decoded = on_copy(model)
    assert fused_model(decoded) is not None
    got = greedy(decoded)
    assert got == reference(model, PROMPTS, EOS, do_sample=False)
    assert len({tuple(row) for row in got}) > 1  # the rows differ: the prompts reached the tokens


def test_projections_are_views_of_the_fused_storage_and_follow_the_refresh(tiny_model_path: Path) -> None:
    model = lora_model(tiny_model_path)
    copy, decoded = on_copy(model)
    fused = fused_model(decoded)
    attention, mlp = decoded.model.layers[0].self_attn, decoded.model.layers[0].mlp
    qkv, gate_up = fused.layers[0].qkv, fused.layers[0].gate_up
    assert attention.q_proj.weight.data_ptr() == qkv.data_ptr()
    assert attention.k_proj.weight.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
    assert mlp.up_proj.weight.untyped_storage().data_ptr() == gate_up.untyped_storage().data_ptr()
    tensors = [*decoded.parameters(), *decoded.buffers()]
    assert copy.nbytes == sum(t.numel() * t.element_size() for t in tensors)  # fusing moved the weights, added none
    decoder = StaticDecoder(use_graph=False)
    before = greedy(decoded, decoder)
    assert before == reference(model, PROMPTS, EOS, do_sample=False)
    with torch.no_grad():  # a training step's worth of change, to the base weights and the adapters
        generator = torch.Generator().manual_seed(1)
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.3)
    again = copy.refresh(model)
    assert again is decoded and fused_model(again) is fused  # in place: same tensors, same view
    after = greedy(decoded, decoder)
    assert after == reference(model, PROMPTS, EOS, do_sample=False) and after != before


def test_what_the_fused_forward_does_not_cover_is_named(tiny_model_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64))
    assert fused_blockers(gpt2) == ["model type gpt2 (fused decoding covers llama, qwen2, qwen3)"]
    dynamic = small_model("llama", rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    assert fused_blockers(dynamic) == ["rotary type dynamic"]
    gelu = small_model("qwen2", hidden_act="gelu")
    assert fused_blockers(gelu) == ["hidden_act gelu"]
    # A model the forward does not cover gets a plain copy, decoded with transformers' forward
    copy = DecodeCopy("keep")
    copy.build(dynamic)
    assert fused_model(copy.refresh(dynamic)) is None


def test_every_graph_rollout_of_a_covered_model_takes_the_fused_copy(tiny_model_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from grpo_tui.train.rollouts import Rollouts, wants_copy

    plain = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64))
    assert wants_copy(fake_trainer(plain), "keep") and wants_copy(fake_trainer(plain), "free")
    assert not wants_copy(fake_trainer(plain), "off")
    assert not wants_copy(fake_trainer(gpt2), "keep")  # no faster forward for it: the live weights, no copy
    assert wants_copy(fake_trainer(gpt2, fsdp=True, fsdp2=True), "keep")  # FSDP2 needs a copy whatever the forward
    assert Rollouts(fake_trainer(plain), "graph").copy is not None


def test_the_kv_cache_is_one_tensor_pair_per_layer_and_resets_to_zero(tiny_model_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    _, decoded = on_copy(model)
    fused = fused_model(decoded)
    cache = KvCache.allocate(fused, rows=3, length=5, device=torch.device("cpu"))
    config = model.config
    assert len(cache.keys) == len(cache.values) == config.num_hidden_layers
    assert {tuple(t.shape) for t in (*cache.keys, *cache.values)} == {(3, config.num_key_value_heads, 5, 16)}
    cache.keys[1].fill_(float("nan"))
    cache.reset()
    assert all(not t.any() for t in (*cache.keys, *cache.values))


def both_prefills(decoded: torch.nn.Module, prompts: list[list[int]]):
    """The packed prefill and the padded one (column chunks) of the same left-padded prompts on one bucket:
    (logits, cache keys and values) of each, and the valid mask [R, P]."""
    from grpo_tui.train import decode_step

    decoder = StaticDecoder(use_graph=False)
    with torch.no_grad():
        decoder.generate(decoded, prompts, 1, EOS, PAD, Sampling(greedy=True))  # fits the bucket
        state, device = decoder.state, decoded.device
        width = max(map(len, prompts))
        ids = torch.full((state.rows, width), PAD, device=device)
        mask = torch.zeros((state.rows, width), dtype=torch.bool, device=device)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = True
        results = []
        for packed in (True, False):
            state.cache.reset()
            if packed:
                logits = decode_step.prefill(decoded, state, ids, mask, decoded.dtype)
            else:
                positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
                logits = decode_step._prefill_in_columns(decoded, state, ids, mask, positions, decoded.dtype)
            cache = torch.stack([*state.cache.keys, *state.cache.values])[:, :, :, :width]  # [2 layers, R, H, P, D]
            results.append((logits, cache.clone()))
    return *results, mask


def test_the_packed_prefill_writes_and_scores_what_the_padded_one_does(tiny_model_path: Path) -> None:
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    prompts = [*PROMPTS, [5] * 9, [7]]  # 10 rows in a bucket of 16: filler rows with no prompt
    (packed, packed_cache), (padded, padded_cache), mask = both_prefills(on_copy(model)[1], prompts)
    real = mask[: len(prompts)]
    torch.testing.assert_close(packed[: len(prompts)], padded[: len(prompts)], rtol=1e-5, atol=1e-5)
    assert not packed[len(prompts) :].any()  # filler rows: zeros, finite
    valid = mask[None, :, None, :, None].expand_as(packed_cache)
    torch.testing.assert_close(packed_cache[valid], padded_cache[valid], rtol=1e-5, atol=1e-5)
    assert not packed_cache[~valid].any()  # padding slots keep the reset's zeros
    assert real.sum() < real.numel()  # the prompts were padded: there was padding to leave out
