"""`import kernels` is always Hugging Face's package, never a folder of this checkout.

transformers (5.25 and later) imports Hugging Face's `kernels`. From a checkout's root, `python -m grpo_tui.train`
(how accelerate starts every run) puts the root first on sys.path, so the checkout's `kernels/` folder must not
be an importable package: it holds no `__init__.py`, only `grpo_kernels/`, and nothing reorders sys.path.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import json, sys
before = list(sys.path)
import {package}
import importlib.util
spec = importlib.util.find_spec("kernels")
print(json.dumps({"moved": sys.path != before, "kernels": spec.origin if spec else None}))
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


def test_the_kernels_folder_is_no_package() -> None:
    assert not (ROOT / "kernels" / "__init__.py").exists()
    assert (ROOT / "kernels" / "grpo_kernels" / "__init__.py").is_file()


@pytest.mark.parametrize("package", ["grpo_tui", "grpo_kernels"])  # the two that `python -m` starts from
def test_import_kernels_from_the_checkout_root_is_never_ours(package: str) -> None:
    probe = _probe(package)
    assert probe["moved"] is False  # importing our packages leaves sys.path alone
    found = probe["kernels"]
    assert found is None or not Path(found).resolve().is_relative_to(ROOT / "kernels"), found
    try:
        importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        assert found is None  # at most the folder as a namespace, which holds no module
    else:  # Hugging Face's package is installed (transformers >= 5.25 requires it): it is what `kernels` finds
        assert found is not None
