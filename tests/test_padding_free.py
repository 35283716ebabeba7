"""grpo.padding_free: rows grouped by completion length, each group cut after its longest completion.

The grouping is optimal and rank-independent; scoring returns the padded path's log-probs; a training step
equals the padded one for every loss implementation and with LoRA, gradient checkpointing, activation
offload and loss sub-batches; the step record carries each phase's valid-token share.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from test_loss_phase import LORA, SLICED_TOL, TINY_PRESET, assert_same_steps, train

from grpo_tui.config.schema import Preset
from grpo_tui.runs.folder import RunDir
from grpo_tui.runs.metrics import TOKEN_PHASES, valid_share_key
from grpo_tui.train import assemble, loss_phase
from grpo_tui.train import length_groups as length_groups_module
from grpo_tui.train.length_groups import (
    TokenCounts,
    chunk_groups,
    completion_lengths,
    computed_positions,
    length_groups,
    share_fields,
)


@pytest.fixture(autouse=True)
def _grouped_at_any_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    # tiny-cpu's completions are 4 tokens: below the cap where grouping starts, which one test checks itself
    monkeypatch.setattr(length_groups_module, "GROUPED_MIN_CAP", 1)


# fp32 on the CPU: a group's forward sees the same real tokens at the same positions; only the sums over
# masked-out columns are shorter.
SCORE_TOL = 1e-6


# ---- the grouping ----------------------------------------------------------------------------------
def test_completion_lengths_end_at_the_last_real_column() -> None:
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1]])
    assert completion_lengths(mask) == [3, 1, 0, 3, 4]
    assert completion_lengths(torch.zeros((2, 0))) == [0, 0]


def test_length_groups_are_equal_sorted_runs_of_the_row_count() -> None:
    lengths = [7, 1, 3, 3, 9, 2, 2, 8, 5]
    # ceil(9 / 4) = 3 rows a group: the sizes depend on the row count alone, never on the lengths
    assert [g.rows for g in length_groups(lengths)] == [[4, 7, 0], [8, 2, 3], [5, 6, 1]]
    assert [g.width for g in length_groups(lengths)] == [9, 5, 2]
    assert [len(g.rows) for g in length_groups(lengths, 2)] == [2, 2, 2, 2, 1]  # a sub-batch bound below it


def test_the_group_count_is_the_presets_and_a_row_bound_still_splits() -> None:
    lengths = [7, 1, 3, 3, 9, 2, 2, 8, 5]
    assert length_groups(lengths, groups=1) == [length_groups_module.RowGroup([4, 7, 0, 8, 2, 3, 5, 6, 1], 9)]
    assert [len(g.rows) for g in length_groups(lengths, groups=2)] == [5, 4]  # ceil(9 / 2)
    assert [len(g.rows) for g in length_groups(lengths, 4, None, groups=1)] == [4, 4, 1]  # loss_sub_batch 4
    assert len(length_groups(lengths, groups=64)) == 9  # never more groups than rows


def test_below_the_grouped_cap_only_the_row_bound_splits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(length_groups_module, "GROUPED_MIN_CAP", 64)
    lengths = [7, 1, 3, 3, 9, 2, 2, 8, 5]
    assert length_groups(lengths, None, 63) == [length_groups_module.RowGroup([4, 7, 0, 8, 2, 3, 5, 6, 1], 9)]
    assert [len(g.rows) for g in length_groups(lengths, 4, 63)] == [4, 4, 1]
    assert length_groups(lengths, None, 64) == length_groups(lengths)  # from the cap on: four groups


def test_chunk_groups_keep_the_forward_count_and_size() -> None:
    lengths = [3, 9, 0, 5, 9, 1, 2]
    out = chunk_groups(lengths, 3)
    assert [g.rows for g in out] == [[1, 4, 3], [0, 6, 5], [2]]
    assert [g.width for g in out] == [9, 3, 1]  # an all-padding group still keeps one column
    assert computed_positions(10, out) == 3 * 19 + 3 * 13 + 1 * 11


def test_token_counts_merge_over_ranks_into_shares() -> None:
    counts = TokenCounts()
    counts.add("scoring", 30, 40)
    counts.add("scoring", 10, 40)
    counts.add_groups("loss", torch.ones(2, 3), torch.tensor([[1, 0], [1, 1]]), chunk_groups([1, 2], 2))
    mine = counts.take()
    assert mine == {"scoring": (40, 80), "loss": (9, 10)} and counts.take() == {}
    other = {"scoring": (20, 20), "generation": (0, 0)}
    fields = share_fields([mine, other])
    assert fields == {valid_share_key("scoring"): 0.6, valid_share_key("loss"): 0.9}  # generation computed nothing


# ---- scoring ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_trainer(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    data = tomllib.loads(TINY_PRESET.read_text())
    run = RunDir(tmp_path_factory.mktemp("padding-free") / "run")
    run.path.mkdir(parents=True)
    trainer = assemble.build_trainer(Preset.model_validate(data), run)
    trainer.model.eval()
    return trainer


def padded_batch(vocab: int, prompts: list[int], completions: list[int], seed: int = 0) -> tuple:
    """Prompts left-padded and completions right-padded, as TRL lays a rollout out."""
    gen = torch.Generator().manual_seed(seed)
    width, cap = max(prompts), max(completions)
    ids = torch.randint(3, vocab, (len(prompts), width + cap), generator=gen)
    mask = torch.zeros_like(ids)
    for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        mask[row, width - p : width + c] = 1
    return ids, mask, cap


def assert_same_scores(padded: tuple, other: tuple, real: torch.Tensor, tol: float) -> None:
    """Log-probs within tol where the completion is real; entropies (a few nats, outside the issue's bound, and
    fp32 rounds them at ~4e-7) within tol relative to their size."""
    (logps, entropies), (other_logps, other_entropies) = padded, other
    assert (logps[real] - other_logps[real]).abs().max().item() <= tol
    assert ((entropies[real] - other_entropies[real]).abs() / entropies[real].abs().clamp(min=1)).max().item() <= tol


@pytest.mark.parametrize("impl", ["chunked", "naive", "trl"])
def test_scoring_returns_the_padded_log_probs(tiny_trainer: Any, impl: str) -> None:
    trainer = tiny_trainer
    ids, mask, cap = padded_batch(trainer.model.config.vocab_size, [5, 2, 7, 3, 6, 4], [9, 1, 4, 0, 6, 2])
    out = {}
    with mock.patch.object(trainer, "loss_impl", impl), torch.no_grad():
        for padding_free in (False, True):
            with mock.patch.object(trainer, "padding_free", padding_free):
                trainer.token_counts.take()
                logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
                    trainer.model, ids, mask, cap, batch_size=2, compute_entropy=True
                )
                out[padding_free] = logps, entropies, trainer.token_counts.take()["scoring"]
    assert_same_scores(out[False][:2], out[True][:2], mask[:, -cap:].bool(), SCORE_TOL)
    # Same real tokens. Padded: three forwards of two rows at 7 + 9 columns. Grouped: completions 9, 6 | 4, 2 |
    # 1, 0, each pair cut after its longest.
    assert out[False][2] == (int(mask.sum()), 6 * 16)
    assert out[True][2] == (int(mask.sum()), 2 * (7 + 9) + 2 * (7 + 4) + 2 * (7 + 1))


# ---- the training step -----------------------------------------------------------------------------
@pytest.fixture
def groups_seen(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[int], int, int]]:
    """(rows, width, completion columns) of each loss slice."""
    seen: list[tuple[list[int], int, int]] = []
    real = loss_phase.group_inputs

    def spy(inputs: dict[str, Any], rows: Any, width: int) -> dict[str, Any]:
        seen.append((list(rows), width, inputs["completion_ids"].size(1)))
        return real(inputs, rows, width)

    monkeypatch.setattr(loss_phase, "group_inputs", spy)
    return seen


@pytest.mark.parametrize(
    ("impl", "loss_type", "extra"),
    [
        ("chunked", "grpo", {}),
        ("chunked", "dapo", {"importance_sampling_level": "sequence"}),
        ("naive", "bnpo", {"gradient_checkpointing": True}),
        ("trl", "dr_grpo", {}),
        ("chunked", "bnpo", {"peft": LORA, "gradient_checkpointing": True, "loss_sub_batch": 2}),
    ],
)
def test_step_equals_the_padded_step(
    tiny_model_path: Path, tmp_path: Path, groups_seen: list, impl: str, loss_type: str, extra: dict
) -> None:
    config = {"loss_type": loss_type, **extra}
    padded = train(tmp_path, "padded", impl, **config)
    groups_seen.clear()
    grouped = train(tmp_path, "grouped", impl, padding_free=True, **config)
    assert_same_steps(padded, grouped, SLICED_TOL)
    # Four length groups per micro-batch of 8 (pairs under loss_sub_batch 2), and some were cut short.
    assert len(groups_seen) == 2 * 4 and all(len(rows) <= extra.get("loss_sub_batch", 8) for rows, *_ in groups_seen)
    assert any(width < columns for _, width, columns in groups_seen)
    assert any(rows != sorted(rows) or len(rows) == 1 for rows, _, _ in groups_seen)
    loss, padded_loss = grouped.token_counts.take()["loss"], padded.token_counts.take()["loss"]
    assert loss[0] == padded_loss[0] and loss[1] < padded_loss[1]  # same real tokens, fewer computed


@pytest.mark.parametrize("peft", [None, LORA])
def test_one_length_group_gives_the_steps_of_four(
    tiny_model_path: Path, tmp_path: Path, groups_seen: list, peft: dict | None
) -> None:
    # grpo.length_groups = 1: one forward per micro-batch and per scoring batch, the same steps as four groups
    four = train(tmp_path, "four", "chunked", peft=peft, padding_free=True, length_groups=4)
    groups_seen.clear()
    one = train(tmp_path, "one", "chunked", peft=peft, padding_free=True, length_groups=1)
    assert_same_steps(four, one, SLICED_TOL)
    assert [len(rows) for rows, *_ in groups_seen] == [8, 8]  # the loss: one slice of each micro-batch of 8
    assert one.token_counts.take()["loss"][0] == four.token_counts.take()["loss"][0]


def test_the_loss_phase_holds_one_group_of_activations(tiny_model_path: Path, tmp_path: Path, monkeypatch) -> None:
    # Bytes autograd saves in each loss forward (each starts by cutting its inputs); scoring and decoding run
    # without autograd and save nothing. A forward's saved bytes are freed by its backward, before the next group.
    saved: dict[bool, list[int]] = {}
    cut = loss_phase.group_inputs
    for padding_free in (False, True):
        forwards = saved[padding_free] = []

        def spy(inputs: dict[str, Any], rows: Any, width: int, forwards: list[int] = forwards) -> dict[str, Any]:
            forwards.append(0)
            return cut(inputs, rows, width)

        def pack(tensor: torch.Tensor, forwards: list[int] = forwards) -> torch.Tensor:
            base = tensor if tensor._base is None else tensor._base
            if forwards and not (base.is_leaf and base.requires_grad):  # a parameter is kept anyway, not saved
                forwards[-1] += tensor.numel() * tensor.element_size()
            return tensor

        monkeypatch.setattr(loss_phase, "group_inputs", spy)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            train(tmp_path, f"saved-{padding_free}", "chunked", padding_free=padding_free)
    assert len(saved[False]) == 2 and len(saved[True]) == 2 * 4  # one forward per micro-batch, or four groups
    assert max(saved[True]) < max(saved[False]) / 2  # the loss phase's activation peak
    assert sum(saved[True]) < sum(saved[False])  # and fewer positions computed in all


def test_a_loss_that_cannot_be_sliced_is_cut_whole(
    tiny_model_path: Path, tmp_path: Path, groups_seen: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_of = assemble.grpo_config

    def entropy_quantile(preset: Preset, run: RunDir) -> Any:  # a GRPOConfig setting no preset field makes
        config = config_of(preset, run)
        config.top_entropy_quantile = 0.5
        return config

    monkeypatch.setattr(assemble, "grpo_config", entropy_quantile)
    padded = train(tmp_path, "padded", "trl")
    groups_seen.clear()
    grouped = train(tmp_path, "grouped", "trl", padding_free=True)
    assert grouped.top_entropy_quantile == 0.5
    assert_same_steps(padded, grouped, SLICED_TOL)
    assert [rows for rows, _, _ in groups_seen] == [list(range(8))] * 2


def test_step_records_carry_valid_shares(tiny_model_path: Path, tmp_path: Path) -> None:
    from test_trainer import make_run, run_steps

    shares = {}
    for padding_free in (False, True):
        # beta > 0: the reference log-probs make a scoring phase (tiny-cpu's own step has none)
        grpo = {"max_steps": 1, "beta": 0.1, "padding_free": padding_free}
        run = make_run(tmp_path, f"pf-{padding_free}", grpo=grpo)
        code, (step,), _ = run_steps(run)
        assert code == 0
        shares[padding_free] = {phase: step[valid_share_key(phase)] for phase in TOKEN_PHASES}
        assert all(0 < share <= 1 for share in shares[padding_free].values())
    # The rollouts are the same; scoring and the loss compute fewer padding positions.
    assert shares[True]["generation"] == shares[False]["generation"]
    assert shares[True]["scoring"] > shares[False]["scoring"]
    assert shares[True]["loss"] >= shares[False]["loss"]


# ---- FSDP2 -----------------------------------------------------------------------------------------
# Two CPU ranks with `fully_shard` called directly (accelerate runs DDP on the CPU): the loss phase's length
# groups on a sharded model, each rank with its own completion lengths, against the padded loss of an
# unsharded copy with its gradients averaged over the ranks, as FSDP reduces them.
FSDP_SCRIPT = r"""
import contextlib, json, os, sys, torch, torch.distributed as dist
from types import SimpleNamespace
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM
from grpo_kernels import fused_linear_grpo_loss
from grpo_tui.losses.chunked import add_hidden_states_forward, full_head_params, hidden_states, lm_head_of
from grpo_tui.train import loss_phase
from grpo_tui.train import length_groups
from grpo_tui.train.length_groups import TokenCounts

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
path, out = sys.argv[1], sys.argv[2]
length_groups.GROUPED_MIN_CAP = 1  # the completions here are 10 tokens

class Accelerator:
    num_processes, sync_gradients, device = world, True, torch.device("cpu")
    def backward(self, loss): loss.backward()
    def reduce(self, t, reduction="sum"): t = t.clone(); dist.all_reduce(t); return t
    @contextlib.contextmanager
    def no_sync(self, model):
        model.set_requires_gradient_sync(False)
        yield
        model.set_requires_gradient_sync(True)

class Loss:  # what TRL's compute_loss is to the mixin: one micro-batch's GRPO loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        width = inputs["completion_ids"].size(1)
        hidden = hidden_states(model, ids, mask, width, self.packs)
        weight, bias = full_head_params(lm_head_of(model))
        loss, _ = fused_linear_grpo_loss(hidden, weight, inputs["completion_ids"], inputs["completion_mask"],
                                         inputs["advantages"], bias=bias, loss_type="grpo", chunk_tokens=5)
        return loss

class Probe(loss_phase.LossPhaseMixin, Loss):
    loss_type, importance_sampling_level, top_entropy_quantile, max_completion_length = "grpo", "token", 1.0, 10
    _entropy_bonus_enabled = aux_loss_enabled = False
    def __init__(self, padding_free, packs=False):
        self.padding_free, self.packs, self.token_counts, self.accelerator = padding_free, packs, TokenCounts(), Accelerator()
        self.model, self._metrics = SimpleNamespace(training=True), {"train": {}}

models = [AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").float() for _ in range(3)]
for m in models:
    add_hidden_states_forward(m)
model, packed, ref = models
for sharded in (model, packed):
    for layer in sharded.model.layers:
        fully_shard(layer)
    fully_shard(sharded)

g = torch.Generator().manual_seed(100 + rank)  # each rank its own rows and lengths
B, P, T = 8, 5, 10
prompt_ids, completion_ids = torch.randint(3, 60, (B, P), generator=g), torch.randint(3, 60, (B, T), generator=g)
prompt_mask, completion_mask = torch.zeros(B, P, dtype=torch.long), torch.zeros(B, T, dtype=torch.long)
for row in range(B):
    prompt_mask[row, int(torch.randint(0, P, (1,), generator=g)) :] = 1
    completion_mask[row, : int(torch.randint(1, T + 1, (1,), generator=g))] = 1
completion_mask[rank, :] = 1  # one row at the cap
inputs = dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
              completion_mask=completion_mask, advantages=torch.randn(B, generator=g), num_items_in_batch=None)

grouped = Probe(padding_free=True)
seen = []
cut = loss_phase.group_inputs
loss_phase.group_inputs = lambda i, rows, width: seen.append((list(rows), width)) or cut(i, rows, width)
grouped.compute_loss(model, inputs).backward()  # the groups ran their backwards; this leaf reaches nothing
loss_phase.group_inputs = cut
Probe(padding_free=True, packs=True).compute_loss(packed, inputs).backward()  # each group packed
Probe(padding_free=False).compute_loss(ref, inputs).backward()
err = {"grouped": 0.0, "packed": 0.0}
for (name, p), pp, q in zip(model.named_parameters(), packed.parameters(), ref.parameters()):
    want = q.grad.clone()
    dist.all_reduce(want)
    for key, param in (("grouped", p), ("packed", pp)):
        err[key] = max(err[key], (param.grad.full_tensor() - want / world).abs().max().item())
json.dump({"groups": seen, "err": err}, open(f"{out}/rank{rank}.json", "w"))
dist.barrier()
os._exit(0)  # gloo's threads can abort in the interpreter's teardown on CPU
"""


@pytest.mark.slow
def test_fsdp2_length_groups_and_packing_give_the_padded_gradients(tiny_model_path: Path, tmp_path: Path) -> None:
    import json
    import subprocess

    from test_distributed_cpu import _errors
    from torchrun import loopback_env, torchrun

    script = tmp_path / "padding_free_fsdp.py"
    script.write_text(FSDP_SCRIPT)
    argv = [*torchrun(2), str(script), str(tiny_model_path), str(tmp_path)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=loopback_env(OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, _errors(proc.stderr)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in results:
        assert len(r["groups"]) == 4 and any(width < 10 for _, width in r["groups"])  # cut on every rank
        assert r["err"]["grouped"] <= 1e-5 and r["err"]["packed"] <= 1e-5
    assert results[0]["groups"] != results[1]["groups"]  # each rank grouped its own lengths


@pytest.mark.slow
def test_two_process_ddp_steps_equal_the_padded_ones(tiny_model_path: Path, tmp_path: Path) -> None:
    # A 64-token cap: length groups from there on (the tiny model ends most rows far sooner), beta > 0 for a
    # scoring phase. Each rank groups its own rows; the gathered per-sequence metrics must line up.
    from test_distributed_cpu import _accelerate_cpu, _errors
    from test_trainer import ABS, REL, make_run

    from grpo_tui.runs.metrics import read_records, step_records

    steps = {}
    for padding_free in (False, True):
        grpo = {"max_steps": 2, "max_completion_length": 64, "beta": 0.1, "padding_free": padding_free}
        run = make_run(tmp_path, f"ddp-{padding_free}", grpo=grpo, distributed={"num_processes": 2})
        proc = _accelerate_cpu(run.path)
        assert proc.returncode == 0, _errors(proc.stderr)
        steps[padding_free] = step_records(read_records(run.metrics))
    for a, b in zip(steps[False], steps[True], strict=True):
        for key in ("loss", "reward", "grad_norm", "kl"):
            assert b[key] == pytest.approx(a[key], rel=REL, abs=ABS), (a["step"], key)
        for phase in ("scoring", "loss"):
            assert b[valid_share_key(phase)] > a[valid_share_key(phase)]  # the groups cut padding on both ranks
