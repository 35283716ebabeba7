"""Training prompts from a preset's `[data]` section.

Sources:
    builtin:addition   synthetic "a+b=" problems with 2-digit operands (columns question, answer)
    openai/gsm8k       the hub dataset (config "main"); columns question, answer ("... #### 42")
    path.jsonl/.parquet a local file with the columns the prompt template and rewards use

Every row gets a `prompt` column: `data.prompt_template` formatted with the row's columns, with
`data.system_prompt` in front (as a system message when the tokenizer has a chat template).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

BUILTIN_ADDITION = "builtin:addition"
ADDITION_DIGITS = 2
# Enough distinct problems that a few hundred steps rarely repeat one (there are 8100 2-digit pairs).
ADDITION_ROWS = 4096
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


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
    path = Path(source).expanduser()
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
    try:
        template.format(**{c: "" for c in columns})
    except (KeyError, IndexError) as exc:
        raise DataError(
            f"data.prompt_template: refers to {exc} which is not a column; columns: {', '.join(sorted(columns))}"
        ) from None
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
