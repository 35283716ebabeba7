"""Packaging: the kernels ship as `grpo_kernels` (`kernels` is Hugging Face's package), and a wheel install works.

The wheel test builds the wheel, installs it alone into a fresh venv and runs the CLI and the app from a
folder outside the repo: the built-in presets and the stylesheet must come from the installed package.
"""

import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path
from typing import NamedTuple

import pytest

import grpo_kernels

REPO = Path(__file__).resolve().parent.parent


def test_grpo_kernels_is_the_repo_kernels_folder():
    assert Path(grpo_kernels.__file__).resolve().parent == REPO / "kernels" / "grpo_kernels"
    assert callable(grpo_kernels.fused_linear_grpo_loss) and callable(grpo_kernels.selective_logprobs)


def test_transformers_does_not_see_a_kernels_package_from_us():
    from transformers.utils import is_kernels_available

    # transformers asks for an installed distribution named `kernels`; ours is grpo-tui and maps only
    # grpo_tui and grpo_kernels, so with Hugging Face's package absent the answer stays False.
    providers = importlib.metadata.packages_distributions()
    assert "grpo-tui" not in providers.get("kernels", [])
    try:
        importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        assert is_kernels_available() is False
    else:  # someone installed Hugging Face's kernels: then it is theirs, not ours, that transformers sees
        assert is_kernels_available() is True


def test_console_script_is_declared():
    text = (REPO / "pyproject.toml").read_text()
    assert 'grpo-tui = "grpo_tui.cli:main"' in text
    # Each package's folder carries its import name: no package-dir remapping to keep in step.
    assert "package-dir" not in text


# ---- the wheel: what `pip install grpo-tui` gets, tried in a fresh venv from a folder outside the repo ----

# Headless app in the installed venv: the stylesheet must come from there and apply (#preset-list-box has
# `width: 42` in app.tcss; without the stylesheet the box would be as wide as its content).
APP_CHECK = """
import asyncio, sys
from pathlib import Path
from grpo_tui.dashboard.app import GrpoTuiApp

async def main():
    app = GrpoTuiApp(runs_dir=Path(sys.argv[1]), auto_attach=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        box = app.screen.query_one("#preset-list-box")
        print(type(app.screen).__name__, *app.css_path, box.outer_size.width, sep="\\n")

asyncio.run(main())
"""


class Installed(NamedTuple):
    wheel: Path
    venv: Path
    bin: Path
    env: dict[str, str]
    outside: Path  # a working folder outside the repo


def package_sources() -> list[str]:
    """What the build reads: pyproject, README (the long description) and the folders packages are found in
    (from the root itself, only the packages it names)."""
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    at_root = [name.rstrip("*") for name in find["include"] if (REPO / name.rstrip("*")).is_dir()]
    folders = [name for where in find["where"] for name in (at_root if where == "." else [where])]
    return ["pyproject.toml", "README.md", *folders]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Build the wheel offline and install it alone (--no-deps) into a fresh venv that sees this one's deps.

    The build reads a copy of the sources, not the repo: setuptools' in-tree `build/lib` keeps files
    from earlier builds, so a module deleted since would still ship and the test would not notice.
    """
    root = tmp_path_factory.mktemp("packaging")
    src = root / "src"
    for name in package_sources():
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    # setuptools >= 70.1 builds wheels by itself (the dev extra asks for it); no build isolation and no
    # index, so this runs offline.
    build = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(root / "dist"), str(src)],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, (
        f"wheel build failed (pip install -e '.[dev]' for setuptools>=70.1):\n{build.stdout}{build.stderr}"
    )
    (wheel,) = (root / "dist").glob("grpo_tui-*.whl")

    venv = root / "venv"
    # The dependencies (torch, textual, ...) come from the system site-packages and, when the tests run in a
    # venv, from that venv's site-packages, added by a .pth line after the new venv's own: so the wheel's
    # copy comes first on sys.path, ahead of any editable grpo-tui (whose finders sit last on sys.meta_path,
    # and whose .pth files in a folder added this way are never run).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    if sys.prefix != sys.base_prefix:
        venv_site = subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
        ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
        (Path(venv_site) / "test-deps.pth").write_text("\n".join(ours) + "\n")
    # --ignore-installed: the editable grpo-tui of the same version seen through the system site-packages
    # would otherwise count as already installed.
    install = subprocess.run(
        [*pip, "--python", str(python), "install", "--no-deps", "--no-index", "--ignore-installed", str(wheel)],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, f"wheel install failed:\n{install.stdout}{install.stderr}"

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"  # a user-site editable install would also shadow the wheel
    env["GRPO_TUI_PRESETS_DIR"] = str(root / "no-user-presets")
    outside = root / "cwd"
    outside.mkdir()
    return Installed(wheel, venv, venv / "bin", env, outside)


def run_installed(inst: Installed, *argv: str) -> str:
    result = subprocess.run(argv, cwd=inst.outside, env=inst.env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{argv} failed:\n{result.stdout}{result.stderr}"
    return result.stdout


@pytest.mark.slow
def test_wheel_holds_the_presets_and_the_stylesheet(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    presets = sorted(p.name for p in (REPO / "presets" / "grpo_tui_presets").glob("*.toml"))
    assert presets, "no presets/grpo_tui_presets/*.toml in the repo"
    missing = [f"grpo_tui_presets/{name}" for name in presets if f"grpo_tui_presets/{name}" not in names]
    assert not missing, f"wheel lacks {missing}"
    assert "grpo_tui/dashboard/app.tcss" in names
    assert "grpo_kernels/__init__.py" in names


@pytest.mark.slow
def test_installed_wheel_is_what_runs_not_the_repo(installed: Installed) -> None:
    out = run_installed(
        installed,
        str(installed.bin / "python"),
        "-c",
        "import grpo_tui, grpo_tui_presets, grpo_kernels; "
        "print(grpo_tui.__file__, grpo_tui_presets.__file__, grpo_kernels.__file__, sep='\\n')",
    )
    for line in out.splitlines():
        assert Path(line).resolve().is_relative_to(installed.venv.resolve()), f"{line} is not from the wheel"


@pytest.mark.slow
def test_installed_cli_lists_and_shows_the_builtin_presets(installed: Installed) -> None:
    listed = run_installed(installed, str(installed.bin / "grpo-tui"), "presets", "list")
    rows = {line.split()[0]: line.split()[1] for line in listed.splitlines() if len(line.split()) > 1}
    for path in (REPO / "presets" / "grpo_tui_presets").glob("*.toml"):
        assert rows.get(path.stem) == "built-in", f"{path.stem} not listed as built-in:\n{listed}"
    assert str(installed.venv.resolve()) in listed  # the built-in folder shown is the installed one

    shown = run_installed(installed, str(installed.bin / "grpo-tui"), "presets", "show", "tiny-cpu")
    assert 'name = "tiny-cpu"' in shown


@pytest.mark.slow
def test_installed_app_loads_its_stylesheet_from_the_wheel(installed: Installed) -> None:
    runs = installed.outside / "runs"
    runs.mkdir(exist_ok=True)
    screen, css_path, box_width = run_installed(
        installed, str(installed.bin / "python"), "-c", APP_CHECK, str(runs)
    ).splitlines()
    assert screen == "PresetScreen"
    assert Path(css_path).resolve().is_relative_to(installed.venv.resolve()) and Path(css_path).is_file()
    assert box_width == "42"
