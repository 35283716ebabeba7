"""Every place grpo-tui leans on TRL beyond its public API, in one table, checked against the installed TRL.

`GrpoTuiTrainer` overrides private `GRPOTrainer` methods and reads private state; the run folder's
completions come from TRL's `_logs`; the kernel benchmark calls TRL's chunked log-prob function
positionally. None of that is a promise TRL makes, so pyproject pins TRL to the tested minor and this
test names what changed when the pin moves: a renamed parameter would otherwise surface as a wrong
keyword deep inside a training step, or, worse, as a positional argument landing in the wrong slot.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import textwrap
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import pytest

trl = pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[1]
TRAINER = "grpo_tui/train/trainer.py"


class Coupling(NamedTuple):
    """One name of TRL's that our code depends on.

    kind:
        signature  a callable: `expected` is its parameter names, in order (we override or call it);
        attribute  instance state set as `self.<name> = ...` by the class or a base (`expected`: the keys
                   we read when the value is a dict literal);
        field      a `GRPOConfig` field we read from `self.args`;
        name       a module-level name we import.
    """

    kind: str
    expected: tuple[str, ...]
    used_by: str


def _sig(params: str, used_by: str = TRAINER) -> Coupling:
    """A callable's parameters, written as in its `def` line without defaults: "self, model, inputs"."""
    return Coupling("signature", tuple(params.split(", ")), used_by)


def _attr(*keys: str, used_by: str = TRAINER) -> Coupling:
    return Coupling("attribute", keys, used_by)


# The contract: dotted name in trl -> what we rely on, and the file to update when it changes.
TRL_CONTRACT: dict[str, Coupling] = {
    # Overridden GRPOTrainer methods (our overrides call super() positionally with these parameters)
    "trl.GRPOTrainer._generate": _sig("self, prompts"),
    "trl.GRPOTrainer._generate_single_turn": _sig(
        "self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images"
    ),
    "trl.GRPOTrainer._generate_and_score_completions": _sig(
        "self, inputs", used_by=f"{TRAINER} and benchmarks/rollout_memory.py"
    ),
    # Ours names the first eight and passes the multimodal rest on as **multimodal
    "trl.GRPOTrainer._get_per_token_logps_and_entropies": _sig(
        "self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, "
        "pixel_values, image_grid_thw, num_images, pixel_attention_mask, spatial_shapes, num_tiles, image_sizes, "
        "token_type_ids, mm_token_type_ids, image_position_ids",
        used_by=f"{TRAINER} and grpo_tui/tools/parity_check.py",
    ),
    "trl.GRPOTrainer._compute_loss": _sig("self, model, inputs"),
    "trl.GRPOTrainer.training_step": _sig("self, model, inputs, num_items_in_batch"),
    "trl.GRPOTrainer.log": _sig("self, logs, start_time"),
    # Private methods we call
    "trl.GRPOTrainer._prepare_inputs": _sig("self, generation_batch", used_by="grpo_tui/tools/parity_check.py"),
    # Private state we read or write
    "trl.GRPOTrainer._metrics": _attr("train", "eval"),  # the chunked loss appends TRL's loss metrics
    "trl.GRPOTrainer._logs": _attr(  # the last generation batch, written to completions.jsonl
        "prompt", "completion", "rewards", "advantages", used_by="grpo_tui/train/session.py"
    ),
    "trl.GRPOTrainer._entropy_bonus_enabled": _attr(),  # chunked refuses it; naive keeps entropy's graph
    # a vision-language model cannot use the graph decoder (it falls back to generate)
    "trl.GRPOTrainer._is_vlm": _attr(used_by="grpo_tui/train/rollouts.py"),
    "trl.GRPOTrainer.current_gradient_accumulation_steps": _attr(  # set by Trainer's loop; the normalisers read it
        used_by=f"{TRAINER} and grpo_tui/tools/parity_check.py"
    ),
    # Public state the chunked path reads where TRL's _compute_loss does (a rename would break it mid-step)
    **{
        f"trl.GRPOTrainer.{name}": _attr()
        for name in (
            "use_vllm use_transformers_continuous_batching loss_type top_entropy_quantile off_policy_mask_threshold "
            "aux_loss_enabled beta epsilon_low epsilon_high temperature max_completion_length "
            "importance_sampling_level ref_model"
        ).split()
    },
    "trl.GRPOConfig.delta": Coupling("field", (), TRAINER),
    "trl.GRPOConfig.use_bias_correction_kl": Coupling("field", (), f"{TRAINER} and grpo_tui/train/config_map.py"),
    "trl.GRPOConfig.steps_per_generation": Coupling("field", (), TRAINER),
    # grpo.generation_backend = vllm: TRL's own vLLM path, colocated
    "trl.GRPOConfig.use_vllm": Coupling("field", (), "grpo_tui/train/config_map.py"),
    "trl.GRPOConfig.vllm_mode": Coupling("field", (), "grpo_tui/train/config_map.py"),
    # Helpers outside TRL's top-level API
    "trl.trainer.utils.nanmax": _sig("tensor"),
    "trl.trainer.utils.nanmin": _sig("tensor"),
    # GRPOTrainer patches model.forward with it; add_hidden_states_forward wraps that forward, and the naive
    # path relies on its default (fused_lm_head=False) being the model's own logits.
    "trl.trainer.utils.add_fused_lm_head": _sig("model, temperature, cast_lm_head_to_fp32, outputs"),
    "trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE": Coupling("name", (), "benchmarks/kernel/bench_providers.py"),
    # benchmarks/kernel/bench_providers.py calls ChunkedLogProbFunction.apply positionally, as TRL's fused head does
    "trl.kernels.ChunkedLogProbFunction.forward": _sig(
        "ctx, hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping, logit_scale, outputs",
        used_by="benchmarks/kernel/bench_providers.py",
    ),
}

# Where couplings can hide: every private TRL name these files use must be in TRL_CONTRACT.
SCANNED = [*sorted((ROOT / "grpo_tui").rglob("*.py")), *sorted((ROOT / "kernels" / "grpo_kernels").glob("*.py"))]
SCANNED += sorted(p for p in (ROOT / "benchmarks").rglob("*.py") if "results" not in p.parts)


def _version() -> str:
    return ".".join(trl.__version__.split(".")[:2])


def _params(func: Any) -> tuple[str, ...]:
    prefix = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return tuple(prefix.get(p.kind, "") + p.name for p in inspect.signature(func).parameters.values())


def _resolve(dotted: str) -> Any:
    """The object a dotted name points at: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)  # AttributeError: the name is gone
        return obj
    raise ImportError(dotted)


@cache
def _self_assignments(cls: type) -> dict[str, ast.expr]:
    """`self.<name> = value` anywhere in `cls`'s own source: name -> value (the first one found)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    found: dict[str, ast.expr] = {}
    for node in ast.walk(tree):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                found.setdefault(target.attr, node.value)
    return found


def _check(name: str, coupling: Coupling) -> str | None:
    """None when the installed TRL keeps `coupling`, else the one-line failure."""
    owner_name, _, attr = name.rpartition(".")
    changed = f"trl {_version()} changed {name.removeprefix('trl.')}"
    update = f"update {coupling.used_by}"
    if coupling.kind == "attribute":
        owner = _resolve(owner_name)
        bases = [c for c in owner.__mro__ if c is not object]
        value = next((_self_assignments(c)[attr] for c in bases if attr in _self_assignments(c)), None)
        if value is None:
            return f"{changed}: no longer sets self.{attr} in {', '.join(c.__name__ for c in bases)}; {update}"
        if coupling.expected:
            keys = [k.value for k in value.keys if isinstance(k, ast.Constant)] if isinstance(value, ast.Dict) else []
            missing = [k for k in coupling.expected if k not in keys]
            if missing:
                return f"{changed}: self.{attr} no longer has keys {missing} (has {keys}); {update}"
        return None
    if coupling.kind == "field":
        fields = {f.name for f in dataclasses.fields(_resolve(owner_name))}
        return None if attr in fields else f"{changed}: GRPOConfig has no field {attr!r}; {update}"
    try:
        obj = _resolve(name)
    except (AttributeError, ImportError):
        return f"trl {_version()} removed {name.removeprefix('trl.')}; {update}"
    if coupling.kind == "signature":
        got = _params(obj)
        if got != coupling.expected:
            return f"{changed}: expected ({', '.join(coupling.expected)}), got ({', '.join(got)}); {update}"
    return None


@pytest.mark.parametrize("name", list(TRL_CONTRACT))
def test_trl_keeps_the_contract(name: str) -> None:
    problem = _check(name, TRL_CONTRACT[name])
    assert problem is None, problem


def test_trl_is_pinned_to_the_tested_minor() -> None:
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = next(d for d in deps if d.replace(" ", "").startswith("trl"))
    major, minor = (int(x) for x in trl.__version__.split(".")[:2])
    assert pin.replace(" ", "") == f"trl>={major}.{minor},<{major}.{minor + 1}", (
        f"pyproject pins {pin!r} but trl {trl.__version__} is installed: the contract above was checked "
        f"against {major}.{minor}; pin that minor"
    )


def _overrides() -> list[str]:
    from grpo_tui.train.trainer import GrpoTuiTrainer

    return sorted(
        name
        for name, value in vars(GrpoTuiTrainer).items()
        if callable(value) and hasattr(trl.GRPOTrainer, name) and not (name.startswith("__") and name != "__init__")
    )


@pytest.mark.parametrize("name", _overrides())
def test_overrides_keep_trl_parameters(name: str) -> None:
    """Our override takes TRL's parameters in TRL's order; what it does not name, `**kwargs` passes on."""
    from grpo_tui.train.trainer import GrpoTuiTrainer

    ours, theirs = _params(getattr(GrpoTuiTrainer, name)), _params(getattr(trl.GRPOTrainer, name))
    positional = tuple(p for p in ours if not p.startswith("*"))
    named = positional[: next((i for i, p in enumerate(ours) if p.startswith("*")), len(ours))]
    if any(p.startswith("**") for p in ours):
        ok = theirs[: len(named)] == named
    else:
        ok = named == theirs
    # Keyword-only extras (loss_impl, ...) must not shadow one of TRL's parameters
    extras = [p for p in positional[len(named) :] if p in theirs]
    assert ok and not extras, (
        f"GrpoTuiTrainer.{name} no longer fits trl {_version()}: ours takes ({', '.join(ours)}), "
        f"TRL's takes ({', '.join(theirs)}); update {TRAINER}"
    )
    if not name.startswith("__"):
        assert f"trl.GRPOTrainer.{name}" in TRL_CONTRACT, f"GrpoTuiTrainer overrides {name}: list it in TRL_CONTRACT"


def _private_uses(path: Path) -> list[tuple[int, str]]:
    """(line, dotted trl name) for each private TRL name `path` imports or reaches through a trainer."""
    from grpo_tui.train.trainer import GrpoTuiTrainer

    ours = set(vars(GrpoTuiTrainer))
    tree = ast.parse(path.read_text(encoding="utf-8"))
    # `self` is a GRPOTrainer only in the subclass's module; elsewhere a trainer is named `trainer`
    receivers = {"self", "trainer"} if path.name == "trainer.py" and "train" in path.parts else {"trainer"}
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "trl":
            uses += [(node.lineno, f"{node.module}.{a.name}") for a in node.names if a.name.startswith("_")]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in receivers
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.attr not in ours
        ):
            uses.append((node.lineno, f"trl.GRPOTrainer.{node.attr}"))
    return uses


def test_every_private_trl_name_is_in_the_contract() -> None:
    missing = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in SCANNED
        for line, name in _private_uses(path)
        if name not in TRL_CONTRACT
    ]
    assert missing == [], "private TRL names used but not in TRL_CONTRACT:\n" + "\n".join(missing)
