"""Training prompts from a preset's `[data]` section.

Sources:
    builtin:addition   synthetic "a+b=" problems with 2-digit operands (columns question, answer)
    openai/gsm8k       the hub dataset (config "main"); columns question, answer ("... #### 42")
    path.jsonl/.parquet a local file with the columns the prompt template and rewards use

Every row gets a `prompt` column: `data.prompt_template` formatted with the row's columns, with
`data.system_prompt` in front (as a system message when the tokenizer has a chat template).
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable, Mapping
from typing import Any

from grpo_tui.userinput import user_path

BUILTIN_ADDITION = "builtin:addition"
ADDITION_DIGITS = 2
# Enough distinct problems that a few hundred steps rarely repeat one (there are 8100 2-digit pairs).
ADDITION_ROWS = 4096
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")
# A row like each source whose columns are known without loading it: templates are tried on it when a
# preset is validated, not 15-30 s into a run.
KNOWN_ROWS: dict[str, dict[str, str]] = {
    BUILTIN_ADDITION: {"question": "12+34=", "answer": "46"},
    "openai/gsm8k": {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
}
# Widest width or precision a template field may ask for ({question:>40}): every prompt is padded to
# it, and a width of 10**21 is an allocation that never ends.
MAX_FORMAT_WIDTH = 1_000
# Bytes read to find a local file's first record: a first line longer than this is not checked.
FIRST_LINE_BYTES = 1 << 20


class DataError(ValueError):
    """A user-facing problem with the data section (one line, names the field)."""


def addition_problem(generator: Any, digits: int = ADDITION_DIGITS) -> tuple[str, str]:
    """One problem `a+b=` and its answer, operands drawn uniformly from the `digits`-digit numbers."""
    import torch

    low, high = 10 ** (digits - 1), 10**digits
    a, b = torch.randint(low, high, (2,), generator=generator).tolist()
    return f"{a}+{b}=", str(a + b)


def addition_rows(count: int = ADDITION_ROWS, seed: int = 1234, digits: int = ADDITION_DIGITS) -> list[dict[str, str]]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        question, answer = addition_problem(generator, digits)
        rows.append({"question": question, "answer": answer})
    return rows


def load_rows(source: str, split: str = "train"):  # -> datasets.Dataset
    """The raw rows of a data source, as a `datasets.Dataset`."""
    import datasets

    if source == BUILTIN_ADDITION:
        return datasets.Dataset.from_list(addition_rows())
    if source.startswith("builtin:"):
        raise DataError(f"data.source: unknown built-in {source!r}; allowed: {BUILTIN_ADDITION}")
    path = user_path(source)
    if path.suffix in LOCAL_SUFFIXES or path.exists():
        if not path.is_file():
            raise DataError(f"data.source: file not found: {path}")
        kind = "parquet" if path.suffix == ".parquet" else "json"
        if path.suffix not in LOCAL_SUFFIXES:
            raise DataError(f"data.source: {path.name!r} is not .jsonl, .json or .parquet")
        return datasets.load_dataset(kind, data_files=str(path), split="train")
    config = "main" if source == "openai/gsm8k" else None
    try:
        return datasets.load_dataset(source, config, split=split)
    except Exception as exc:  # hub/network errors vary; the user needs one line
        raise DataError(f"data.source: cannot load {source!r} split {split!r}: {type(exc).__name__}: {exc}") from exc


def first_row(source: str) -> Mapping[str, Any] | None:
    """The first record of `source` when it is cheap to know (built-ins, gsm8k, local files), else None.

    A local file that cannot be read, or whose first record is not a JSON object, gives None: whether
    it exists is checked elsewhere, and the json loader also reads layouts other than JSON lines.
    """
    if source in KNOWN_ROWS:
        return KNOWN_ROWS[source]
    path = user_path(source)
    try:
        if path.suffix in (".jsonl", ".json") and path.is_file():
            with open(path, encoding="utf-8-sig") as handle:
                line = ""
                while not line.strip():
                    line = handle.readline(FIRST_LINE_BYTES)
                    if not line:
                        return None
            row = json.loads(line)
            return row if isinstance(row, dict) else None
        if path.suffix == ".parquet" and path.is_file():
            import pyarrow.parquet as pq  # only for parquet sources: pyarrow is slow to import

            batch = next(pq.ParquetFile(path).iter_batches(batch_size=1), None)
            return batch.to_pylist()[0] if batch is not None and batch.num_rows else None
    except Exception:  # unreadable, not JSON, hostile nesting, or pyarrow's errors for a file that is not parquet
        return None
    return None


def template_problem(template: str, row: Mapping[str, Any] | None, echo: Callable[[Any], str] = repr) -> str | None:
    """Why `template` cannot render `row` (None when it can); without a row only its form is checked.

    Fields are plain column names (`{question}`, `{answer:>8}`): no positions, attributes or indexes,
    which would reach into values (`{question.__class__}`). `echo` writes user text into the message.
    """
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        return f"not a valid format string ({exc}); write a literal {{ or }} as {{{{ or }}}}"
    fields = [(field, spec or "") for _, field, spec, _ in parts if field is not None]
    for field, spec in fields:
        if not field.isidentifier():
            return f"field {echo(field)} is not a column name; use {{column}} (no positions, attributes or indexes)"
        if row is not None and field not in row:
            # Escaped: a column name with a newline must not split the one-line message.
            columns = ", ".join(sorted(str(c).encode("unicode_escape").decode("ascii") for c in row))
            return f"refers to {echo(field)} which is not a column; columns: {columns}"
        if "{" in spec:
            return f"field {echo(field)}: a {{...}} inside a format spec is not supported"
        if any(len(n) > 4 or int(n) > MAX_FORMAT_WIDTH for n in re.findall(r"\d+", spec)):
            return f"field {echo(field)}: widths and precisions up to {MAX_FORMAT_WIDTH}"
    values = dict(row) if row is not None else {field: "" for field, _ in fields}
    try:
        template.format(**values)
    except Exception as exc:  # a format spec the column's value does not take ({answer:d} on text)
        return f"cannot render the data's first row: {type(exc).__name__}: {echo(str(exc))}"
    return None


def build_prompt_dataset(data_section: Any, tokenizer: Any = None, max_prompt_length: int | None = None):
    """Rows of `data_section.source` with a `prompt` column rendered from the template.

    With a tokenizer and `max_prompt_length`, plain-text prompts longer than that many tokens keep their
    last tokens (left truncation, as TRL did before 1.x dropped the option): the question's end and the
    cue to answer survive. Chat prompts are left whole.
    """
    rows = load_rows(data_section.source, data_section.split)
    if data_section.max_samples is not None:
        rows = rows.select(range(min(data_section.max_samples, len(rows))))
    template = data_section.prompt_template
    columns = set(rows.column_names)
    problem = template_problem(template, rows[0] if len(rows) else dict.fromkeys(columns, ""))
    if problem:
        raise DataError(f"data.prompt_template: {problem}")
    chat = tokenizer is not None and getattr(tokenizer, "chat_template", None) and data_section.system_prompt

    def render(row: dict[str, Any]) -> dict[str, Any]:
        text = template.format(**row)
        if chat:
            return {
                "prompt": [{"role": "system", "content": data_section.system_prompt}, {"role": "user", "content": text}]
            }
        if data_section.system_prompt:
            text = f"{data_section.system_prompt}\n{text}"
        if tokenizer is not None and max_prompt_length is not None:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) > max_prompt_length:
                text = tokenizer.decode(ids[-max_prompt_length:])
        return {"prompt": text}

    return rows.map(render, remove_columns=["prompt"] if "prompt" in columns else None)
