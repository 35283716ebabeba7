"""The checkout's `kernels/` folder (imported as grpo_kernels) must not stand in for Hugging Face's `kernels`.

From a checkout's root, `python -m grpo_tui.train` (how accelerate starts every run) puts the root first on
sys.path; transformers 5.25 imports Hugging Face's `kernels` package, and found our folder instead: every run
failed with "cannot import name 'CUDAProperties' from 'kernels'". Importing grpo_tui or grpo_kernels moves the
root behind the installed packages.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import json, os, sys
import {package}
import importlib.util
spec = importlib.util.find_spec("kernels")
print(json.dumps({"path": sys.path, "kernels": spec.origin if spec else None}))
"""


def _probe(package: str) -> dict:
    # `python -c` from the root puts "" (the root) first on sys.path, as `python -m` does
    out = subprocess.run(
        [sys.executable, "-c", PROBE.replace("{package}", package)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _maps_to_this_checkout() -> bool:
    spec = importlib.util.find_spec("grpo_kernels")
    return spec is not None and spec.origin is not None and Path(spec.origin).parent == ROOT / "kernels"


@pytest.mark.skipif(not _maps_to_this_checkout(), reason="grpo_kernels is not this checkout's kernels/ folder")
@pytest.mark.parametrize("package", ["grpo_tui", "grpo_kernels"])  # the two that `python -m` starts from
def test_checkout_root_goes_behind_installed_packages(package):
    probe = _probe(package)
    entries = [os.path.realpath(p or ROOT) for p in probe["path"]]
    root_at = [i for i, p in enumerate(entries) if p == str(ROOT)]
    site_at = [i for i, p in enumerate(entries) if p.endswith("site-packages")]
    assert root_at and site_at, probe["path"]
    assert min(root_at) > max(site_at), probe["path"]  # the root still serves, last
    try:
        importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        assert probe["kernels"] == str(ROOT / "kernels" / "__init__.py")  # nothing else is called kernels
    else:  # Hugging Face's package is installed (transformers >= 5.25 requires it): it is what `kernels` finds
        assert probe["kernels"] and Path(probe["kernels"]).parent != ROOT / "kernels", probe["kernels"]
