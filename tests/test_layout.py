"""The import rule: each stage imports only the stages below it in the flow, with no circle.

    userinput -> tasks -> losses -> config -> runs -> launch | train -> dashboard -> tools -> cli

Read from the source with `ast` (every import, also those inside functions), so a late import cannot
dodge the rule. `ALLOWED` is the one place the allowed edges are named. Also the layout itself: every package's
folder carries its import name, nothing but the reward loader edits sys.path, no module grows past 400 lines.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "grpo_tui"
REPO = PACKAGE.parent
# Folders whose Python files are not importable code of the project: tests edit sys.path on purpose (pytest's
# prepend mode), the virtual environment is not ours, benchmarks/results/ holds recorded outputs.
NOT_OURS = {"tests", ".venv", "build", "dist", "results"}

# stage -> the stages it may import (besides itself). `grpo_kernels` is the kernels package.
ALLOWED: dict[str, set[str]] = {
    "userinput": set(),  # a path as a user typed it: every stage below reads paths from users
    "tasks": {"userinput"},  # built-in data sources, rewards and models: what a preset can name
    "losses": {"grpo_kernels"},  # the loss implementations: declarations, refusals, scoring and loss (lazy torch)
    "config": {"userinput", "tasks", "losses"},  # schema, store, --set overrides, pre-launch checks
    "runs": {"userinput", "config"},  # the run-folder contract: paths, metrics, completions, status, failure wording
    "launch": {"userinput", "config", "runs"},  # accelerate argv, the supervisor, SLURM
    "train": {"userinput", "tasks", "losses", "config", "runs", "grpo_kernels"},  # the trainer under accelerate
    "dashboard": {"userinput", "config", "runs", "launch"},  # view models and the Textual app (starts runs via launch)
    "tools": {"userinput", "tasks", "losses", "config", "runs", "launch", "train", "dashboard", "grpo_kernels"},
    "cli": {"userinput", "tasks", "config", "runs", "launch", "train", "dashboard", "tools"},
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
    circles = circles_in(graph())
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
    roots = (PACKAGE, REPO / "kernels", REPO / "presets")
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


def our_python_files() -> list[Path]:
    """Every .py file of the project outside tests (the packages, the benchmarks)."""
    return [
        p
        for p in sorted(REPO.rglob("*.py"))
        if not (set(p.relative_to(REPO).parts[:-1]) & NOT_OURS) and not p.relative_to(REPO).parts[0].startswith(".")
    ]


def built_packages() -> dict[str, Path]:
    """import name -> folder, for each package the build ships (pyproject's `packages.find`)."""
    setuptools_cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    find = setuptools_cfg["packages"]["find"]
    heads = {pattern.rstrip("*").split(".")[0] for pattern in find["include"]}
    found = {}
    for where in find["where"]:
        root = REPO / where
        for init in root.rglob("__init__.py"):
            name = ".".join(init.parent.relative_to(root).parts)
            if name.split(".")[0] in heads:
                found[name] = init.parent
    return found


def test_every_package_folder_carries_its_import_name() -> None:
    """No package-dir remapping: what `import x.y` loads is the folder x/y under one of the build's roots, and
    every folder holding an `__init__.py` outside tests and benchmarks is one of those packages (a stray
    `kernels/__init__.py` would make the checkout's folder stand in for Hugging Face's `kernels`)."""
    setuptools_cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "package-dir" not in setuptools_cfg, "package-dir remaps import names onto other folders"
    packages = built_packages()
    assert {"grpo_tui", "grpo_kernels", "grpo_tui_presets"} <= set(packages)
    for name, folder in packages.items():
        assert folder.name == name.split(".")[-1], f"{name} lives in {folder}"
    shipped = set(packages.values())
    stray = [
        str(p.parent.relative_to(REPO))
        for p in our_python_files()
        if p.name == "__init__.py" and p.parent not in shipped and p.relative_to(REPO).parts[0] != "benchmarks"
    ]
    assert stray == [], f"folders with an __init__.py that the build does not ship under their own name: {stray}"


# The one sys.path edit allowed outside tests: a user's reward module beside their files is found from the
# working folder, also under the console script (whose sys.path starts with its bin folder).
SYS_PATH_EDITS_ALLOWED = {"grpo_tui/tasks/rewards.py"}


def sys_path_edits(path: Path) -> list[int]:
    """Lines of `path` that change sys.path: its methods called, an item or slice assigned, or a rebinding."""

    def is_sys_path(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        )

    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_path(node.func.value):
            if node.func.attr in {"insert", "append", "extend", "remove", "pop", "clear", "reverse", "sort"}:
                lines.append(node.lineno)
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if is_sys_path(target) or (isinstance(target, ast.Subscript) and is_sys_path(target.value)):
                    lines.append(node.lineno)
    return lines


def test_no_sys_path_edit_outside_tests_but_the_reward_loader() -> None:
    found = [
        f"{p.relative_to(REPO)}:{line}"
        for p in our_python_files()
        if str(p.relative_to(REPO)) not in SYS_PATH_EDITS_ALLOWED
        for line in sys_path_edits(p)
    ]
    assert found == [], "sys.path edited (install the project or set PYTHONPATH instead):\n" + "\n".join(found)
    # The check itself sees an edit where there is one.
    assert sys_path_edits(REPO / "grpo_tui" / "tasks" / "rewards.py"), "the reward loader's edit went unseen"


def module_graph() -> dict[str, set[str]]:
    """Import edges among every module of the project outside tests: the packages by their import names, the
    benchmark scripts by their file names (run as scripts, they import their siblings by that name)."""
    names: dict[str, Path] = {}
    for name, folder in built_packages().items():
        for path in folder.glob("*.py"):
            names[name if path.stem == "__init__" else f"{name}.{path.stem}"] = path
    for path in (REPO / "benchmarks").rglob("*.py"):
        if "results" not in path.relative_to(REPO).parts:
            names[path.stem] = path
    edges: dict[str, set[str]] = {m: set() for m in names}
    for name, path in names.items():
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                # `from p import m` imports the submodule m where there is one, else a name defined in p
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in names else base for a in node.names]
            else:
                continue
            edges[name] |= {t for t in targets if t in names and t != name}
    return edges


def circles_in(edges: dict[str, set[str]]) -> list[str]:
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
    return circles


def test_no_import_circle_anywhere_in_the_project() -> None:
    """The kernels and the benchmark scripts too: benchmark code lives outside the library, importing it."""
    edges = module_graph()
    assert "grpo_kernels.functional" in edges and "bench" in edges  # both sides are in the graph
    assert circles_in(edges) == [], "import circles:\n" + "\n".join(circles_in(edges))
    assert circles_in({"a": {"b"}, "b": {"a"}}) == ["a -> b -> a"]  # the search finds one where there is one
