"""The bench with the pass swapped (call T): python bench_variant.py VARIANT <bench args>.

VARIANT: default | rawfirst (the block's load before the target chain, same geometry) | b{BLOCK}w{WARPS}
(the committed kernel at another geometry) | rawfirst_b{BLOCK}w{WARPS}."""
import re
import sys

from grpo_kernels import probs

from pass_variants import _rawfirst_kernel

variant = sys.argv[1]
if variant.startswith("rawfirst"):
    probs._probs_kernel = _rawfirst_kernel
    variant = variant[len("rawfirst"):].lstrip("_")
m = re.fullmatch(r"b(\d+)w(\d+)", variant)
if m:
    probs.PROBS_BLOCK, probs.PROBS_WARPS = int(m.group(1)), int(m.group(2))
elif variant not in ("", "default"):
    raise SystemExit(f"unknown variant {sys.argv[1]}")
print("variant", sys.argv[1], probs.PROBS_BLOCK, probs.PROBS_WARPS, probs._probs_kernel.fn.__name__ if hasattr(probs._probs_kernel, "fn") else probs._probs_kernel, flush=True)
from grpo_kernels.bench import main  # noqa: E402

sys.exit(main(sys.argv[2:]))
