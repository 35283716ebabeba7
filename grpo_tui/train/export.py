"""`grpo-tui export RUN --to DIR`: a run's model (or one checkpoint's) as a standalone Hugging Face folder.

    grpo-tui export RUN --to DIR [--merged] [--dtype bf16|fp16|fp32] [--checkpoint N] [--force]

Full weights are loaded and saved again (in --dtype when given), which also proves they load. A LoRA
adapter is copied (its weights cast to --dtype when given) and still needs its base model and peft; with
--merged the adapter is merged into its base (peft's `merge_and_unload`, in fp32, then cast), so the
result loads with transformers alone. DIR is written whole or not at all (a temporary folder beside it,
then a rename). An existing non-empty DIR is refused; --force replaces it, but only when it is a model
folder itself (config.json, adapter_config.json or grpo-tui.json in it), never an arbitrary folder.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any, NamedTuple

from grpo_tui.runs.folder import RunDir
from grpo_tui.runs.model_dir import (
    KIND_FULL,
    KIND_LORA,
    MODEL_INFO,
    describe,
    load_command,
    read_info,
    staged_folder,
    write_info,
)
from grpo_tui.userinput import clip

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
ADAPTER_CONFIG = "adapter_config.json"
# Files that mark a folder as a model folder --force may replace.
MODEL_MARKERS = ("config.json", ADAPTER_CONFIG, MODEL_INFO)


# Characters of a refusal line (paths in it escaped onto one printable line by `clip`).
MESSAGE_LIMIT = 600


class OneLineParser(argparse.ArgumentParser):
    """argparse that refuses bad flags in one line (`prog: message`), without the usage block."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: {clip(message, MESSAGE_LIMIT)} (see {self.prog} --help)\n")


class ExportError(ValueError):
    """An export that cannot be done (one user-facing line)."""


class ExportRequest(NamedTuple):
    run: Path
    to: Path
    merged: bool = False
    dtype: str | None = None  # a key of DTYPES
    checkpoint: int | None = None
    force: bool = False


def source_folder(run: RunDir, checkpoint: int | None) -> Path:
    """The model folder to export: RUN/model/, or RUN/checkpoints/checkpoint-N/."""
    if not run.is_run:
        raise ExportError(f"{run.path}: not a run folder (no run.json or metrics.jsonl)")
    if checkpoint is None:
        if not run.model.is_dir():
            raise ExportError(f"{run.path}: no model/ (saved when a run finishes or stops); try --checkpoint N")
        return run.model
    folder = run.checkpoints / f"checkpoint-{checkpoint}"
    if not folder.is_dir():
        found = sorted(p.name.removeprefix("checkpoint-") for p in run.checkpoints.glob("checkpoint-*"))
        raise ExportError(f"{folder}: no such checkpoint; saved steps: {', '.join(found) or 'none'}")
    if not any((folder / name).exists() for name in ("config.json", ADAPTER_CONFIG)):
        raise ExportError(f"{folder}: holds no Hugging Face model (a sharded FSDP checkpoint?); export model/ instead")
    return folder


def check_target(target: Path, source: Path, force: bool) -> None:
    """Refuse a target that would lose data: non-empty without --force, not a model folder, or the source."""
    target, source = target.resolve(), source.resolve()
    if target == source or source.is_relative_to(target) or target.is_relative_to(source):
        raise ExportError(f"{target}: is (or holds, or is inside) the folder exported from")
    if target.exists() and not target.is_dir():
        raise ExportError(f"{target}: exists and is not a folder")
    if target.is_dir() and any(target.iterdir()):
        if not force:
            raise ExportError(f"{target}: exists and is not empty (--force replaces a model folder)")
        if not any((target / name).exists() for name in MODEL_MARKERS):
            raise ExportError(
                f"{target}: not a model folder (no {', '.join(MODEL_MARKERS)}); --force will not replace it"
            )


def export(request: ExportRequest) -> Path:
    """Write the export; returns the folder written."""
    run = RunDir(Path(request.run).resolve())
    source = source_folder(run, request.checkpoint)
    target = Path(request.to).resolve()
    check_target(target, source, request.force)
    lora = (source / ADAPTER_CONFIG).is_file()
    info = {
        "run": run.name,
        "source": str(source),
        "step": read_info(source).get("step", request.checkpoint),
        "dtype": DTYPES.get(request.dtype or "", "as trained"),
        "merged": bool(request.merged and lora),
    }
    with staged_folder(target, replace=request.force) as tmp:
        if lora and request.merged:
            base = _merge_lora(source, tmp, request.dtype)
            write_info(tmp, {**info, "kind": KIND_FULL, "base_model": base})
        elif lora:
            base = _copy_adapter(source, tmp, request.dtype)
            write_info(tmp, {**info, "kind": KIND_LORA, "base_model": base})
        else:
            _resave_full(source, tmp, request.dtype)
            write_info(tmp, {**info, "kind": KIND_FULL})
    return target


def _torch_dtype(name: str | None) -> Any:
    import torch

    return getattr(torch, DTYPES[name]) if name else None


def _loading(source: Path, what: str, exc: BaseException) -> ExportError:
    from grpo_tui.runs.failures import exception_line

    return ExportError(f"{source}: cannot load the {what} (missing or corrupt files?): {exception_line(exc)[:200]}")


def _resave_full(source: Path, tmp: Path, dtype: str | None) -> None:
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=_torch_dtype(dtype) or "auto")
    except Exception as exc:  # whatever the folder's files hold: one line, never a traceback
        raise _loading(source, "model", exc) from exc
    model.save_pretrained(tmp)
    _save_tokenizer(source, tmp)


def base_of_adapter(source: Path) -> str:
    """The base model an adapter folder names (grpo-tui.json's resolved path first, then adapter_config.json)."""
    base = read_info(source).get("base_path")
    if not base:
        try:
            config = json.loads((source / ADAPTER_CONFIG).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise ExportError(f"{source / ADAPTER_CONFIG}: unreadable ({exc.__class__.__name__})") from exc
        base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not isinstance(base, str) or not base:
        raise ExportError(f"{source / ADAPTER_CONFIG}: names no base model (base_model_name_or_path)")
    return base


def _copy_adapter(source: Path, tmp: Path, dtype: str | None) -> str:
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save_file

    base = base_of_adapter(source)
    for path in source.iterdir():
        if path.is_file() and path.name != MODEL_INFO:
            shutil.copyfile(path, tmp / path.name)
    weights = tmp / "adapter_model.safetensors"
    try:
        tensors = load_file(weights)  # read even without --dtype: a corrupt adapter is refused here, not later
    except (OSError, SafetensorError) as exc:
        raise _loading(source, "adapter", exc) from exc
    if dtype:
        save_file({k: v.to(_torch_dtype(dtype)).contiguous() for k, v in tensors.items()}, weights)
    return base


def _merge_lora(source: Path, tmp: Path, dtype: str | None) -> str:
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    base = base_of_adapter(source)
    try:
        # Merged in fp32 (W + B·A·scale rounded once), then cast to --dtype, or to the base's own dtype.
        own_dtype = getattr(AutoConfig.from_pretrained(base), "dtype", None)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        model = PeftModel.from_pretrained(model, source)
    except Exception as exc:  # whatever the folder's files hold: one line, never a traceback
        raise _loading(source, "adapter and its base model", exc) from exc
    merged = model.merge_and_unload()
    if isinstance(own_dtype, str):
        own_dtype = getattr(torch, own_dtype, None)
    target_dtype = _torch_dtype(dtype) or (own_dtype if isinstance(own_dtype, torch.dtype) else torch.float32)
    merged.to(target_dtype).save_pretrained(tmp)
    _save_tokenizer(source, tmp, fallback=base)
    return base


def _save_tokenizer(source: Path, tmp: Path, fallback: str | None = None) -> None:
    from transformers import AutoTokenizer

    for where in (source, fallback):
        if where is None:
            continue
        try:
            AutoTokenizer.from_pretrained(where).save_pretrained(tmp)
            return
        except Exception:  # a folder without a usable tokenizer: the weights are exported without one
            continue


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="grpo-tui export", description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the run folder")
    parser.add_argument("--to", type=Path, required=True, metavar="DIR", help="folder to write (new or empty)")
    parser.add_argument("--merged", action="store_true", help="merge a LoRA adapter into its base model")
    parser.add_argument("--dtype", choices=tuple(DTYPES), help="cast the weights (default: as trained)")
    parser.add_argument("--checkpoint", type=_step, metavar="N", help="export checkpoint-N instead of model/")
    parser.add_argument("--force", action="store_true", help="replace an existing model folder at DIR")
    return parser


def _step(text: str) -> int:
    if not text.isdigit() or len(text) > 12:
        raise argparse.ArgumentTypeError(f"got {text[:20]!r}; allowed: a step number")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the command prints what it wrote; no bars on stderr
    request = ExportRequest(args.run, args.to, args.merged, args.dtype, args.checkpoint, args.force)
    try:
        written = export(request)
    except ExportError as exc:
        print(f"grpo-tui export: {clip(str(exc), MESSAGE_LIMIT)}", file=sys.stderr)
        return 2
    print(f"wrote {describe(written)}")
    for path in sorted(written.iterdir()):
        print(f"  {path.name}")
    print(f"load it with: {load_command(written)}")
    return 0
