"""The import rule: each stage imports only the stages below it in the flow, with no circle.

    tasks -> config -> runs -> launch | train -> dashboard -> tools -> cli

Read from the source with `ast` (every import, also those inside functions), so a late import cannot
dodge the rule. `ALLOWED` is the one place the allowed edges are named.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "grpo_tui"

# stage -> the stages it may import (besides itself). `grpo_kernels` is the kernels package.
ALLOWED: dict[str, set[str]] = {
    "tasks": set(),  # built-in data sources, rewards and models: what a preset can name
    "config": {"tasks"},  # schema, store, --set overrides, pre-launch checks
    "runs": {"config"},  # the run-folder contract: paths, metrics, completions, status, failure wording
    "launch": {"config", "runs"},  # accelerate argv, the supervisor, SLURM
    "train": {"tasks", "config", "runs", "grpo_kernels"},  # the trainer under accelerate
    "dashboard": {"config", "runs", "launch"},  # view models and the Textual app (starts runs via launch)
    "tools": {"tasks", "config", "runs", "launch", "train", "dashboard", "grpo_kernels"},
    "cli": {"tasks", "config", "runs", "launch", "train", "dashboard", "tools"},
    "__init__": set(),
}


def stage_of(module: str) -> str | None:
    """`grpo_tui.runs.metrics` -> `runs`; `grpo_kernels.x` -> `grpo_kernels`; other packages -> None."""
    parts = module.split(".")
    if parts[0] == "grpo_kernels":
        return "grpo_kernels"
    if parts[0] != "grpo_tui":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every grpo_tui/grpo_kernels import in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from grpo_tui.x import y` may import the submodule y: count both.
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            found.append((name, node.lineno, id(node) in top))
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for target, _line, _top in imports_of(path):
            if target in modules and target != name:
                edges[name].add(target)
    return edges


def test_every_module_belongs_to_a_named_stage() -> None:
    stray = [module_name(p) for p in PACKAGE.rglob("*.py") if stage_of(module_name(p)) not in ALLOWED]
    assert stray == [], f"modules outside the stages named in ALLOWED: {stray}"


def test_no_import_against_the_flow() -> None:
    bad = []
    for path in PACKAGE.rglob("*.py"):
        here = stage_of(module_name(path))
        for target, line, _top in imports_of(path):
            there = stage_of(target)
            if there is None or there == here:
                continue
            if there not in ALLOWED[here]:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {here} imports {target} ({there})")
    assert bad == [], "imports against the flow:\n" + "\n".join(bad)


def test_no_import_circle() -> None:
    edges = graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                circles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert circles == [], "import circles:\n" + "\n".join(circles)


def test_no_private_name_imported_across_modules() -> None:
    bad = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("grpo_"):
                bad += [
                    f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_")
                ]
    assert bad == [], "private names imported across modules:\n" + "\n".join(bad)


def test_no_module_over_400_lines() -> None:
    """Split by responsibility before a module grows past ~400 lines (CONVENTIONS.md)."""
    roots = (PACKAGE, PACKAGE.parent / "kernels")
    long = [
        f"{p.relative_to(PACKAGE.parent)}: {n}"
        for root in roots
        for p in sorted(root.rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400
    ]
    assert long == [], "modules over 400 lines (split by responsibility):\n" + "\n".join(long)


@pytest.mark.parametrize("module", ["grpo_tui.dashboard.app", "grpo_tui.cli"])
def test_start_up_path_does_not_import_torch_or_training(module: str) -> None:
    """The app and the command line must start fast: torch, transformers and the trainer load only when used."""
    code = (
        f"import sys, {module}; "
        "heavy = sorted(m for m in ('torch', 'transformers', 'trl', 'grpo_tui.train') if m in sys.modules); "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"importing {module} loaded {out}"


def test_screens_do_not_reach_into_the_app_untyped() -> None:
    """Screens talk to the app through messages and typed accessors, not `# type: ignore[attr-defined]`."""
    found = [
        f"{p.relative_to(PACKAGE.parent)}:{i}"
        for p in PACKAGE.rglob("*.py")
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "type: ignore[attr-defined]" in line
    ]
    assert found == [], "untyped reaches into other objects:\n" + "\n".join(found)
