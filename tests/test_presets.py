"""Preset files, the store, `--set` overrides and cross-field checks, mostly through the CLI.

Every bad input must give exit code 2 and exactly one stderr line naming the field, never a traceback.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from grpo_tui.cli import main
from grpo_tui.config import checks
from grpo_tui.config.checks import check_preset, generation_batch
from grpo_tui.config.overrides import apply_overrides, parse_override, parse_value
from grpo_tui.config.schema import Preset
from grpo_tui.config.store import (
    BUILTIN_DIR,
    PresetError,
    delete_user_preset,
    dump_preset,
    list_presets,
    load_preset,
    load_preset_file,
    save_user_preset,
)

REAL_GPU_COUNT = checks.visible_gpu_count
SHIPPED = sorted(p.stem for p in BUILTIN_DIR.glob("*.toml"))


@pytest.fixture(autouse=True)
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "user-presets"
    monkeypatch.setenv("GRPO_TUI_PRESETS_DIR", str(folder))
    # The same answers on a laptop and a GPU box; tests of the GPU check set their own count.
    monkeypatch.setattr(checks, "visible_gpu_count", lambda: 8)
    return folder


def one_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the CLI, assert exit 2 with exactly one stderr line and no traceback; return the line."""
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    return lines[0]


def write(tmp_path: Path, text: str, name: str = "p.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_presets_are_the_four_required() -> None:
    assert {"tiny-cpu", "qwen3-0.6b-gsm8k", "qwen3-0.6b-gsm8k-lora", "qwen3-1.7b-gsm8k-fsdp-lora"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_preset_round_trips(name: str) -> None:
    preset, path = load_preset(name)
    assert preset.name == path.stem == name
    again = Preset.model_validate(tomllib.loads(dump_preset(preset)))
    assert again == preset


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_preset_passes_static_checks(name: str) -> None:
    preset, _ = load_preset(name)
    result = check_preset(preset, environment=False)
    assert result.errors == []


def test_shipped_presets_say_what_they_are() -> None:
    tiny, _ = load_preset("tiny-cpu")
    assert tiny.model.name_or_path == "builtin:tiny-qwen3" and tiny.data.source == "builtin:addition"
    assert tiny.distributed.use_cpu and tiny.distributed.num_processes == 1
    lora, _ = load_preset("qwen3-0.6b-gsm8k-lora")
    assert lora.peft.enabled and lora.model.name_or_path == "Qwen/Qwen3-0.6B"
    fsdp, _ = load_preset("qwen3-1.7b-gsm8k-fsdp-lora")
    assert fsdp.distributed.fsdp and fsdp.distributed.num_processes == 2 and fsdp.peft.enabled
    full, _ = load_preset("qwen3-0.6b-gsm8k")
    assert not full.peft.enabled and full.grpo.beta == 0.04 and full.grpo.max_completion_length == 256
    names = {spec.name for spec in full.rewards.functions}
    assert names == {"gsm8k_correct", "gsm8k_format"}


def test_user_preset_listed_beside_builtins_and_shadows(user_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny, _ = load_preset("tiny-cpu")
    save_user_preset(tiny.model_copy(update={"description": "mine"}), "my-run")
    save_user_preset(tiny.model_copy(update={"description": "my tiny"}), shadow=True)  # a built-in's name
    entries = {e.name: e for e in list_presets()}
    assert entries["my-run"].origin == "user"
    assert entries["tiny-cpu"].origin == "user" and entries["tiny-cpu"].shadows_builtin
    assert entries["qwen3-0.6b-gsm8k"].origin == "built-in"
    assert load_preset("tiny-cpu")[0].description == "my tiny"
    assert main(["presets", "list"]) == 0
    out = capsys.readouterr().out
    assert "my-run" in out and "shadows the built-in" in out and str(user_dir) in out


def test_save_user_preset_refuses_overwrite_and_bad_name() -> None:
    tiny, _ = load_preset("tiny-cpu")
    save_user_preset(tiny, "copy")
    with pytest.raises(PresetError, match="exists"):
        save_user_preset(tiny, "copy")
    with pytest.raises(PresetError, match="name"):
        save_user_preset(tiny, "../evil")


def test_presets_save_from_the_command_line(user_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["presets", "save", "short", "--from", "tiny-cpu", "--set", "grpo.max_steps=9"]
    assert main(argv) == 0
    saved = load_preset("short")[0]
    assert saved.name == "short" and saved.grpo.max_steps == 9 and (user_dir / "short.toml").is_file()
    capsys.readouterr()
    assert one_error(capsys, argv).endswith("short.toml: a user preset with this name exists")
    assert main([*argv, "--force", "--set", "grpo.max_steps=10"]) == 0
    assert load_preset("short")[0].grpo.max_steps == 10
    capsys.readouterr()
    line = one_error(capsys, ["presets", "save", "bad", "--set", "grpo.per_device_batch_size=3"])
    assert line.startswith("grpo.num_generations: got 8")


def test_file_without_name_is_named_after_its_stem(tmp_path: Path) -> None:
    preset = load_preset_file(write(tmp_path, "[grpo]\nmax_steps = 3\n", "quick.toml"))
    assert preset.name == "quick" and preset.grpo.max_steps == 3


def test_show_prints_resolved_toml_and_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["presets", "show", "qwen3-0.6b-gsm8k", "--set", "grpo.max_steps=7"]) == 0
    out = capsys.readouterr().out
    # The output (comments aside) is itself a complete preset.
    shown = Preset.model_validate(tomllib.loads(out))
    assert shown.grpo.max_steps == 7 and shown.grpo.top_p == 1.0  # a default, filled in
    assert "grpo_tui.launch.launcher --config_file" in out and "-m grpo_tui.train --run-dir" in out


def test_validate_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["presets", "validate", str(BUILTIN_DIR / "tiny-cpu.toml")]) == 0
    assert capsys.readouterr().out.strip().endswith("tiny-cpu.toml: ok")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("bogus = 1\n", "bogus: unknown key; allowed keys: data, description"),
        ("[grpo]\nnum_generationz = 4\n", "grpo.num_generationz: unknown key; allowed keys: activation_offload, beta,"),
        ('[grpo]\nlearning_rate = "fast"\n', "grpo.learning_rate: got 'fast'"),
        ("[grpo]\nnum_generations = 1\n", "grpo.num_generations: got 1; Input should be greater than or equal to 2"),
        ("[distributed]\nmain_process_port = 70000\n", "distributed.main_process_port: got 70000"),
        ('[loss]\nimpl = "fast"\n', "loss.impl: got 'fast'; Input should be 'chunked', 'naive' or 'trl'"),
        ('[[rewards.functions]]\nname = "gsm8k_correct"\nwieght = 2\n', "rewards.functions.0.wieght: unknown key"),
        ("model = 3\n", "model: got 3"),
        (
            "[grpo]\ngeneration_sub_batch = 0\n",
            "grpo.generation_sub_batch: got 0; Input should be greater than or equal to 1",
        ),
        ('[grpo]\nscoring_sub_batch = "half"\n', "grpo.scoring_sub_batch: got 'half'"),
        (
            '[model]\nsdpa_kernels = ["flash", "fastest"]\n',
            "model.sdpa_kernels.1: got 'fastest'; Input should be 'cudnn', 'flash', 'efficient' or 'math'",
        ),
        ('[model]\nsdpa_kernels = "flash"\n', "model.sdpa_kernels: got 'flash'"),
    ],
)
def test_validate_schema_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str) -> None:
    path = write(tmp_path, text)
    line = one_error(capsys, ["presets", "validate", str(path)])
    assert line.startswith(f"{path}: ")
    assert expected in line


def test_toml_syntax_error_has_line_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "[grpo]\nmax_steps = 5\nbeta = \n")
    line = one_error(capsys, ["presets", "validate", str(path)])
    assert "TOML syntax error" in line and "line 3" in line and "column" in line


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error(capsys, ["presets", "validate", str(tmp_path / "nope.toml")])
    assert line == f"{tmp_path / 'nope.toml'}: no such preset file"


def test_unknown_preset_name_suggests_the_closest_and_lists_known(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error(capsys, ["presets", "show", "tiny-gpu"])
    assert line.startswith("tiny-gpu: unknown preset; did you mean tiny-cpu? known presets: ")
    assert "qwen3-0.6b-gsm8k" in line


def test_a_misspelled_run_suggests_the_preset(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error(capsys, ["run", "tiny-cpuu", "--headless"])
    assert line.startswith("tiny-cpuu: unknown preset; did you mean tiny-cpu? ")


def test_a_name_like_nothing_gets_no_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error(capsys, ["presets", "show", "zzzzzz"])
    assert line.startswith("zzzzzz: unknown preset; known presets: ")


def test_user_presets_overwrite_and_delete() -> None:
    preset = load_preset("tiny-cpu")[0]
    path = save_user_preset(preset, "mine")
    with pytest.raises(PresetError, match="a user preset with this name exists"):
        save_user_preset(preset, "mine")
    changed = preset.model_copy(update={"description": "changed"})
    assert save_user_preset(changed, "mine", overwrite=True) == path
    assert load_preset("mine")[0].description == "changed"
    assert list(path.parent.iterdir()) == [path]  # no temp file left behind
    assert delete_user_preset("mine") == path and not path.exists()
    with pytest.raises(PresetError, match="is not a user preset"):
        delete_user_preset("mine")
    with pytest.raises(PresetError, match=r"tiny-cpu: is built-in \(read-only\)"):
        delete_user_preset("tiny-cpu")


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("grpo.max_stepz=5", "--set: grpo.max_stepz: unknown key in grpo; allowed keys: activation_offload, beta,"),
        ("grop.max_steps=5", "--set: grop: unknown key in (top level); allowed keys: data,"),
        ("grpo.max_steps=abc", "--set: grpo.max_steps: got 'abc'"),
        ("grpo.max_steps=0", "--set: grpo.max_steps: got 0"),
        ("grpo.max_steps", "--set: got 'grpo.max_steps'; expected dotted.key=value"),
        ("grpo=5", "--set: grpo: got 5"),
        ("grpo.max_steps.x=5", "--set: grpo.max_steps: is a value, not a section; use grpo.max_steps=VALUE"),
        ("rewards.functions.3.weight=1", "--set: rewards.functions.3: no item '3'; indexes 0..0"),
    ],
)
def test_bad_set(capsys: pytest.CaptureFixture[str], item: str, expected: str) -> None:
    line = one_error(capsys, ["presets", "show", "tiny-cpu", "--set", item])
    assert line.startswith(expected)


def test_parse_value_uses_toml_syntax_with_string_fallback() -> None:
    assert parse_value("5") == 5 and parse_value("3e-4") == 3e-4 and parse_value("true") is True
    assert parse_value('["q_proj", "v_proj"]') == ["q_proj", "v_proj"]
    assert parse_value("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    assert parse_value('"quoted"') == "quoted"
    assert parse_override(" grpo.beta = 0.1") == (["grpo", "beta"], 0.1)


def test_apply_overrides_nested_list_and_table() -> None:
    tiny, _ = load_preset("tiny-cpu")
    out = apply_overrides(
        tiny,
        [
            "grpo.max_steps=5",
            "peft.enabled=true",
            'peft.target_modules=["q_proj"]',
            'rewards.functions=[{name = "addition_exact"}, {name = "addition_partial", weight = 0.5}]',
            "rewards.functions.1.weight=0.25",
        ],
    )
    assert out.grpo.max_steps == 5 and out.peft.enabled and out.peft.target_modules == ["q_proj"]
    assert [(f.name, f.weight) for f in out.rewards.functions] == [("addition_exact", 1.0), ("addition_partial", 0.25)]
    assert tiny.grpo.max_steps != 5  # the original is untouched


def test_several_bad_sets_give_one_line_each() -> None:
    tiny, _ = load_preset("tiny-cpu")
    with pytest.raises(PresetError) as info:
        apply_overrides(tiny, ["grpo.nope=1", "loss.nope=2"])
    assert [line.split(":")[1].strip() for line in info.value.lines] == ["grpo.nope", "loss.nope"]


# ---- cross-field checks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "[grpo]\nnum_generations = 8\nper_device_batch_size = 6\n",
            "grpo.num_generations: got 8; must divide the generation batch per_device_batch_size 6 x "
            "num_processes 1 x num_machines 1 x gradient_accumulation_steps 1 = 6",
        ),
        (
            '[loss]\nimpl = "chunked"\n[peft]\nenabled = true\ntarget_modules = ["q_proj", "lm_head"]\n',
            "peft.target_modules: lm_head with loss.impl chunked is refused",
        ),
        (
            "[distributed]\nnum_machines = 2\n",
            "distributed.main_process_ip: num_machines 2 needs the rank-0 machine's address",
        ),
        (
            '[distributed]\nnum_machines = 2\nmachine_rank = 2\nmain_process_ip = "10.0.0.1"\n',
            "distributed.machine_rank: got 2; allowed 0..1",
        ),
        (
            '[model]\nname_or_path = "builtin:huge"\n',
            "model.name_or_path: got 'builtin:huge'; built-in models: builtin:tiny-qwen3",
        ),
        (
            '[model]\nname_or_path = "./no/such/model"\n',
            "model.name_or_path: got './no/such/model'; no such local folder",
        ),
        (
            '[data]\nsource = "builtin:subtraction"\n',
            "data.source: got 'builtin:subtraction'; allowed: builtin:addition",
        ),
        ('[data]\nsource = "/nonexistent/train.jsonl"\n', "data.source: got '/nonexistent/train.jsonl'; no such file"),
        # `~user` of no user: pathlib cannot expand it and raises; the path is judged as typed
        (
            '[model]\nname_or_path = "~nosuchuser9/m"\n',
            "model.name_or_path: got '~nosuchuser9/m'; no such local folder",
        ),
        ('[data]\nsource = "not a dataset"\n', "data.source: got 'not a dataset'; allowed:"),
        (
            '[rewards]\nfunctions = [{ name = "gsm8k_corect" }]\n',
            "rewards.functions.0.name: got 'gsm8k_corect'; registered rewards: addition_exact",
        ),
        (
            '[rewards]\nfunctions = [{ name = "no_such_module_xyz:score" }]\n',
            "rewards.functions.0.name: got 'no_such_module_xyz:score'; cannot import module 'no_such_module_xyz'",
        ),
        (
            '[rewards]\nfunctions = [{ name = "os.path:no_such_function" }]\n',
            "rewards.functions.0.name: got 'os.path:no_such_function'; module 'os.path' has no function",
        ),
        (
            '[distributed]\nuse_cpu = true\nmixed_precision = "fp16"\n',
            "distributed.mixed_precision: fp16 is not supported on the CPU",
        ),
        (
            '[model]\nattn_implementation = "eager"\nsdpa_kernels = ["efficient"]\n',
            "model.sdpa_kernels: applies to model.attn_implementation sdpa, got eager",
        ),
        (
            "[model]\ncompile_layers = true\n[distributed]\nfsdp = true\nnum_processes = 2\n",
            "model.compile_layers: not with distributed.fsdp",
        ),
    ],
)
def test_cross_field_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str) -> None:
    path = write(tmp_path, text)
    line = one_error(capsys, ["presets", "validate", str(path)])
    assert line == f"{path}: {expected}" or line.startswith(f"{path}: {expected}")


def test_a_tilde_path_of_no_user_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # pathlib raises for `~user` of no user; the path is judged as typed, relative to the preset's folder
    path = write(tmp_path, '[data]\nsource = "~nosuchuser9/train.jsonl"\n')
    line = one_error(capsys, ["presets", "validate", str(path)])
    assert line.startswith(f"{path}: data.source: got '") and line.endswith("; no such file")
    assert "~nosuchuser9" in line


def test_generation_batch_counts_every_factor() -> None:
    preset = Preset.model_validate(
        {
            "grpo": {"per_device_batch_size": 3, "gradient_accumulation_steps": 5},
            "distributed": {"num_processes": 2, "num_machines": 7, "main_process_ip": "h"},
        }
    )
    assert generation_batch(preset) == 3 * 5 * 2 * 7


def test_dr_grpo_needs_max_completion_length() -> None:
    # TOML has no null, so only a programmatic preset (the app's form) can reach this.
    preset = Preset.model_validate({"grpo": {"loss_type": "dr_grpo"}})
    assert check_preset(preset, environment=False).ok
    preset.grpo.max_completion_length = None
    assert check_preset(preset, environment=False).errors == [
        "grpo.max_completion_length: loss_type dr_grpo normalises by it; set a value"
    ]


def test_existing_local_data_file_and_module_reward_are_accepted(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1=", "answer": "2"}\n')
    preset = Preset.model_validate(
        {"data": {"source": str(data)}, "rewards": {"functions": [{"name": "grpo_tui.tasks.rewards:length_penalty"}]}}
    )
    assert check_preset(preset, environment=False).errors == []


def test_lora_with_beta_is_a_note_not_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "[grpo]\nbeta = 0.04\n[peft]\nenabled = true\n")
    assert main(["presets", "validate", str(path)]) == 0
    err = capsys.readouterr().err
    assert "grpo.beta: 0.04 with LoRA: the reference model is the base with adapters disabled" in err


def test_fsdp_on_cpu_is_flagged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "[distributed]\nuse_cpu = true\nnum_processes = 2\nfsdp = true\n")
    assert main(["presets", "validate", str(path)]) == 0
    assert "distributed.fsdp: on the CPU accelerate runs DDP, not FSDP" in capsys.readouterr().err


def test_more_processes_than_gpus_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checks, "visible_gpu_count", lambda: 1)
    preset = Preset.model_validate({"distributed": {"num_processes": 2}})
    assert check_preset(preset).errors == [
        "distributed.num_processes: got 2; 1 GPU(s) visible on this machine (one process per GPU; or set distributed.use_cpu=true)"
    ]
    assert check_preset(preset, environment=False).ok
    cpu = Preset.model_validate({"distributed": {"num_processes": 2, "use_cpu": True}})
    assert check_preset(cpu).ok


def test_gpu_count_respects_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checks, "_nvml_count", lambda: 8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3")
    assert REAL_GPU_COUNT() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert REAL_GPU_COUNT() == 0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert REAL_GPU_COUNT() == 8


def test_validate_reports_machine_problems_as_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checks, "visible_gpu_count", lambda: 0)
    assert main(["presets", "validate", "qwen3-0.6b-gsm8k"]) == 0
    err = capsys.readouterr().err
    assert "warning (on this machine): distributed.num_processes: got 1; 0 GPU(s) visible" in err


def test_validate_reads_the_data_once_and_checks_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first row may be a parquet read (pyarrow import, file open): the template and the rewards share one.
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1", "answer": "2"}\n')
    path = write(tmp_path, f'[data]\nsource = "{data}"\nprompt_template = "{{prompt}}"\n')
    reads = []
    real = checks.first_row
    monkeypatch.setattr(checks, "first_row", lambda source: reads.append(source) or real(source))
    monkeypatch.setattr(checks, "visible_gpu_count", lambda: 0)
    assert main(["presets", "validate", str(path)]) == 0
    assert reads == [str(data)]  # one check run, one read (not one per check, nor per machine)
    assert "warning (on this machine): distributed.num_processes" in capsys.readouterr().err


def test_sub_batches_that_cover_the_rollout_are_notes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = "[grpo]\nper_device_batch_size = 8\ngradient_accumulation_steps = 2\n"
    noop = write(tmp_path, text + "generation_sub_batch = 16\nscoring_sub_batch = 8\n")
    assert main(["presets", "validate", str(noop)]) == 0
    err = capsys.readouterr().err
    assert "grpo.generation_sub_batch: 16 >= the 16 completions each device generates per step" in err
    assert "grpo.scoring_sub_batch: 8 >= per_device_batch_size 8, which scoring already uses" in err
    acting = Preset.model_validate(
        {
            "grpo": {
                "per_device_batch_size": 8,
                "gradient_accumulation_steps": 2,
                "generation_sub_batch": 15,
                "scoring_sub_batch": 4,
            }
        }
    )
    result = check_preset(acting, environment=False)
    assert result.ok and not [n for n in result.notes if "sub_batch" in n]
