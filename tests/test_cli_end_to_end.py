"""The commands a user runs, end to end on tiny settings: sft -> train (with checkpoint) -> resume -> eval -> generate."""
import json

from maskrl.cli import main
from conftest import TINY_CLI

TINY = TINY_CLI


def test_sft_train_resume_eval_generate(tmp_path, capsys):
    cfg = ["--config", "configs/countdown_diffu_grpo.yaml", *TINY, "--set", f"output_dir={tmp_path}/run"]
    assert main(["sft", *cfg, "--set", "sft.steps=3", "--set", "sft.batch_size=8", "--out", str(tmp_path / "sft")]) == 0
    assert (tmp_path / "sft" / "model.safetensors").is_file() and (tmp_path / "sft" / "tokenizer.json").is_file()
    train = [*cfg, "--set", f"model.path={tmp_path}/sft", "--set", "train.prompts_per_step=2", "--set", "train.group_size=2",
             "--set", "train.inner_iterations=1", "--set", "rollout.steps=4", "--set", "rollout.block_length=8"]
    assert main(["train", *train, "--set", "train.steps=2", "--set", "train.save_every=1"]) == 0
    run = tmp_path / "run"
    assert (run / "checkpoints" / "step_2" / "trainer_state.pt").is_file()
    assert (run / "model" / "model.safetensors").is_file()
    assert json.loads((run / "model" / "maskrl_prompt.json").read_text())["task"] == "countdown"  # prompt card
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    assert main(["train", *train, "--set", "train.steps=3", "--resume"]) == 0
    assert "resumed from" in capsys.readouterr().out
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert main(["eval", "--model", str(run / "model"), "--task", "countdown", "--gen-length", "16", "--block-length", "16",
                 "--steps", "4", "--limit", "4", "--out", str(tmp_path / "eval")]) == 0
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["task"] == "countdown"
    assert main(["generate", "--model", str(run / "model"), "--prompt", "1,2,3>6:", "--gen-length", "8",
                 "--block-length", "8", "--steps", "4"]) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(out)["prompt"] == "1,2,3>6:"


def test_missing_model_folder_is_a_clear_error(tmp_path, capsys):
    assert main(["eval", "--model", str(tmp_path / "nope"), "--task", "sudoku4x4", "--gen-length", "16",
                 "--block-length", "16"]) == 2
    assert "nope" in capsys.readouterr().err
