"""The loss phase's memory options: activation offload and loss sub-batches.

grpo.activation_offload  TRL's activation offloading (`trl.models.get_act_offloading_ctx_manager`, as
                         TRL's SFTTrainer uses it) around the loss forward and its backward: the tensors
                         autograd saves (the checkpointed layer inputs with gradient checkpointing) wait in
                         host memory, copied out and back asynchronously (pinned memory, a copy stream).
grpo.loss_sub_batch      the loss forward + backward over slices of N sequences of the micro-batch, each
                         slice's loss scaled so that the slice losses sum to the unsliced loss, and the
                         logged metrics merged back into the one entry per micro-step TRL logs.

grpo.padding_free        the slices are rows grouped by completion length (length_groups.py), each cut
                         after its longest completion: the backbone no longer computes the padding.

Slicing or offload makes `compute_loss` run the backward itself (one per slice, inside the offload context)
and hand the Trainer a detached total as a leaf: the Trainer's own backward on it reaches no parameter.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from grpo_tui.train.length_groups import RowGroup, completion_lengths, forward_count, length_groups

# How TRL 1.16's `_compute_loss` normalises each loss type, hence each slice's share of the loss.
PER_SEQUENCE_LOSSES = ("grpo", "sapo", "luspo", "dr_grpo")  # / number of sequences: share n_slice / n
PER_TOKEN_LOSSES = ("bnpo",)  # / tokens under the mask: share tokens_slice / tokens
FIXED_NORM_LOSSES = ("dapo", "cispo", "vespo")  # / num_items_in_batch, the same for every slice: share 1

# How each metric TRL (and the chunked path) logs per micro-step merges over slices.
TOKEN_MEANS = ("kl", "entropy")  # masked means over tokens
RATIO_MEANS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "cispo_clip_ratio")
SEQUENCE_MEANS = ("vespo/phi_seq_mean",)
MINIMA = ("clip_ratio/low_min",)
MAXIMA = ("clip_ratio/high_max",)


def offload_context(model: torch.nn.Module, device: torch.device) -> contextlib.AbstractContextManager:
    """TRL's activation offloading manager for `model`; no context where no accelerator is there (also
    a CUDA build of torch on a machine without a GPU).

    Without an accelerator the activations already live in host memory (and TRL's manager cannot be
    built). Pinned memory and a copy stream exist on CUDA only.
    """
    if torch.accelerator.current_accelerator(check_available=True) is None:
        return contextlib.nullcontext()
    from trl.models import get_act_offloading_ctx_manager

    on_cuda = device.type == "cuda"
    return get_act_offloading_ctx_manager(model, use_pin_memory=on_cuda, use_streams=on_cuda)


def slice_bounds(batch: int, size: int | None) -> list[tuple[int, int]]:
    """[start, stop) of each slice of `size` sequences (one slice when `size` is None or covers the batch)."""
    size = batch if size is None else max(1, min(size, batch))
    return [(start, min(start + size, batch)) for start in range(0, batch, size)]


# Inputs over the prompt's columns (never cut) and over the completion's (cut to a group's width).
PROMPT_KEYS = ("prompt_ids", "prompt_mask")
TOKEN_KEYS = (
    "completion_ids",
    "completion_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "tool_mask",
    "importance_sampling_ratio",
    "advantages",
)


def slice_inputs(inputs: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    """Rows [start, stop) of every per-sequence tensor; scalars (num_items_in_batch) and None as they are."""
    return group_inputs(inputs, range(start, stop), inputs["completion_ids"].size(1))


def group_inputs(inputs: dict[str, Any], rows: Sequence[int], width: int) -> dict[str, Any]:
    """Rows `rows` of every per-sequence tensor, the per-token ones cut to the first `width` completion columns;
    scalars (num_items_in_batch) and None as they are."""
    batch, columns = inputs["completion_ids"].shape
    if inputs.get("pixel_values") is not None:
        raise ValueError("grpo.loss_sub_batch: multimodal inputs cannot be sliced; unset grpo.loss_sub_batch")
    contiguous = list(rows) == list(range(rows[0], rows[0] + len(rows))) if len(rows) else True
    index = None
    out: dict[str, Any] = {}
    for key, value in inputs.items():
        if value is None or (isinstance(value, torch.Tensor) and value.dim() == 0):
            out[key] = value
        elif isinstance(value, torch.Tensor) and value.size(0) == batch:
            if contiguous:
                part = value[rows[0] : rows[0] + len(rows)] if len(rows) else value[:0]
            else:
                index = torch.tensor(list(rows), device=value.device) if index is None else index.to(value.device)
                part = value.index_select(0, index)
            if width < columns and key in TOKEN_KEYS and part.dim() >= 2 and part.size(1) == columns:
                part = part[:, :width]
            out[key] = part
        else:
            raise ValueError(f"grpo.loss_sub_batch: cannot slice input {key!r}; unset grpo.loss_sub_batch")
    return out


def cuttable(inputs: dict[str, Any]) -> bool:
    """Whether every input over the completion's columns is one `group_inputs` knows to cut."""
    columns = inputs["completion_ids"].size(1)
    return all(
        key in TOKEN_KEYS
        or key in PROMPT_KEYS
        or not isinstance(v, torch.Tensor)
        or v.dim() < 2
        or v.size(1) != columns
        for key, v in inputs.items()
    )


def loss_mask(inputs: dict[str, Any]) -> torch.Tensor:
    """The mask TRL's loss normalises by: completion tokens, minus tool output where there is any."""
    mask = inputs["completion_mask"]
    return mask if "tool_mask" not in inputs else mask * inputs["tool_mask"]


def slice_share(loss_type: str, inputs: dict[str, Any], rows: Sequence[int]) -> torch.Tensor | float:
    """The factor that turns the loss over `rows` into its part of the whole micro-batch's loss."""
    if loss_type in FIXED_NORM_LOSSES:
        return 1.0
    if loss_type in PER_SEQUENCE_LOSSES:
        return len(rows) / inputs["completion_ids"].size(0)
    if loss_type in PER_TOKEN_LOSSES:
        mask = loss_mask(inputs)
        # clamp as TRL does: an all-padding slice has loss 0 whatever its share
        return mask[list(rows)].sum().clamp(min=1.0) / mask.sum().clamp(min=1.0)
    raise ValueError(f"grpo.loss_sub_batch: loss_type {loss_type!r} has no known normaliser")


def merge_metric(
    name: str, values: list[float], tokens: list[float], sequences: list[float], ratio_weights: list[float]
) -> float:
    """One slice-merged value of metric `name`, as the unsliced micro-batch would have logged it.

    Means are re-weighted by the (all-process) tokens or sequences behind each slice's value, and TRL's
    clamp(min=1) of an empty count kept: an empty slice logged 0 and weighs 0.
    """
    weights = None
    if name in TOKEN_MEANS:
        weights = tokens
    elif name in RATIO_MEANS:
        weights = ratio_weights
    elif name in SEQUENCE_MEANS:
        weights = sequences
    if weights is not None:
        return sum(v * w for v, w in zip(values, weights, strict=True)) / max(sum(weights), 1.0)
    finite = [v for v in values if not math.isnan(v)]
    if name in MINIMA:
        return min(finite) if finite else math.nan
    if name in MAXIMA:
        return max(finite) if finite else math.nan
    raise RuntimeError(f"loss sub-batches: no rule to merge metric {name!r} over slices")


def slicing_problems(trainer: Any) -> list[str]:
    """What in the trainer's configuration keeps a loss over slices from equalling the unsliced one."""
    refusals = {
        "top_entropy_quantile": trainer.top_entropy_quantile < 1.0,  # a quantile over the whole micro-batch
        "entropy_coef": trainer._entropy_bonus_enabled,  # its own normaliser beside the policy loss's
        "router aux loss": trainer.aux_loss_enabled,
        "loss_type": trainer.loss_type not in PER_SEQUENCE_LOSSES + PER_TOKEN_LOSSES + FIXED_NORM_LOSSES,
    }
    return [name for name, refused in refusals.items() if refused]


class LossPhaseMixin:
    """`compute_loss` for GrpoTuiTrainer under grpo.loss_sub_batch / activation_offload / padding_free."""

    loss_sub_batch: int | None = None
    activation_offload: bool = False
    padding_free: bool = False
    groups_setting: int | None = None  # grpo.length_groups (None: by whether the forwards run packed)
    packs: bool = False  # each slice's forward runs packed (the trainer's property)
    offload_manager: contextlib.AbstractContextManager | None = None

    def loss_phase_refusal(self) -> str | None:
        """Why grpo.loss_sub_batch cannot be exact with this configuration (one line), or None."""
        bad = slicing_problems(self) if self.loss_sub_batch is not None else []
        if bad:
            return f"grpo.loss_sub_batch: cannot slice the loss exactly with {', '.join(bad)}; unset it"
        return None

    def loss_groups(self, inputs: dict[str, Any]) -> list[RowGroup]:
        """The slices of this micro-batch's loss: rows in the micro-batch's order under grpo.loss_sub_batch, or,
        with grpo.padding_free, rows grouped by completion length (one group, cut after the micro-batch's longest
        completion, where slicing would not be exact)."""
        batch, columns = inputs["completion_ids"].shape
        if not self.padding_free or not cuttable(inputs) or inputs.get("pixel_values") is not None:
            return [RowGroup(list(range(a, b)), columns) for a, b in slice_bounds(batch, self.loss_sub_batch)]
        lengths = completion_lengths(inputs["completion_mask"])
        if slicing_problems(self):
            return [RowGroup(list(range(batch)), max(1, max(lengths, default=1)))]
        return self.row_groups(lengths, self.loss_sub_batch)

    def row_groups(self, lengths: list[int], max_rows: int | None) -> list[RowGroup]:
        """The length groups of a scoring batch or loss micro-batch with these completion lengths: `group_count`
        of them, none over `max_rows` rows (`length_groups.length_groups`)."""
        return length_groups(lengths, max_rows, self.max_completion_length, self.group_count)

    @property
    def group_count(self) -> int:
        """Forwards per scoring batch and loss micro-batch (`length_groups.forward_count`); read per batch, since the
        live loss switch can change whether they run packed."""
        return forward_count(self.groups_setting, self.packs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not torch.is_grad_enabled():
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        groups = self.loss_groups(inputs)
        self.token_counts.add_groups("loss", inputs["prompt_mask"], inputs["completion_mask"], groups, self.packs)
        if len(groups) == 1 and not self.activation_offload:
            # One slice: the Trainer's own backward, on the micro-batch cut after its longest completion.
            part = group_inputs(inputs, groups[0].rows, groups[0].width)
            return super().compute_loss(model, part, return_outputs, num_items_in_batch)
        mode = "train" if self.model.training else "eval"
        logged = {key: len(values) for key, values in self._metrics[mode].items()}
        total = torch.zeros((), device=self.accelerator.device)
        for index, group in enumerate(groups):
            part = group_inputs(inputs, group.rows, group.width)
            share = slice_share(self.loss_type, inputs, group.rows)
            with self._slice_sync(model, last=index == len(groups) - 1), self._offloading(model):
                loss = super().compute_loss(model, part, return_outputs, num_items_in_batch) * share
                self.accelerator.backward(loss)
            total += loss.detach()
        if len(groups) > 1:
            self._merge_slice_metrics(self._metrics[mode], logged, inputs, groups)
        # The backward is done: the Trainer's own `accelerator.backward` on this leaf reaches no parameter.
        return total.requires_grad_()

    def _merge_slice_metrics(
        self, metrics: dict[str, list[float]], logged: dict[str, int], inputs: dict[str, Any], groups: list[RowGroup]
    ) -> None:
        """Replace the one entry per slice that each metric got since `logged` by the micro-batch's value."""
        tokens, sequences = self._slice_counts(inputs, groups)
        ratio_weights = sequences if self.importance_sampling_level == "sequence" else tokens
        for key, values in metrics.items():
            new = values[logged.get(key, 0) :]
            if not new:
                continue
            if len(new) != len(groups):
                raise RuntimeError(f"loss sub-batches: metric {key!r} logged {len(new)} times for {len(groups)} slices")
            values[logged.get(key, 0) :] = [merge_metric(key, new, tokens, sequences, ratio_weights)]

    def _slice_counts(self, inputs: dict[str, Any], groups: list[RowGroup]) -> tuple[list[float], list[float]]:
        """Tokens and sequences behind each slice, summed over processes (the weights of TRL's global means)."""
        mask = loss_mask(inputs).float()
        local = torch.stack(
            [torch.stack([mask[g.rows].sum(), mask.new_tensor(float(len(g.rows)))]) for g in groups]
        )  # [S, 2]
        counts = self.accelerator.reduce(local, reduction="sum").tolist()
        return [c[0] for c in counts], [c[1] for c in counts]

    def _slice_sync(self, model: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager:
        # Gradients of all but the last slice only accumulate; the last slice's backward reduces them all,
        # once. Outside a sync micro-step the Trainer's own no_sync already holds (FSDP2's no_sync would
        # re-enable sync on leaving if nested).
        if last or not self.accelerator.sync_gradients:
            return contextlib.nullcontext()
        return self.accelerator.no_sync(model)

    @contextlib.contextmanager
    def _offloading(self, model: torch.nn.Module) -> Iterator[None]:
        if not self.activation_offload:
            yield
            return
        if self.offload_manager is None:  # built on first use, on the model the Trainer trains (wrapped)
            self.offload_manager = offload_context(model, self.accelerator.device)
        with self.offload_manager:
            yield
