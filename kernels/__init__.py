"""grpo_kernels: fused linear + GRPO loss kernels (Triton on CUDA, torch elsewhere)."""
