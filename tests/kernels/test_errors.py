"""Bad inputs raise a one-line ValueError that names the problem."""

from __future__ import annotations

import pytest
import torch

from grpo_kernels import fused_linear_grpo_loss, selective_logprobs


def _args(B=2, T=3, H=8, V=11):
    return dict(
        hidden=torch.randn(B, T, H),
        weight=torch.randn(V, H),
        completion_ids=torch.randint(0, V, (B, T)),
        completion_mask=torch.ones(B, T),
        advantages=torch.randn(B),
    )


CASES = [
    ("weight", lambda a: a.update(weight=torch.randn(11, 9)), "weight must have shape"),
    ("dtype", lambda a: a.update(weight=a["weight"].double()), "weight dtype"),
    ("ids shape", lambda a: a.update(completion_ids=torch.zeros(2, 4, dtype=torch.long)), "ids must have shape"),
    ("ids float", lambda a: a.update(completion_ids=torch.zeros(2, 3)), "integer"),
    ("ids range", lambda a: a.update(completion_ids=torch.full((2, 3), 11)), "ids must lie in"),
    ("mask", lambda a: a.update(completion_mask=torch.ones(2, 4)), "completion_mask must have shape"),
    ("advantages", lambda a: a.update(advantages=torch.randn(2, 3)), "advantages must have shape"),
    ("bias", lambda a: a.update(bias=torch.randn(10)), "bias must have shape"),
    (
        "hidden 2d",
        lambda a: a.update(hidden=torch.randn(6, 8), completion_ids=torch.zeros(6, dtype=torch.long)),
        "(B, T, H)",
    ),
    ("beta", lambda a: a.update(beta=0.1), "ref_logps is required"),
    ("loss_type", lambda a: a.update(loss_type="ppo"), "loss_type must be one of"),
    ("dr_grpo", lambda a: a.update(loss_type="dr_grpo"), "max_completion_length"),
    ("level", lambda a: a.update(importance_sampling_level="seq"), "importance_sampling_level"),
    ("temperature", lambda a: a.update(temperature=0.0), "temperature must be > 0"),
    ("old shape", lambda a: a.update(old_logps=torch.randn(2, 4)), "old_logps must have shape"),
    ("chunk", lambda a: a.update(chunk_tokens=0), "chunk_tokens"),
]


@pytest.mark.parametrize("name,mutate,message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_one_line_value_error(name, mutate, message):
    args = _args()
    mutate(args)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        fused_linear_grpo_loss(**args)
    assert "\n" not in str(err.value)


def test_selective_logprobs_rejects_bad_shapes():
    with pytest.raises(ValueError, match="ids must have shape"):
        selective_logprobs(torch.randn(2, 3, 8), torch.randn(11, 8), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        selective_logprobs(
            torch.randn(2, 3, 8), torch.randn(11, 8), torch.zeros(2, 3, dtype=torch.long), temperature=-1.0
        )
