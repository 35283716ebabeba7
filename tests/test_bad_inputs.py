"""Issue 11, bad input: one test per finding of the hostile tester (items 7, 8, 9, 10 and 15).

Every refusal is exit code 2 (1 when the machine refuses) with one short stderr line per problem,
never a traceback, and no run folder left behind.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from grpo_tui.cli import main
from grpo_tui.config import checks
from grpo_tui.config.store import load_preset_file
from grpo_tui.tasks.rewards import resolve_reward
from grpo_tui.userinput import ECHO_LIMIT

README = Path(__file__).resolve().parents[1] / "README.md"
# An error line: the source, the dotted path, a value cut to ECHO_LIMIT and what is allowed.
LINE_LIMIT = 600


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_TUI_PRESETS_DIR", str(tmp_path / "user-presets"))
    monkeypatch.setattr(checks, "visible_gpu_count", lambda: 8)


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], code: int = 2) -> str:
    """Run the CLI; assert `code`, exactly one short stderr line and no traceback; return the line."""
    got = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert got == code, err[:2000]
    assert len(lines) == 1, err[:2000]
    assert len(lines[0]) <= LINE_LIMIT, lines[0][:200]
    return lines[0]


def write(folder: Path, text: str | bytes, name: str = "p.toml") -> Path:
    path = folder / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


# ---- item 7: tracebacks become one line ---------------------------------------------------------------

HOSTILE_FILES = {
    "nested 1,000 deep": "[grpo]\nmax_steps = " + "[" * 1000 + "]" * 1000 + "\n",
    "4,301-digit integer": "[grpo]\nmax_steps = " + "9" * 4301 + "\n",
    "model path over 255": '[model]\nname_or_path = "./' + "m" * 300 + '"\n',
    "data path over 255": '[data]\nsource = "./' + "d" * 300 + '.jsonl"\n',
}


@pytest.mark.parametrize("text", HOSTILE_FILES.values(), ids=HOSTILE_FILES.keys())
def test_hostile_preset_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    path = write(tmp_path, text)
    assert refused(capsys, ["presets", "validate", str(path)]).startswith(f"{path}: ")


def test_invalid_utf8_and_overlong_file_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, b'description = "\xff\xfe"\n')
    assert "not UTF-8" in refused(capsys, ["presets", "validate", str(path)])
    line = refused(capsys, ["presets", "validate", str(tmp_path / ("n" * 300 + ".toml"))])
    assert "File name too long" in line


@pytest.mark.parametrize(
    "item",
    [
        "grpo.max_steps=" + "9" * 4301,
        "grpo.max_steps=" + "[" * 1000 + "]" * 1000,
        "rewards.functions." + "9" * 5000 + ".weight=1",
        "model.name_or_path=./" + "m" * 300,
    ],
    ids=["huge int", "deep array", "huge index", "long path"],
)
def test_hostile_set_is_one_line(capsys: pytest.CaptureFixture[str], item: str) -> None:
    assert refused(capsys, ["presets", "show", "tiny-cpu", "--set", item]).startswith("--set: ")


def test_run_refused_for_a_lone_surrogate_leaves_no_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    line = refused(capsys, ["run", "tiny-cpu", "--headless", "--runs-dir", str(runs), "--set", "description=\udcff"])
    assert line.startswith("--set: description: got '\\udcff'")
    assert not runs.exists() or not any(runs.iterdir())


def test_run_with_an_unwritable_runs_folder_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = write(tmp_path, "a file, not a folder", "blocker")
    line = refused(capsys, ["run", "tiny-cpu", "--headless", "--runs-dir", str(blocker / "runs")])
    assert line.startswith("logging.runs_dir: cannot create a run folder in ") and "Not a directory" in line


def test_run_folder_removed_when_writing_it_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from grpo_tui.launch import supervisor

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(supervisor, "write_accelerate_config", no_space)
    runs = tmp_path / "runs"
    line = refused(capsys, ["run", "tiny-cpu", "--headless", "--runs-dir", str(runs)])
    assert line.endswith("No space left on device") and list(runs.iterdir()) == []


# ---- item 8: accepted though invalid, now refused at validation --------------------------------------

INVALID_SETS = {
    "grpo.max_steps=1000000000000000000": "grpo.max_steps: got 1000000000000000000; Input should be less than or equal to 100000000",
    "grpo.max_steps=true": "grpo.max_steps: got True; a number, not true/false",
    "grpo.temperature=inf": "grpo.temperature: got inf; Input should be a finite number",
    "grpo.beta=nan": "grpo.beta: got nan; Input should be a finite number",
    "peft.alpha=inf": "peft.alpha: got inf; Input should be a finite number",
    "rewards.functions.0.weight=nan": "rewards.functions.0.weight: got nan; Input should be a finite number",
    'model.name_or_path=""': "model.name_or_path: got ''; String should have at least 1 character",
    'model.name_or_path="a\\u0085b"': "model.name_or_path: got 'a\\x85b'; one printable line, found U+0085",
    "grpo.seed=-1": "grpo.seed: got -1; Input should be greater than or equal to 0",
    "grpo.seed=4294967296": "grpo.seed: got 4294967296; Input should be less than 4294967296",
}


@pytest.mark.parametrize(("item", "expected"), INVALID_SETS.items(), ids=INVALID_SETS.keys())
def test_invalid_set_refused(capsys: pytest.CaptureFixture[str], item: str, expected: str) -> None:
    assert refused(capsys, ["presets", "show", "tiny-cpu", "--set", item]) == f"--set: {expected}"


def test_hundred_thousand_character_path_refused_and_cut(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, ["presets", "show", "tiny-cpu", "--set", "model.name_or_path=" + "x" * 100_000])
    assert "(100002 characters)" in line and len(line) < 3 * ECHO_LIMIT + 100


INVALID_CHECKS = {
    '[data]\nprompt_template = "{nope}"\n': "data.prompt_template: refers to 'nope' which is not a column; "
    "columns: answer, question",
    '[data]\nprompt_template = "{question"\n': "data.prompt_template: not a valid format string",
    '[data]\nprompt_template = "{question:>1000000000000000000000}"\n': "data.prompt_template: field 'question': "
    "widths and precisions up to 1000",
    '[data]\nprompt_template = "{question.__class__}"\n': "data.prompt_template: field 'question.__class__' is not",
    "[peft]\nenabled = true\ntarget_modules = []\n": "peft.target_modules: empty with peft.enabled",
    '[rewards]\nfunctions = [{ name = "os.path:basename" }]\n': "rewards.functions.0.name: got 'os.path:basename'; "
    "its parameter 'p' is neither a column of the data nor one TRL passes",
    '[rewards]\nfunctions = [{ name = "json:dumps" }]\n': "rewards.functions.0.name: got 'json:dumps'; "
    "its parameter 'obj' is neither a column",
}


@pytest.mark.parametrize(("text", "expected"), INVALID_CHECKS.items(), ids=range(len(INVALID_CHECKS)))
def test_invalid_preset_refused_at_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    path = write(tmp_path, text)
    assert refused(capsys, ["presets", "validate", str(path)]).startswith(f"{path}: {expected}")


def test_template_checked_against_a_local_files_first_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write(tmp_path, '{"problem": "1+1=", "answer": "2"}\n', "train.jsonl")
    path = write(tmp_path, f'[data]\nsource = "{data}"\nprompt_template = "{{question}}"\n')
    line = refused(capsys, ["presets", "validate", str(path)])
    assert line.endswith("refers to 'question' which is not a column; columns: answer, problem")


def test_reward_taking_named_columns_without_kwargs(tmp_path: Path) -> None:
    from grpo_tui.tasks.rewards import signature_problem

    def named(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, answer):  # noqa: ANN001, ANN202 (TRL's exact call)
        return [0.0]

    assert signature_problem(named, {"question", "answer"}) == "it takes no question; add **kwargs (TRL passes " + (
        "prompts, completions, completion_ids, trainer_state, log_extra, log_metric and every column)"
    )
    assert signature_problem(named, {"answer"}) is None
    assert signature_problem(lambda completions, **kw: [0.0], {"answer"}) is None


# ---- item 9: rejected though valid --------------------------------------------------------------------


def test_bom_and_a_stem_with_a_space_are_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bom = write(tmp_path, b"\xef\xbb\xbf[grpo]\nmax_steps = 3\n", "bom.toml")
    spaced = write(tmp_path, "[grpo]\nmax_steps = 4\n", "my preset.toml")
    assert main(["presets", "validate", str(bom), str(spaced)]) == 0, capsys.readouterr().err
    assert load_preset_file(bom).grpo.max_steps == 3
    assert load_preset_file(spaced).name == "my-preset"


def test_echoed_values_are_cut(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, '[grpo]\nlearning_rate = "' + "f" * 100_182 + '"\n')
    line = refused(capsys, ["presets", "validate", str(path)])
    assert "... (100184 characters)" in line and len(line) < len(str(path)) + 3 * ECHO_LIMIT + 100


# ---- item 10: a reward module in the working folder ---------------------------------------------------


def test_reward_module_in_the_working_folder_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "def score(completions, **kwargs):\n    return [1.0 for _ in completions]\n", "myreward_11b.py")
    monkeypatch.chdir(tmp_path)
    # As under the `grpo-tui` console script: sys.path holds the script's folder, not the working folder.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "myreward_11b", raising=False)
    path = write(tmp_path, '[rewards]\nfunctions = [{ name = "myreward_11b:score" }]\n')
    assert main(["presets", "validate", str(path)]) == 0
    assert resolve_reward("myreward_11b:score")(completions=["a"]) == [1.0]


# ---- the README says what runs user code -----------------------------------------------------------------


def test_readme_has_a_security_section() -> None:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Security") :]
    for topic in ("module:function", "presets validate", "trust_remote_code", "0600", "quoted", "rendezvous"):
        assert topic in section, topic
