"""Model folders a run leaves: RUN/model/ (its product) and export targets, written whole or not at all.

A model folder is written into a hidden temporary folder beside its target and renamed into place, so a
reader (or a crash) never meets half of one under the target's name. RUN/model/grpo-tui.json notes what
the folder holds (full weights or a LoRA adapter, and the base model an adapter needs).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The note written beside the weights in every model folder grpo-tui writes.
MODEL_INFO = "grpo-tui.json"
# What a model folder holds.
KIND_FULL, KIND_LORA = "full", "lora"


class ModelFolderError(Exception):
    """A model folder that cannot be written or read (one user-facing line)."""


def folder_bytes(path: Path) -> int:
    """Bytes of the regular files under `path` (links not followed; 0 when missing)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(root, name))
                total += info.st_size
    return total


def human_bytes(size: int) -> str:
    """`size` in B, KiB, MiB, GiB or TiB with three significant digits."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} TiB"


@contextlib.contextmanager
def staged_folder(target: Path, replace: bool = False) -> Iterator[Path]:
    """A temporary folder beside `target`, renamed to `target` when the block ends without an exception.

    On an exception (a full disk, an interrupted save) the temporary folder is removed and `target` is
    left as it was. `replace` swaps an existing `target` out (removed after the rename); otherwise an
    existing non-empty `target` is an error, an empty one is replaced.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        _move_into_place(tmp, target, replace)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _move_into_place(tmp: Path, target: Path, replace: bool) -> None:
    old = None
    if target.exists() or target.is_symlink():
        if target.is_dir() and not target.is_symlink() and not any(target.iterdir()):
            target.rmdir()
        elif replace:
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
        else:
            raise ModelFolderError(f"{target}: exists and is not empty")
    os.replace(tmp, target)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def write_info(folder: Path, info: dict[str, Any]) -> None:
    (Path(folder) / MODEL_INFO).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")


def read_info(folder: Path) -> dict[str, Any]:
    """The folder's grpo-tui.json ({} when missing or unreadable: a folder written by other tools)."""
    from grpo_tui.runs.folder import read_json

    return read_json(Path(folder) / MODEL_INFO) or {}


def describe(folder: Path) -> str:
    """One line: what a model folder holds and how to load it."""
    info = read_info(folder)
    size = human_bytes(folder_bytes(folder))
    if info.get("kind") == KIND_LORA:
        return f"{folder} ({size}, LoRA adapter on {info.get('base_model', '?')})"
    return f"{folder} ({size})"


def load_command(folder: Path) -> str:
    """The one Python line that loads the model folder (peft for an adapter, transformers otherwise)."""
    quoted = json.dumps(str(folder))
    if read_info(folder).get("kind") == KIND_LORA:
        return f"from peft import AutoPeftModelForCausalLM; model = AutoPeftModelForCausalLM.from_pretrained({quoted})"
    return f"from transformers import AutoModelForCausalLM; model = AutoModelForCausalLM.from_pretrained({quoted})"
