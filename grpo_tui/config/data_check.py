"""A local data file read through before launch: a file the trainer would fail on 15-30 s in is refused now.

`presets validate` and `run` call `data_file_problems` (through config.checks). JSON lines are parsed
one by one (the first bad line is named with its number), a .json file as a whole, a parquet file's
row count read from its footer. Every row must hold the columns the prompt template names: the loader
fills a row's missing column with None, and every such prompt would say "None".
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from grpo_tui.userinput import clip

# Bytes of a JSON-lines file read through before launch; a larger file is checked this far.
MAX_SCAN_BYTES = 256 * 1024 * 1024
# Longest reason from the JSON decoder kept in a message.
REASON_CHARS = 80


def template_columns(template: str) -> list[str]:
    """The column names a prompt template's fields name ([] when it is not a valid format string)."""
    try:
        return [field for _, field, _, _ in string.Formatter().parse(template) if field and field.isidentifier()]
    except ValueError:
        return []


def data_file_problems(path: Path, template: str) -> list[str]:
    """One line per problem of a local .jsonl/.json/.parquet data file (none when it reads, or is not one)."""
    shown = clip(str(path))
    columns = template_columns(template)
    try:
        if path.suffix == ".jsonl" or (path.suffix == ".json" and _first_char(path) == "{"):
            return _rows_problems(_json_lines(path), shown, columns)
        if path.suffix == ".json":
            return _json_array_problems(path, shown, columns)
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            if pq.ParquetFile(path).metadata.num_rows == 0:
                return [f"data.source: {shown} has no rows"]
    except OSError as exc:
        return [f"data.source: cannot read {shown} ({exc.strerror})"]
    except Exception:  # not parquet after all (pyarrow's errors vary): the trainer's loader says so
        return []
    return []


def _first_char(path: Path) -> str:
    with open(path, encoding="utf-8-sig", errors="replace") as handle:
        head = handle.read(4096).lstrip()
    return head[:1]


def _json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value or the JSONDecodeError) of each non-blank line."""
    read = 0
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            read += len(raw)
            if read > MAX_SCAN_BYTES:
                return
            if not raw.strip():
                continue
            try:
                yield number, json.loads(raw.decode("utf-8-sig" if number == 1 else "utf-8"))
            except (ValueError, RecursionError) as exc:
                yield number, exc


def _rows_problems(rows: Iterator[tuple[int, Any]], shown: str, columns: list[str], unit: str = "line") -> list[str]:
    problems: list[str] = []
    count = 0
    missing_named = False
    for number, row in rows:
        count += 1
        if isinstance(row, Exception):
            reason = row.msg if isinstance(row, json.JSONDecodeError) else type(row).__name__
            return [f"data.source: {shown} {unit} {number}: not valid JSON ({clip(reason, REASON_CHARS)})"]
        if not isinstance(row, dict):
            return [f"data.source: {shown} {unit} {number}: not a JSON object (got {type(row).__name__})"]
        absent = [c for c in columns if c not in row]
        # The first row's columns are the template check's (config.checks): the others are checked here.
        if absent and count > 1 and not missing_named:
            missing_named = True
            have = ", ".join(sorted(map(str, row))) or "none"
            problems.append(
                f"data.prompt_template: names column {clip(absent[0], 40)!r}, missing from {shown} {unit} {number}"
                f" (its columns: {clip(have, 160)})"
            )
    if count == 0:
        return [f"data.source: {shown} has no rows"]
    return problems


def _json_array_problems(path: Path, shown: str, columns: list[str]) -> list[str]:
    if path.stat().st_size > MAX_SCAN_BYTES:
        return []
    try:
        with open(path, encoding="utf-8-sig") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as exc:
        return [f"data.source: {shown} line {exc.lineno}: not valid JSON ({clip(exc.msg, REASON_CHARS)})"]
    except (ValueError, RecursionError) as exc:
        return [f"data.source: {shown}: not valid JSON ({type(exc).__name__})"]
    if isinstance(data, list):
        return _rows_problems(((i, row) for i, row in enumerate(data, 1)), shown, columns, unit="row")
    return []
