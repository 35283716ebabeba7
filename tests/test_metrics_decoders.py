"""orjson is optional: without it the metrics stream reads the same records through the stdlib decoder."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from grpo_tui.runs import metrics

# A process in which `import orjson` fails, as on an install without the `fast` extra.
READ_WITHOUT_ORJSON = """
import json, sys
sys.modules["orjson"] = None
from grpo_tui.runs import metrics
assert metrics._fast_loads is None and metrics._DECODERS == (json.loads,)
print(json.dumps(metrics.read_records(sys.argv[1]), allow_nan=True))
"""


def write_stream(path: Path) -> None:
    lines = [
        json.dumps({"event": "start", "time": 1.0}),
        json.dumps({"step": 1, "reward": 0.5, "loss": 1e-7}),
        json.dumps({"step": 2, "reward": float("nan"), "loss": float("inf")}),  # json.dumps writes NaN, Infinity
        "not json at all",
        json.dumps({"step": 3, "reward": -1.0, "text": "é ✓"}),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_records_read_alike_with_and_without_orjson(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    write_stream(path)
    here = metrics.read_records(path)
    out = subprocess.run(
        [sys.executable, "-c", READ_WITHOUT_ORJSON, str(path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    without = json.loads(out.stdout)
    assert [r.get("step") for r in without] == [None, 1, 2, 3]  # the bad line skipped, the rest kept
    assert math.isnan(without[2]["reward"]) and without[2]["loss"] == math.inf
    assert json.dumps(without, allow_nan=True) == json.dumps(here, allow_nan=True)
