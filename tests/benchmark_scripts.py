"""The benchmark scripts under test: benchmarks/ is no package, so each script's folder goes on sys.path (as
running the script does) and the script is imported by its file name, once."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py as a module (e.g. "generation_bench", "kernel/bench"); its siblings import alike."""
    path = BENCHMARKS / f"{name}.py"
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(path.stem)
