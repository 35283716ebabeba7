"""grpo_kernels: fused linear + GRPO loss kernels (Triton on CUDA, torch elsewhere)."""

from .functional import default_chunk_tokens, fused_linear_grpo_loss, selective_logprobs
from .loss_math import GrpoMetrics

__all__ = ["GrpoMetrics", "default_chunk_tokens", "fused_linear_grpo_loss", "selective_logprobs"]
