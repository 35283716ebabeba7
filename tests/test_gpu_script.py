"""benchmarks/gpu_e2e.sh: the phases its usage names, those its error line allows and those it runs are one set."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_e2e.sh"


def test_usage_error_line_and_case_arms_name_the_same_phases() -> None:
    text = SCRIPT.read_text()
    usage = re.search(r"PHASE: ([a-z0-9 ]+)\n#\s+([a-z0-9 ]+)\n", text)
    assert usage, "the usage line lists the phases"
    named = set((usage.group(1) + " " + usage.group(2)).split())
    allowed = set(re.search(r"unknown phase \$phase; allowed: ([a-z0-9 ]+)\"", text).group(1).split())
    body = text[text.index("case $phase in") : text.index('    *) echo "unknown phase')]
    arms = set(re.findall(r"^    ([a-z0-9]+)\)$", body, flags=re.M))
    assert named == allowed == arms and {"decode", "decodeab", "fsdp", "reallengths", "tests"} <= arms


def test_the_script_parses_and_prints_its_usage_without_a_phase() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    usage = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert usage.returncode == 0 and "decodeab" in usage.stdout and "Results land in" in usage.stdout
