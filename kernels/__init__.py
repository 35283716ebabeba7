"""grpo_kernels: fused linear + GRPO loss kernels (Triton on CUDA, torch elsewhere)."""

import os as _os
import sys as _sys

# In a checkout this package is the folder `kernels/`. From the checkout's root, `python -m grpo_kernels.bench`
# puts the root first on sys.path, where that folder stands in for Hugging Face's `kernels` package, which
# transformers (5.25 and later) imports. The root goes behind the installed packages (grpo_tui does the same).
if _os.path.basename(_os.path.dirname(_os.path.abspath(__file__))) == "kernels":
    _root = _os.path.realpath(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))
    _at_root = [p for p in _sys.path if _os.path.realpath(p or _os.curdir) == _root]
    _sys.path[:] = [p for p in _sys.path if p not in _at_root] + _at_root

from .functional import default_chunk_tokens, fused_linear_grpo_loss, selective_logprobs
from .loss_math import GrpoMetrics

__all__ = ["GrpoMetrics", "default_chunk_tokens", "fused_linear_grpo_loss", "selective_logprobs"]
