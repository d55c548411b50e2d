"""Found trying the README as a new user would (issue 50 §6): a bad task name is refused by `config`
as by `train`; refused commands leave no empty run folder; written files share one mode; the messages
say only what is true (SFT cache, chat template); errors are one line naming the file; `--explain`
prints plain text; a damaged checkpoint names itself and the earlier one that reads."""
import os
import stat

import pytest
import torch

from maskrl.cli import main


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _err_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if "error" in line]


def test_config_refuses_a_task_name_that_train_refuses(tmp_path, capsys):
    assert main(["config", "--set", "task.name=sudoku"]) == 2
    (cfg_err,) = _err_lines(capsys)
    assert main(["train", "--set", "task.name=sudoku", "--set", f"output_dir={tmp_path / 'runs' / 'wrongtask'}"]) == 2
    (train_err,) = _err_lines(capsys)
    assert cfg_err.removeprefix("maskrl config: ") == train_err.removeprefix("maskrl train: ")
    assert "task.name: unknown task 'sudoku'; valid tasks:" in cfg_err and "sudoku4x4" in cfg_err
    assert not (tmp_path / "runs").exists()  # refused before any folder is made


def test_a_command_refused_after_taking_its_folder_leaves_nothing(tmp_path, capsys):
    (tmp_path / "bad.csv").write_text("")
    out = tmp_path / "runs" / "byo-bad" / "sft"
    rc = main(["sft", "--set", "task.name=file", "--set", "task.prompt_template={q}=", "--set",
               f"task.file.train={tmp_path / 'bad.csv'}", "--set", f"task.data_path={tmp_path / 'bad.csv'}",
               "--out", str(out)])
    assert rc == 2 and not (tmp_path / "runs").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"maskrl sft: error: {tmp_path / 'bad.csv'}: the file is empty (expected a header line of column names)"
    assert not any("StopIteration" in line or "datasets" in line for line in err)


def test_run_lock_removes_only_the_empty_folders_it_created(tmp_path):
    from maskrl.rundir import run_lock

    (tmp_path / "runs").mkdir()
    with run_lock(tmp_path / "runs" / "a" / "b", "test"):
        pass
    assert sorted(os.listdir(tmp_path / "runs")) == []
    with run_lock(tmp_path / "runs" / "a" / "b", "test"):
        (tmp_path / "runs" / "a" / "b" / "result.json").write_text("{}")
    assert os.listdir(tmp_path / "runs" / "a" / "b") == ["result.json"]


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_a_saved_model_has_one_usual_file_mode(tmp_path, mask):
    from maskrl.models import build_tiny, save_model

    old = os.umask(mask)
    try:
        folder = save_model(build_tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32), tmp_path / "m")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir() if p.is_file()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o666 & ~mask}, modes


def test_the_demo_interrupt_hint_mentions_an_sft_cache_only_when_there_is_one(tmp_path):
    from maskrl.demo import interrupt_hint

    assert "no SFT model was cached yet" in interrupt_hint(tmp_path) and "is kept" not in interrupt_hint(tmp_path)
    (tmp_path / "sft-cache" / "abc").mkdir(parents=True)
    assert "no SFT model was cached yet" in interrupt_hint(tmp_path)  # a folder without a saved model is no cache
    (tmp_path / "sft-cache" / "abc" / "maskrl_sft.json").write_text("{}")
    assert f"its cached SFT model ({tmp_path / 'sft-cache' / 'abc'}) is kept" in interrupt_hint(tmp_path)
    assert "no SFT model was cached yet" in interrupt_hint(None)  # stopped before its config was read


def test_an_evaluation_reports_its_chat_template_once(tmp_path, monkeypatch):
    import maskrl.evaluate as ev
    from maskrl.models import build_tiny, save_model

    model = save_model(build_tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32), tmp_path / "m")
    data = tmp_path / "d.jsonl"
    data.write_text('{"q": "1+1", "answer": "2"}\n{"q": "2+2", "answer": "4"}\n')
    monkeypatch.setattr(ev, "complete", lambda adapter, prompts, *a, **k: ["2"] * len(prompts))
    summary = ev.run_harness(model=model, task_name="file", gen_lengths=[8], block_length=8, data_path=data,
                             out_dir=tmp_path / "eval", device="cpu", progress=False, prompt_template="{q}=")
    assert summary["chat_template"] is False and summary["settings_used"]["chat_template"]["value"] is False
    md = summary["markdown"]
    assert "chat template: none" in md and "chat_template off (default on, but the tokenizer has no chat template)" in md
    assert "chat_template on" not in md


def test_generate_reports_its_chat_template_once(tmp_path, capsys):
    from maskrl.models import build_tiny, save_model

    model = save_model(build_tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32), tmp_path / "m")
    assert main(["generate", "--model", str(model), "--prompt", "1+1=", "--gen-length", "4", "--block-length", "4"]) == 0
    err = capsys.readouterr().err
    assert "chat_template off (default on, but the tokenizer has no chat template)" in err and "True" not in err


def test_explain_prints_plain_text():
    from maskrl.config import explain
    from maskrl.config.explain import plain_text

    assert plain_text("``x`` and :class:`~maskrl.a.B`, :func:`maskrl.f`, :ref:`the doc <target>`, `y`, **z**, "
                      "*w*, a*b*c, 2 * 3 * 4") == "x and B, maskrl.f, the doc, y, z, w, a*b*c, 2 * 3 * 4"
    for section in ("model", "model.tiny", "task", "task.file", "rollout", "eval", "sft", "train", "objective",
                    "likelihood", "credit"):
        text = explain(section)
        assert "``" not in text and ":class:`" not in text and ":func:`" not in text and ":mod:`" not in text, section


def _fake_checkpoints(run, steps):
    from safetensors.torch import save_file

    from maskrl.training.checkpoint import TRAINER_STATE

    for k in steps:
        d = run / "checkpoints" / f"step_{k}"
        d.mkdir(parents=True)
        save_file({"w": torch.arange(4000, dtype=torch.float32)}, str(d / "model.safetensors"))
        torch.save({"step": k}, d / TRAINER_STATE)
        torch.save({"state": {}}, d / "optimizer.bin")
    return run / "checkpoints"


def _cut(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def test_a_damaged_checkpoint_is_one_line_naming_the_file_and_the_earlier_one_that_reads(tmp_path):
    from maskrl.training.checkpoint import CheckpointError, read_checkpoint_state, unreadable_file

    ck = _fake_checkpoints(tmp_path / "run", [1, 2, 3])
    assert all(unreadable_file(ck / f"step_{k}") is None for k in (1, 2, 3))
    _cut(ck / "step_3" / "trainer_state.pt")
    _cut(ck / "step_2" / "model.safetensors")
    with pytest.raises(CheckpointError) as e:
        read_checkpoint_state(ck / "step_3")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{ck / 'step_3' / 'trainer_state.pt'}: cannot be read (")
    assert msg.endswith(f"the earlier checkpoint {ck / 'step_1'} reads: resume from it with --resume {ck / 'step_1'}")
    assert unreadable_file(ck / "step_2")[0] == ck / "step_2" / "model.safetensors"
    _cut(ck / "step_1" / "optimizer.bin", 0.9)
    with pytest.raises(CheckpointError, match=r"no earlier checkpoint of this run reads: start the run again"):
        read_checkpoint_state(ck / "step_3")


def test_resuming_from_a_cut_short_weights_file_is_one_line(tmp_path):
    """accelerate's load_state through maskrl's loader on a model.safetensors cut short."""
    from accelerate import Accelerator

    from maskrl.training.checkpoint import CheckpointError, load_checkpoint_state

    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(64, 64))
    for k in (1, 2):
        acc.save_state(str(tmp_path / "checkpoints" / f"step_{k}"), safe_serialization=True)
        torch.save({"step": k}, tmp_path / "checkpoints" / f"step_{k}" / "trainer_state.pt")
    _cut(tmp_path / "checkpoints" / "step_2" / "model.safetensors")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint_state(acc, tmp_path / "checkpoints" / "step_2")
    assert "\n" not in str(e.value) and "step_2/model.safetensors: cannot be read" in str(e.value)
    assert str(e.value).endswith(f"--resume {tmp_path / 'checkpoints' / 'step_1'}")
    load_checkpoint_state(acc, tmp_path / "checkpoints" / "step_1")  # the earlier one does read
    assert model.weight.shape == (64, 64)


def test_a_cut_short_model_folder_is_one_line_before_anything_loads(tmp_path, capsys):
    from maskrl.models import build_tiny, save_model

    folder = save_model(build_tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32), tmp_path / "m")
    _cut(folder / "model.safetensors")
    data = tmp_path / "d.jsonl"
    data.write_text('{"q": "1+1", "answer": "2"}\n')
    assert main(["eval", "--model", str(folder), "--task", "file", "--data", str(data), "--out", str(tmp_path / "e")]) == 2
    assert main(["sft", "--set", f"model.path={folder}", "--out", str(tmp_path / "s")]) == 2
    errs = capsys.readouterr().err.strip().splitlines()
    for cmd, key, line in zip(("eval", "sft"), ("--model", "model.path"), errs[-2:]):
        assert line.startswith(f"maskrl {cmd}: error: {key}: {folder / 'model.safetensors'} cannot be read (")
    assert not (tmp_path / "e").exists() and not (tmp_path / "s").exists()


def test_the_demo_sft_cache_is_keyed_by_the_package_code_too(monkeypatch):
    """A code change must not serve an SFT model made by older code: the cache key holds the package's
    source digest beside the settings."""
    from maskrl import demo
    from maskrl.config import RunConfig

    cfg = RunConfig()
    digest = demo.package_source_digest()
    assert len(digest) == 16 and digest == demo.package_source_digest()  # deterministic
    keys = set()
    for code in ("a" * 16, "b" * 16):
        monkeypatch.setattr(demo, "package_source_digest", lambda code=code: code)
        keys.add(demo.sft_cache_key(cfg))
    assert len(keys) == 2
    monkeypatch.setattr(demo, "package_source_digest", lambda: "a" * 16)
    assert demo.sft_cache_key(cfg) in keys  # same code, same settings: the same key
