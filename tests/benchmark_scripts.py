"""The benchmark scripts under test: benchmarks/ is no package, so each is loaded from its file, once."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@functools.cache
def load_benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py as a module (e.g. "generation_bench")."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
