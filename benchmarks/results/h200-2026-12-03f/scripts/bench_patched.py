"""The padded bench with the pass's geometry patched (call L): python bench_patched.py BLOCK WARPS <bench args>."""
import sys

from grpo_kernels import probs

probs.PROBS_BLOCK, probs.PROBS_WARPS = int(sys.argv[1]), int(sys.argv[2])
from grpo_kernels.bench import main  # noqa: E402

sys.exit(main(sys.argv[3:]))
