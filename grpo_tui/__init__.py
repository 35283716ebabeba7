"""grpo-tui: terminal dashboard and runner for GRPO fine-tuning."""

import importlib.util
import os
import sys

__version__ = "0.1.0"


def _demote_checkout_root() -> None:
    """Move sys.path entries that are this checkout's root to the end of sys.path.

    A checkout keeps grpo_kernels in a folder named `kernels/`. From the root, `python -m grpo_tui.train` (how
    accelerate starts a run) puts the root first on sys.path, and `import kernels` would then find that folder
    instead of Hugging Face's `kernels` package, which transformers (5.25 and later) imports: every run failed
    with "cannot import name 'CUDAProperties' from 'kernels'". After installed packages the root still serves
    what only it has, as the reward loader's working folder does.
    """
    spec = importlib.util.find_spec("grpo_kernels")
    folder = os.path.dirname(spec.origin) if spec is not None and spec.origin else ""
    if os.path.basename(folder) != "kernels":  # installed from a wheel: the folder is grpo_kernels/
        return
    root = os.path.realpath(os.path.dirname(folder))
    here = [p for p in sys.path if os.path.realpath(p or os.curdir) == root]
    if here:
        sys.path[:] = [p for p in sys.path if p not in here] + here


_demote_checkout_root()
