"""The graph decoder's own forward on the decode copy: Llama-family layers with q/k/v and gate/up fused.

A decode step at 128 rows runs each projection as its own small GEMM, and on the H200 each of those takes ~5 us
whatever its size (4-6 MB of weights, far from the memory bandwidth; the kernel profile that
`benchmarks/generation_bench.py` writes): seven per layer, a quarter of the step.
The decode copy is ours, so its q/k/v weights become views of one tensor per layer and gate/up of another
(`fuse_projections`); every other consumer of the copy (the refresh, transformers' forward) sees the same
parameters as before. `forward` then runs four GEMMs per layer, with its own KV cache and none of transformers'
per-call mask and cache bookkeeping, which a captured step would replay every token. `prefill_packed` runs the
same layers over the prompts without their padding (variable-length attention, each row to itself): at 128
GSM8K prompts of mean 74 tokens, longest 151, half the tokens a padded prefill computes (a sixth less through the
benchmarks' shaped tokenizer: mean 215, cut at 256).

It covers the model types whose decoder layer is exactly this computation (`FUSED_MODEL_TYPES`: pre-norm RMSNorm
layers, optional q/k norms per head, rotary positions with fixed frequencies, a SiLU-gated MLP, biases where
the linear layers have them); `fused_blockers` says why another model keeps transformers' forward. The
arithmetic follows transformers' modules step for step (RMSNorm in fp32, rotary cos/sin in the model's dtype),
so in fp32 greedy decoding is token for token what `generate` gives (tests/test_decode_model.py).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from grpo_tui.losses.packing import Packing, varlen_attention
from grpo_tui.train.decode_attention import folded_attention

# Model types whose decoder layers `forward` reproduces (checked against transformers' modeling code)
FUSED_MODEL_TYPES = frozenset({"qwen3", "qwen2", "llama"})
# Rotary types whose frequencies are fixed at load time (dynamic and longrope change them with the length)
STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})

# The fused view of each copy that has one, by the copy (the copy's life decides the view's)
_FUSED: weakref.WeakKeyDictionary[torch.nn.Module, FusedModel] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class FusedLayer:
    """One decoder layer's tensors; qkv and gate_up are the fused storage the copy's projections are views of."""

    input_norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [(Hq + 2 Hkv) D, H]
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None  # [D] (Qwen3)
    k_norm: torch.Tensor | None
    o: torch.Tensor  # [H, Hq D]
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor  # [H]
    gate_up: torch.Tensor  # [2 I, H]
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor  # [H, I]
    down_bias: torch.Tensor | None


@dataclass(frozen=True)
class FusedModel:
    """What `forward` reads: the copy's tensors (never moved, refreshed in place) and the shapes."""

    layers: tuple[FusedLayer, ...]
    embed: torch.Tensor  # [V, H]
    norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H] (the embedding itself when tied)
    inv_freq: torch.Tensor  # [D / 2] fp32 rotary frequencies
    rope_scaling: float  # transformers' attention_scaling (1.0 but for yarn-like types)
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    scaling: float  # the attention's score scale


@dataclass
class KvCache:
    """Keys and values per layer, [R, H_kv, L, D] each, allocated once per decoder bucket."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @classmethod
    def allocate(cls, model: FusedModel, rows: int, length: int, device: torch.device) -> KvCache:
        shape = (rows, model.kv_heads, length, model.head_dim)
        dtype = model.embed.dtype
        make = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(2 * len(model.layers))]
        return cls(make[0::2], make[1::2])

    def reset(self) -> None:
        # Slots a rollout never writes are masked, but sdpa's prefill still multiplies them: keep them finite
        for tensor in (*self.keys, *self.values):
            tensor.zero_()

    def mark_dynamic_length(self) -> None:
        for tensor in (*self.keys, *self.values):
            torch._dynamo.maybe_mark_dynamic(tensor, 2)


def fused_blockers(model: torch.nn.Module) -> list[str]:
    """Why `forward` cannot decode this transformers model (empty: it can); a PEFT model is asked for its base."""
    config = model.config
    if config.model_type not in FUSED_MODEL_TYPES:
        return [f"model type {config.model_type} (fused decoding covers {', '.join(sorted(FUSED_MODEL_TYPES))})"]
    reasons = []
    if getattr(config, "hidden_act", "silu") != "silu":
        reasons.append(f"hidden_act {config.hidden_act}")
    rope = getattr(getattr(model.model, "rotary_emb", None), "rope_type", None)
    if rope not in STATIC_ROPE_TYPES:
        reasons.append(f"rotary type {rope}")
    if getattr(config, "pretraining_tp", 1) != 1:
        reasons.append("pretraining_tp > 1")
    return reasons


def _fuse(linears: list[torch.nn.Module]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One tensor holding the linears' weights one after the other (biases likewise); each linear's weight
    (and bias) becomes a view of it, with the values it had."""
    fused = []
    for attribute in ("weight", "bias"):
        parts = [getattr(linear, attribute) for linear in linears]
        if any(part is None for part in parts):
            fused.append(None)
            continue
        whole = torch.cat([part.detach() for part in parts])
        for linear, view in zip(linears, whole.split([part.shape[0] for part in parts])):
            setattr(linear, attribute, torch.nn.Parameter(view, requires_grad=False))
        fused.append(whole)
    return fused[0], fused[1]


def fuse_projections(plain: torch.nn.Module) -> FusedModel:
    """Give the plain copy `plain` fused q/k/v and gate/up storage (its projections become views of it) and
    register the view `forward` decodes with (`fused_model`)."""
    inner = plain.model
    layers = []
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv, qkv_bias = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
        gate_up, gate_up_bias = _fuse([mlp.gate_proj, mlp.up_proj])
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        layers.append(
            FusedLayer(
                input_norm=layer.input_layernorm.weight,
                qkv=qkv,
                qkv_bias=qkv_bias,
                q_norm=None if q_norm is None else q_norm.weight,
                k_norm=None if k_norm is None else k_norm.weight,
                o=attn.o_proj.weight,
                o_bias=attn.o_proj.bias,
                post_norm=layer.post_attention_layernorm.weight,
                gate_up=gate_up,
                gate_up_bias=gate_up_bias,
                down=mlp.down_proj.weight,
                down_bias=mlp.down_proj.bias,
            )
        )
    config, first = plain.config, inner.layers[0]
    fused = FusedModel(
        layers=tuple(layers),
        embed=inner.embed_tokens.weight,
        norm=inner.norm.weight,
        lm_head=plain.lm_head.weight,
        inv_freq=inner.rotary_emb.inv_freq,
        rope_scaling=float(inner.rotary_emb.attention_scaling),
        heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        head_dim=first.self_attn.head_dim,
        eps=first.input_layernorm.variance_epsilon,
        scaling=first.self_attn.scaling,
    )
    _FUSED[plain] = fused
    return fused


def fused_model(model: Any) -> FusedModel | None:
    """The fused view registered for `model` (a decode copy), or None: decode it with transformers' forward."""
    try:
        return _FUSED.get(model)
    except TypeError:  # not weakly referenceable: no copy of ours
        return None


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # transformers' RMSNorm: statistics in fp32, scaled back in the input's dtype
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, -1)
    return x * cos + torch.cat((-second, first), -1) * sin


def _silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, -1)
    return F.silu(gate) * up


class ElementwiseOps(NamedTuple):
    """The forward's elementwise pieces: plain torch, or each compiled into one kernel (`compiled_ops`)."""

    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    rope: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    silu_mul: Callable[[torch.Tensor], torch.Tensor]


PLAIN_OPS = ElementwiseOps(_rms_norm, _rope, _silu_mul)


@functools.cache
def compiled_ops() -> ElementwiseOps:
    """The elementwise pieces compiled for the eager prefill on CUDA, shapes symbolic so that one compile serves
    every pack (the captured step compiles as a whole and takes PLAIN_OPS). Eager, the prefill runs ~8 kernels
    per RMSNorm and ~10 per rotary embedding over every prompt token, each a full pass over the activations."""
    return ElementwiseOps(*(torch.compile(fn, dynamic=True) for fn in PLAIN_OPS))


def _rotary(model: FusedModel, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [R, 1, c, D] in the model's dtype for rotary positions [R, c]."""
    freqs = positions[..., None].float() * model.inv_freq.float()  # [R, c, D/2]
    angles = torch.cat((freqs, freqs), -1)
    cos = (angles.cos() * model.rope_scaling).to(dtype)[:, None]
    sin = (angles.sin() * model.rope_scaling).to(dtype)[:, None]
    return cos, sin


# attend(layer index, q, k, v) with q/k/v [R, heads, c, D] after the rotary embedding -> [R, c, Hq, D]; it also
# writes k and v to the cache
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _decoder_layers(
    model: FusedModel, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend, ops: ElementwiseOps
) -> torch.Tensor:
    """Every decoder layer over hidden [R, c, H]; the hidden states after the last."""
    rows, columns, _ = hidden.shape
    dim = model.head_dim
    sizes = (model.heads * dim, model.kv_heads * dim, model.kv_heads * dim)
    for index, layer in enumerate(model.layers):
        x = ops.rms_norm(hidden, layer.input_norm, model.eps)
        q, k, v = F.linear(x, layer.qkv, layer.qkv_bias).split(sizes, -1)
        q, k, v = (t.view(rows, columns, -1, dim) for t in (q, k, v))
        if layer.q_norm is not None:
            q, k = ops.rms_norm(q, layer.q_norm, model.eps), ops.rms_norm(k, layer.k_norm, model.eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [R, heads, c, D]
        q, k = ops.rope(q, cos, sin), ops.rope(k, cos, sin)
        out = attend(index, q, k, v)
        hidden = hidden + F.linear(out.reshape(rows, columns, -1), layer.o, layer.o_bias)
        x = ops.rms_norm(hidden, layer.post_norm, model.eps)
        hidden = hidden + F.linear(
            ops.silu_mul(F.linear(x, layer.gate_up, layer.gate_up_bias)), layer.down, layer.down_bias
        )
    return hidden


def _logits(model: FusedModel, last: torch.Tensor, ops: ElementwiseOps) -> torch.Tensor:
    return F.linear(ops.rms_norm(last, model.norm, model.eps), model.lm_head)


def forward(
    model: FusedModel,
    cache: KvCache,
    ids: torch.Tensor,
    positions: torch.Tensor,
    allowed: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """Feed ids [R, c] at rotary positions [R, c], writing their keys/values to cache slots [c], each query
    attending to the cache slots allowed [R, c, L] (bool) allows; the logits [R, V] after the last column, in the
    model's dtype (the token choice reads them once; an fp32 copy would be 78 MB at 128 rows of Qwen3)."""
    mask = allowed[:, None]  # [R, 1, c, L]

    def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        keys, values = cache.keys[index], cache.values[index]
        keys.index_copy_(2, slots, k)
        values.index_copy_(2, slots, v)
        return folded_attention(None, q, keys, values, mask, scaling=model.scaling)[0]

    cos, sin = _rotary(model, positions, model.embed.dtype)
    hidden = _decoder_layers(model, F.embedding(ids, model.embed), cos, sin, attend, PLAIN_OPS)
    return _logits(model, hidden[:, -1], PLAIN_OPS)


def prefill_packed(
    model: FusedModel,
    cache: KvCache,
    ids: torch.Tensor,
    positions: torch.Tensor,
    rows: torch.Tensor,
    slots: torch.Tensor,
    packing: Packing,
    ops: ElementwiseOps = PLAIN_OPS,
) -> torch.Tensor:
    """The prompts of some rows with no padding: ids [T] laid end to end (`packing.bounds`, no row empty), token t
    at rotary position positions[t], its keys/values written to cache row rows[t], slot slots[t]; each token
    attends causally within its own row (`varlen_attention`: flash on CUDA in half precision). The logits
    [rows in the packing, V] after each row's last token, as `forward` over the padded prompts gives them."""
    tokens = ids.numel()
    # Each token's rows of the cache seen as [R * H_kv * L, D], one per key/value head: one row copy per (token,
    # head), where indexing [rows, :, slots] took torch's generic index kernel (~0.3 TB/s on the H200)
    length, dim = cache.keys[0].shape[2:]
    heads = torch.arange(model.kv_heads, device=ids.device)
    flat = (((rows * model.kv_heads)[:, None] + heads) * length + slots[:, None]).view(-1)  # [T * H_kv]

    def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = (t[0].transpose(0, 1) for t in (q, k, v))  # [T, heads, D]
        cache.keys[index].view(-1, dim).index_copy_(0, flat, k.reshape(-1, dim))
        cache.values[index].view(-1, dim).index_copy_(0, flat, v.reshape(-1, dim))
        return varlen_attention(q, k, v, packing, model.scaling)[None]  # [1, T, Hq, D]

    cos, sin = _rotary(model, positions.view(1, tokens), model.embed.dtype)
    hidden = _decoder_layers(model, F.embedding(ids.view(1, tokens), model.embed), cos, sin, attend, ops)
    last = packing.cu_seqlens[1:].long() - 1  # each row's last token (no host list: nothing waits for the device)
    return _logits(model, hidden[0, last], ops)
