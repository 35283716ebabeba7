"""The reference loss math against TRL 1.16's own `GRPOTrainer._compute_loss`, run on a stand-in trainer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from grpo_kernels.reference import reference_grpo_loss, reference_logprobs

grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")


class _Accelerator:
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def trl_loss(inp, *, loss_type, level, beta, temperature, grad_accum, max_len, num_items):
    """TRL's loss and logged metrics, with the per-token log-probs taken from the fp64 reference."""
    logps, entropies = reference_logprobs(
        inp["hidden"], inp["weight"], inp["ids"], bias=inp["bias"], temperature=temperature
    )
    fake = SimpleNamespace(
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=beta,
        loss_type=loss_type,
        epsilon_low=0.2,
        epsilon_high=0.28,
        use_vllm=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=grad_accum,
        accelerator=_Accelerator(),
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        max_completion_length=max_len,
        _metrics={"train": {}},
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=grad_accum),
    )
    fake._metrics["train"] = __import__("collections").defaultdict(list)
    fake._get_per_token_logps_and_entropies = lambda *a, **k: (logps, entropies, None)
    inputs = {
        "prompt_ids": inp["ids"][:, :1],
        "prompt_mask": torch.ones_like(inp["ids"][:, :1]),
        "completion_ids": inp["ids"],
        "completion_mask": inp["mask"],
        "advantages": inp["adv"],
        "old_per_token_logps": inp["old"],
        "ref_per_token_logps": inp["ref"],
        "num_items_in_batch": torch.tensor(float(num_items)),
    }
    loss = grpo_trainer.GRPOTrainer._compute_loss(fake, None, inputs)
    return loss, {k: v[-1] for k, v in fake._metrics["train"].items()}


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_reference_equals_trl_compute_loss(make_inputs, loss_type, level):
    inp = make_inputs(B=5, T=6, V=29, off_policy=True, temperature=0.8)
    grad_accum, num_items = 3, 17.0
    # Shift whole sequences so that ratios clip on both sides at either level
    inp["old"] = inp["old"] + torch.tensor([-0.5, 0.0, 0.0, -0.5, 0.5], dtype=torch.float64).unsqueeze(1)
    expected, logged = trl_loss(
        inp,
        loss_type=loss_type,
        level=level,
        beta=0.05,
        temperature=0.8,
        grad_accum=grad_accum,
        max_len=9,
        num_items=num_items,
    )
    # The documented caller scaling: divide by grad_accum except for dapo, whose normaliser TRL rescales
    scale = 1.0 if loss_type == "dapo" else 1.0 / grad_accum
    loss, metrics = reference_grpo_loss(
        inp["hidden"],
        inp["weight"],
        inp["ids"],
        inp["mask"],
        inp["adv"],
        bias=inp["bias"],
        old_logps=inp["old"],
        ref_logps=inp["ref"],
        beta=0.05,
        epsilon_low=0.2,
        epsilon_high=0.28,
        loss_type=loss_type,
        temperature=0.8,
        max_completion_length=9,
        num_items_in_batch=num_items,
        importance_sampling_level=level,
    )
    torch.testing.assert_close(loss * scale, expected, rtol=1e-12, atol=1e-14)
    assert logged["clip_ratio/region_mean"] > 0, "inputs should clip"
    for ours, theirs in (
        ("kl", "kl"),
        ("entropy", "entropy"),
        ("clip_ratio_low", "clip_ratio/low_mean"),
        ("clip_ratio_high", "clip_ratio/high_mean"),
        ("clip_ratio_region", "clip_ratio/region_mean"),
    ):
        assert getattr(metrics, ours).item() == pytest.approx(logged[theirs], rel=1e-6, abs=1e-12), (
            ours
        )  # TRL counts in fp32
