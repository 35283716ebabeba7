"""grpo.padding_free with our head on an sdpa model: each length group's rows packed into one sequence.

The packing keeps each row's real tokens at their padded positions and attention within the row; the hidden
states, scoring's log-probs and a training step equal the padded path's (with LoRA, gradient checkpointing,
activation offload and loss sub-batches); a model packing cannot run falls back to length groups alone, and
torch's variable-length attention is called with the keywords the installed release has.
"""

from __future__ import annotations

import inspect
import sys
import tomllib
import types
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from test_loss_phase import LORA, SLICED_TOL, TINY_PRESET, assert_same_steps, train
from test_padding_free import SCORE_TOL, assert_same_scores, padded_batch

from grpo_tui.config.schema import Preset
from grpo_tui.losses import packing
from grpo_tui.losses.packing import Packing, completion_hidden, pack, packing_refusal, varlen_attention
from grpo_tui.runs.folder import RunDir
from grpo_tui.runs.metrics import valid_share_key
from grpo_tui.train import assemble
from grpo_tui.train import length_groups as length_groups_module
from grpo_tui.train.length_groups import GROUPS, PACKED_GROUPS


@pytest.fixture(autouse=True)
def _grouped_at_any_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(length_groups_module, "GROUPED_MIN_CAP", 1)  # tiny-cpu's completions are 4 tokens


# ---- the layout ------------------------------------------------------------------------------------
def test_pack_keeps_real_tokens_at_their_padded_positions() -> None:
    ids = torch.tensor([[0, 0, 5, 6, 7, 0], [0, 8, 9, 1, 0, 0], [2, 3, 4, 5, 6, 7]])
    mask = (ids != 0).long()
    mask[2, 5] = 0  # a padded completion column holding a token id: the mask decides, not the id
    packed, positions, layout = pack(ids, mask)
    assert packed.tolist() == [[5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6]]
    assert positions.tolist() == [[2, 3, 4, 1, 2, 3, 0, 1, 2, 3, 4]]
    assert layout.bounds == (0, 3, 6, 11) and layout.cu_seqlens.tolist() == [0, 3, 6, 11] and layout.longest == 5
    assert layout.cu_seqlens.dtype == torch.int32


def test_completion_hidden_puts_each_state_back_and_zeros_padding() -> None:
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    packed = torch.arange(1, 9, dtype=torch.float32).view(1, 8, 1)  # the 8 real tokens' "hidden states"
    # Completion = the last 2 columns; the positions predicting them are columns 2 and 3.
    out = completion_hidden(packed, mask, 2)
    assert out[..., 0].tolist() == [[2.0, 3.0], [6.0, 7.0]]
    mask[0, 3] = 0  # row 0's completion ends before column 3: its state there is padding
    out = completion_hidden(torch.arange(1, 8, dtype=torch.float32).view(1, 7, 1), mask, 2)
    assert out[..., 0].tolist() == [[2.0, 0.0], [5.0, 6.0]]


def test_per_row_attention_equals_masked_attention() -> None:
    gen = torch.Generator().manual_seed(0)
    lengths, heads, kv_heads, dim = [3, 1, 5], 4, 2, 8
    q = torch.randn(sum(lengths), heads, dim, generator=gen)
    k, v = (torch.randn(sum(lengths), kv_heads, dim, generator=gen) for _ in range(2))
    bounds = (0, 3, 4, 9)
    out = varlen_attention(q, k, v, Packing(bounds, torch.tensor(bounds, dtype=torch.int32), 5), 0.3)
    # The same rows padded to 5 and attended under a causal mask that also hides the padding
    for row, (start, stop) in enumerate(zip(bounds, bounds[1:], strict=False)):
        n = stop - start
        padded = [F.pad(t[start:stop], (0, 0, 0, 0, 0, 5 - n)).transpose(0, 1) for t in (q, k, v)]
        allowed = torch.ones(5, 5).tril().bool() & (torch.arange(5) < n)
        want = F.scaled_dot_product_attention(*padded, attn_mask=allowed, scale=0.3, enable_gqa=True)
        assert torch.allclose(out[start:stop], want.transpose(0, 1)[:n], atol=1e-6), row


@pytest.mark.parametrize(
    ("signature", "want"),
    [
        ("window_size=(-1, -1), scale=None, enable_gqa=False", {"window_size": (-1, 0), "scale": 0.25, "gqa": True}),
        ("is_causal=False", {"is_causal": True, "repeated": True}),
    ],
)
def test_flash_call_reads_the_installed_signature(
    monkeypatch: pytest.MonkeyPatch, signature: str, want: dict[str, Any]
) -> None:
    seen: dict[str, Any] = {}
    source = f"def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, {signature}): pass"
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # a stand-in with the release's keywords

    def fake(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, **options):
        seen.update(options, kv_heads=key.size(1), max_q=max_q)
        return query

    fake.__signature__ = inspect.signature(namespace["varlen_attn"])
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", types.SimpleNamespace(varlen_attn=fake))
    call = packing._flash_call()
    q, kv = torch.zeros(6, 4, 16), torch.zeros(6, 2, 16)
    bounds = (0, 2, 6)
    call(q, kv, kv, Packing(bounds, torch.tensor(bounds, dtype=torch.int32), 4), 0.25)
    assert seen["max_q"] == 4
    if "window_size" in want:
        assert seen["window_size"] == (-1, 0) and seen["scale"] == 0.25 and seen["enable_gqa"] is True
        assert seen["kv_heads"] == 2  # grouped heads left to the kernel
    else:
        assert seen["is_causal"] is True and "scale" not in seen and seen["kv_heads"] == 4  # repeated for it


def test_flash_call_is_none_without_varlen_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", None)  # an import of it fails
    assert packing._flash_call() is None


def test_only_full_attention_under_sdpa_packs() -> None:
    config = types.SimpleNamespace(_attn_implementation="sdpa", layer_types=["full_attention"] * 2)
    assert packing_refusal(config) is None
    assert "eager" in packing_refusal(types.SimpleNamespace(_attn_implementation="eager"))
    config.layer_types = ["full_attention", "sliding_attention"]
    assert "sliding_attention" in packing_refusal(config)


# ---- scoring and the step --------------------------------------------------------------------------
def sdpa_trainer(root: Path, attn: str = "sdpa") -> Any:
    data = tomllib.loads(TINY_PRESET.read_text())
    data["model"]["attn_implementation"] = attn
    run = RunDir(root / f"packing-{attn}")
    run.path.mkdir(parents=True)
    return assemble.build_trainer(Preset.model_validate(data), run)


@pytest.fixture
def packs_seen(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """Rows of each packed forward, and whether it was a loss forward (autograd on) or scoring."""
    seen: list[tuple[int, bool]] = []
    real = packing.pack

    def spy(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        seen.append((input_ids.size(0), torch.is_grad_enabled()))
        return real(input_ids, attention_mask)

    monkeypatch.setattr(packing, "pack", spy)
    return seen


# fp64 pins the method (the same sums, any order); fp32 the bound, where only the order of the sums differs
# (per-row attention blocks its keys by the row's length, the padded path by the padded one).
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, SCORE_TOL), (torch.float64, 1e-12)])
def test_packed_scoring_returns_the_padded_log_probs(
    tmp_path: Path, tiny_model_path: Path, packs_seen: list, dtype: torch.dtype, tol: float
) -> None:
    trainer = sdpa_trainer(tmp_path)
    trainer.model.eval().to(dtype)
    ids, mask, cap = padded_batch(trainer.model.config.vocab_size, [5, 2, 7, 3, 6, 4], [9, 1, 4, 0, 6, 2])
    out = {}
    with torch.no_grad():
        for padding_free in (False, True):
            with mock.patch.object(trainer, "padding_free", padding_free):
                assert trainer.packs is padding_free
                trainer.token_counts.take()
                logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
                    trainer.model, ids, mask, cap, batch_size=2, compute_entropy=True
                )
                out[padding_free] = logps, entropies, trainer.token_counts.take()["scoring"]
    real = mask[:, -cap:].bool()
    assert_same_scores(out[False][:2], out[True][:2], real, tol)
    assert (out[True][0][~real] == 0).all()
    assert packs_seen == [(2, False)] * 3  # three length groups of two rows, each one packed forward
    assert out[True][2] == (int(mask.sum()),) * 2  # the real tokens only were computed


def test_a_model_packing_cannot_run_keeps_length_groups(tmp_path: Path, tiny_model_path: Path) -> None:
    trainer = sdpa_trainer(tmp_path, attn="eager")
    with mock.patch.object(trainer, "padding_free", True):
        assert not trainer.packs and "eager" in trainer.packing_refusal
        assert trainer.group_count == GROUPS  # padded groups: more of them compute less padding


def test_packed_forwards_run_one_group_unless_the_preset_asks(tmp_path: Path, tiny_model_path: Path) -> None:
    trainer = sdpa_trainer(tmp_path)
    with mock.patch.object(trainer, "padding_free", True):
        assert trainer.packs and trainer.group_count == PACKED_GROUPS == 1
        trainer.loss_impl = "trl"  # the live switch to TRL's head: padded groups again
        assert not trainer.packs and trainer.group_count == GROUPS
        trainer.loss_impl = "chunked"
        with mock.patch.object(trainer, "groups_setting", 3):
            assert trainer.group_count == 3  # grpo.length_groups set: as set, packed or not


@pytest.mark.parametrize(
    ("loss_type", "extra"),
    [
        ("grpo", {"length_groups": 4}),
        ("dapo", {"peft": LORA, "gradient_checkpointing": True, "loss_sub_batch": 2}),
        ("bnpo", {"activation_offload": True, "importance_sampling_level": "sequence"}),
    ],
)
def test_packed_step_equals_the_padded_step(
    tiny_model_path: Path, tmp_path: Path, packs_seen: list, loss_type: str, extra: dict
) -> None:
    config = {"loss_type": loss_type, **extra}
    padded = train(tmp_path, "padded", "chunked", attn="sdpa", **config)
    assert packs_seen == []
    packed = train(tmp_path, "packed", "chunked", attn="sdpa", padding_free=True, **config)
    assert packed.packs
    assert_same_steps(padded, packed, SLICED_TOL)
    # Two micro-batches of 8 rows, each one packed forward unless asked for more (four groups; pairs under
    # loss_sub_batch 2), and scoring's forwards (reference and old log-probs) packed too.
    per_micro_batch = 8 // extra["loss_sub_batch"] if "loss_sub_batch" in extra else extra.get("length_groups", 1)
    loss_packs = [rows for rows, grad in packs_seen if grad]
    assert len(loss_packs) == 2 * per_micro_batch and sum(loss_packs) == 2 * 8 and len(packs_seen) > len(loss_packs)
    loss = packed.token_counts.take()["loss"]
    assert loss[0] == loss[1] == padded.token_counts.take()["loss"][0]  # computed the real tokens, all of them


def test_packed_step_records_say_every_computed_token_was_real(tiny_model_path: Path, tmp_path: Path) -> None:
    from test_trainer import make_run, run_steps

    grpo = {"max_steps": 1, "beta": 0.1, "padding_free": True}
    run = make_run(tmp_path, "packed", grpo=grpo, model={"attn_implementation": "sdpa"}, loss={"impl": "chunked"})
    code, (step,), _ = run_steps(run)
    assert code == 0
    assert step[valid_share_key("scoring")] == step[valid_share_key("loss")] == 1.0
