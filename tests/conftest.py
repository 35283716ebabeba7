"""Suite-wide setup that must happen before any test module imports grpo_kernels.

Triton decides at decoration time whether a kernel is compiled or interpreted, so TRITON_INTERPRET is set
here, at the root, before collection imports anything: off CUDA the kernel tests run the Triton kernels
under the interpreter (on CPU tensors, only where a test pins that backend; everything else uses the
torch twins). On a CUDA machine the compiled kernels run and tests/gpu checks them.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
