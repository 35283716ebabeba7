"""The README is for users and short; the rest lives in docs/, whose generated pages are current."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("architecture.md", "benchmarks.md", "presets.md", "kernel.md", "reliability.md")


def test_readme_stays_short_and_its_first_block_is_set_up_and_tests() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300, "README.md over 300 lines: move the detail into docs/"
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert block[0].endswith("grpo-tui") and "pytest" in block[1]  # .ci/run reads the second line


def test_docs_hold_the_five_pages_and_every_relative_link_resolves() -> None:
    for name in DOCS:
        assert (ROOT / "docs" / name).is_file(), f"docs/{name} is missing"
    broken = []
    for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == [], "links to files that do not exist:\n" + "\n".join(broken)
