"""Issue 13 items 8 and 9: a saved model carries its prompt format (prompt card) and `maskrl eval` /
`maskrl generate` use it; command-line papercuts (--set strings, --dtype names, steps > gen_length,
generate checks flags before loading)."""
from __future__ import annotations

import csv
import json

import pytest
import torch

import maskrl.models
from maskrl.cli import main
from maskrl.config import ConfigError, load_config, parse_override
from maskrl.models import build_tiny, save_model
from maskrl.models.loading import parse_dtype
from maskrl.pipeline import PROMPT_CARD, read_prompt_card, save_prompt_card
from maskrl.sampling import SamplerConfig
from maskrl.tasks import get_task
from conftest import TINY_MODEL, cli_sets

TINY = cli_sets(*TINY_MODEL, "task.train_size=32")


@pytest.fixture(scope="module")
def sudoku_csv(tmp_path_factory):
    task = get_task("sudoku4x4")
    path = tmp_path_factory.mktemp("data") / "sudoku.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["Puzzle", "Solution"])
        for ex in task.generate(3, seed=5):
            w.writerow([ex.fields["puzzle"], ex.fields["solution"]])
    return path


def _rows(path):
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


# ---------------------------------------------------------------- item 8
def test_trained_model_is_evaluated_with_its_own_prompt_format(tmp_path, sudoku_csv, capsys):
    """maskrl sft with a compact template and no chat template, then maskrl eval with no prompt flags."""
    assert main(["sft", *TINY, "--set", f"output_dir={tmp_path}/run", "--set", "task.prompt_template={puzzle}=",
                 "--set", "model.chat_template=false", "--set", "sft.steps=2", "--set", "sft.batch_size=4",
                 "--set", f"task.data_path={sudoku_csv}", "--set", "eval.gen_length=16", "--set", "eval.block_length=8",
                 "--set", "eval.steps=8", "--out", str(tmp_path / "m")]) == 0
    card = read_prompt_card(tmp_path / "m")
    assert card["task"] == "sudoku4x4" and card["prompt_template"] == "{puzzle}=" and card["chat_template"] is False
    assert (card["eval_sampler"]["gen_length"], card["eval_sampler"]["block_length"], card["eval_sampler"]["steps"]) \
        == (16, 8, 8)
    capsys.readouterr()
    assert main(["eval", "--model", str(tmp_path / "m"), "--task", "sudoku4x4", "--data", str(sudoku_csv),
                 "--out", str(tmp_path / "ev")]) == 0
    printed = capsys.readouterr().out
    rows = _rows(tmp_path / "ev" / "samples_L16.jsonl")
    puzzles = [r[0] for r in csv.reader(open(sudoku_csv))][1:]
    assert [r["prompt"] for r in rows] == [p + "=" for p in puzzles]
    summary = json.loads((tmp_path / "ev" / "summary.json").read_text())
    used = summary["settings_used"]
    assert used["prompt_template"] == {"value": "{puzzle}=", "from": "model card"}
    assert used["chat_template"] == {"value": False, "from": "model card"}
    assert summary["results"][0]["sampler"]["steps"] == 8 and summary["results"][0]["sampler"]["block_length"] == 8
    assert "prompt_template '{puzzle}=' (model card)" in printed and "maskrl_prompt.json" in printed
    # flags override the card, and say so
    assert main(["eval", "--model", str(tmp_path / "m"), "--task", "sudoku4x4", "--data", str(sudoku_csv),
                 "--out", str(tmp_path / "ev2"), "--prompt-template", "P {puzzle}:", "--gen-length", "8",
                 "--block-length", "8"]) == 0
    summary = json.loads((tmp_path / "ev2" / "summary.json").read_text())
    assert [r["prompt"] for r in _rows(tmp_path / "ev2" / "samples_L8.jsonl")] == [f"P {p}:" for p in puzzles]
    assert summary["settings_used"]["prompt_template"]["from"] == "flag"
    assert summary["settings_used"]["steps"] == {"value": 0, "from": "default"}  # card's steps are for L=16
    assert summary["results"][0]["sampler"]["steps"] == 4


def test_card_for_another_task_is_ignored(tmp_path):
    from maskrl.evaluate import resolve_prompt_settings

    save_prompt_card(tmp_path, get_task("sudoku4x4", "{puzzle}="), False, SamplerConfig(16, 16, 16))
    used = resolve_prompt_settings(tmp_path, "countdown")
    assert used["prompt_template"] == {"value": None, "from": "default"}
    assert used["chat_template"] == {"value": True, "from": "default"}
    assert "ignored" in used["card"]["value"]
    assert resolve_prompt_settings(tmp_path / "nothing", "countdown")["card"]["value"] == "none"


def test_broken_card_is_a_clear_error(tmp_path):
    (tmp_path / PROMPT_CARD).write_text('{"task": "x"}')
    with pytest.raises(ValueError, match="maskrl_prompt.json: expected an object"):
        read_prompt_card(tmp_path)


def test_generate_uses_the_card_and_prints_it(tmp_path, capsys, monkeypatch):
    a = build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=32)
    save_model(a, tmp_path / "m")
    save_prompt_card(tmp_path / "m", get_task("sudoku4x4", "{puzzle}="), False, SamplerConfig(12, 4, 6))
    seen = {}
    import maskrl.evaluate as ev

    real = ev.complete

    def spy(adapter, prompts, sampler, **kw):
        seen["sampler"] = sampler
        return real(adapter, prompts, sampler, **kw)

    monkeypatch.setattr(ev, "complete", spy)
    assert main(["generate", "--model", str(tmp_path / "m"), "--prompt", "1234"]) == 0
    err = capsys.readouterr().err
    s = seen["sampler"]
    assert (s.gen_length, s.block_length, s.steps) == (12, 4, 6)
    assert "gen_length 12 (model card)" in err and "chat_template False (model card)" in err


def test_generate_decodes_with_the_cards_rule_as_eval_does_unless_a_flag_says_otherwise(tmp_path, capsys,
                                                                                         monkeypatch):
    """The card's decoding rule (remasking, schedule, threshold, cache, early_stop, ...) was dropped by
    ``maskrl generate``, which took its argparse defaults (low_confidence, fixed, cache none) while
    ``maskrl eval`` decodes the same folder with the card's rule: the same model decoded two ways, silently."""
    a = build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=32, block_size=4)
    save_model(a, tmp_path / "m")
    card = SamplerConfig(8, 4, 8, remasking="low_confidence_dynamic", threshold=0.7, cache="block", early_stop=True)
    save_prompt_card(tmp_path / "m", get_task("sudoku4x4", "{puzzle}="), False, card)
    seen = []
    import maskrl.evaluate as ev

    real = ev.complete

    def spy(adapter, prompts, sampler, **kw):
        seen.append(sampler)
        return real(adapter, prompts, sampler, **kw)

    monkeypatch.setattr(ev, "complete", spy)
    assert main(["generate", "--model", str(tmp_path / "m"), "--prompt", "1234"]) == 0
    assert seen[-1] == card
    err = capsys.readouterr().err
    assert "remasking low_confidence_dynamic (model card)" in err and "cache block (model card)" in err, err
    assert main(["generate", "--model", str(tmp_path / "m"), "--prompt", "1234", "--cache", "none",
                 "--remasking", "sequential", "--threshold", "0.5"]) == 0
    assert seen[-1] == SamplerConfig(8, 4, 8, remasking="sequential", threshold=0.5, cache="none", early_stop=True)
    assert "cache none (flag)" in capsys.readouterr().err


# ---------------------------------------------------------------- item 9
@pytest.mark.parametrize("text", ["{puzzle}=", "{puzzle}", "Q: {q} [a, b]: ", "true", "- {x}", "*x", "a: b"])
def test_set_keeps_string_values_as_typed(text):
    cfg = load_config([], [f"task.prompt_template={text}"])
    assert cfg.task.prompt_template == text


def test_set_quoted_string_is_unquoted_and_bad_yaml_for_numbers_names_key():
    assert load_config([], ['output_dir="runs/a b"']).output_dir == "runs/a b"
    with pytest.raises(ConfigError, match=r"train.lr: the value '\{1e-4' is not valid YAML"):
        load_config([], ["train.lr={1e-4"])
    assert parse_override("a.b.c=[1, 2]") == {"a": {"b": {"c": [1, 2]}}}


def test_cli_set_with_braces_is_not_a_traceback(tmp_path, capsys):
    # a bad value elsewhere makes the command stop at config time, after the template parsed fine
    rc = main(["sft", "--set", "task.prompt_template={puzzle}=", "--set", "train.lr=abc", "--set", f"output_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert rc == 2 and "train.lr" in err and "Traceback" not in err


@pytest.mark.parametrize("name,want", [("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16),
                                       ("torch.float16", torch.float16), ("fp32", torch.float32),
                                       (torch.bfloat16, torch.bfloat16)])
def test_dtype_names(name, want):
    assert parse_dtype(name) == want


@pytest.mark.parametrize("bad", ["bf17", "int8", "nn", None, torch.int64])
def test_bad_dtype_shows_value_and_valid_names(bad):
    with pytest.raises(ValueError) as e:
        parse_dtype(bad)
    assert repr(bad) in str(e.value) and "bfloat16" in str(e.value)


def test_eval_dtype_bf16_works_and_bad_dtype_is_reported_before_loading(tmp_path, sudoku_csv, capsys, monkeypatch):
    a = build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=32)
    save_model(a, tmp_path / "m")
    assert main(["eval", "--model", str(tmp_path / "m"), "--task", "sudoku4x4", "--data", str(sudoku_csv), "--limit", "1",
                 "--gen-length", "8", "--block-length", "8", "--steps", "4", "--dtype", "bf16",
                 "--out", str(tmp_path / "ev")]) == 0
    assert json.loads((tmp_path / "ev" / "summary.json").read_text())["dtype"] == "bfloat16"
    monkeypatch.setattr(maskrl.models, "load", lambda *a, **k: pytest.fail("model loaded before the flags were checked"))
    capsys.readouterr()
    for cmd in (["eval", "--task", "sudoku4x4", "--data", str(sudoku_csv)], ["generate", "--prompt", "x"]):
        assert main([*cmd, "--model", str(tmp_path / "m"), "--dtype", "bf17"]) == 2
        err = capsys.readouterr().err
        assert "'bf17'" in err and "bfloat16" in err


@pytest.mark.parametrize("gen_length,block_length,steps", [(8, 8, 16), (16, 4, 32), (4, 4, 5)])
def test_more_steps_than_tokens_is_refused(gen_length, block_length, steps):
    with pytest.raises(ValueError, match="gen_length"):
        SamplerConfig(gen_length=gen_length, block_length=block_length, steps=steps)


def test_config_steps_above_gen_length_names_section():
    with pytest.raises(ConfigError, match=r"rollout\.steps: steps \(=32\) must be <= gen_length"):
        load_config([], ["rollout.steps=32"])


@pytest.mark.parametrize("flags", [["--steps", "64", "--gen-length", "8", "--block-length", "8"],
                                   ["--gen-length", "12", "--block-length", "8"],
                                   ["--temperature", "-1"]])
def test_generate_checks_flags_before_loading(tmp_path, capsys, monkeypatch, flags):
    monkeypatch.setattr(maskrl.models, "load", lambda *a, **k: pytest.fail("model loaded before the flags were checked"))
    assert main(["generate", "--model", str(tmp_path / "no-model-needed"), "--prompt", "x", *flags]) == 2
    assert "generate: error" in capsys.readouterr().err


# --- issue 20 item 3: prompt + completion lengths against the model's positions ------------------

def test_check_lengths_names_the_row_and_the_limit():
    from maskrl.pipeline import check_lengths

    adapter = build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=40)
    assert adapter.max_positions == 40
    check_lengths(adapter, ["a" * 23], 16)  # bos + 23 + 16 = 40 fits exactly
    with pytest.raises(ValueError, match=r"row 7: the prompt is 25 tokens; with rollout\.gen_length 16 that is 41 > "
                                         r"the model's 40 positions.*1 of 2 prompts"):
        check_lengths(adapter, ["ab", "a" * 24], 16, "rollout.gen_length", ["row 3", "row 7"])
    with pytest.raises(ValueError, match=r"--gen-length 40 leaves no room for a prompt: the model has 40 positions"):
        check_lengths(adapter, ["ab"], 40, "--gen-length")


def test_commands_refuse_prompts_that_do_not_fit_before_any_work(tmp_path, sudoku_csv):
    """The tiny model has 512 positions: a 600-character template (sft/train, naming the row), a
    640-token completion (generate), an 801-token prompt (eval) stop with one clear error."""
    long = "x" * 600 + "{puzzle}="
    for cmd in ("sft", "train"):
        assert main([cmd, *TINY, "--set", f"task.prompt_template={long}", "--set", f"output_dir={tmp_path / cmd}",
                     "--set", f"task.data_path={sudoku_csv}"]) == 2
    assert not (tmp_path / "train" / "metrics.jsonl").exists()
    folder = tmp_path / "m"
    save_model(build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), folder)
    assert main(["generate", "--model", str(folder), "--prompt", "1234", "--gen-length", "640",
                 "--block-length", "640"]) == 2
    assert main(["generate", "--model", str(folder), "--prompt", "1" * 801, "--gen-length", "16"]) == 2
    assert main(["eval", "--model", str(folder), "--task", "sudoku4x4", "--data", str(sudoku_csv), "--gen-length", "16",
                 "--block-length", "16", "--prompt-template", long, "--out", str(tmp_path / "ev")]) == 2
    assert not list((tmp_path / "ev").glob("samples*"))


def test_commands_refuse_prompts_messages(tmp_path, sudoku_csv, capsys):
    long = "x" * 600 + "{puzzle}="
    main(["sft", *TINY, "--set", f"task.prompt_template={long}", "--set", f"task.data_path={sudoku_csv}"])
    err = capsys.readouterr().err
    # bos + 600 + 16 puzzle digits + "=" = 618 tokens
    assert "training row 0: the prompt is 618 tokens; with rollout.gen_length 16 that is 634 > the model's 512" in err
    folder = tmp_path / "m"
    save_model(build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), folder)
    main(["eval", "--model", str(folder), "--task", "sudoku4x4", "--data", str(sudoku_csv), "--gen-length", "16",
          "--block-length", "16", "--prompt-template", long, "--out", str(tmp_path / "ev")])
    assert f"row 0 of {sudoku_csv}: the prompt is" in capsys.readouterr().err
