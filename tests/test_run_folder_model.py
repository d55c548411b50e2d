"""A training run folder where a model is read (``maskrl eval/generate/estimate-pos-weights --model``,
``model.path`` of sft/train/plan, lm-eval's ``pretrained``) stands for its exported ``model/``; a run
that has not exported one (it stopped before its end) is a clear error naming what is missing.

One tiny LoRA run (``maskrl train``, 1 step, a checkpoint) is built once for the module; its folder
is compared with its ``model/`` (the bf16 base + float32 adapter path of a LoRA export included).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import TINY_CLI, TINY_RL, cli_sets
from maskrl.cli import main
from maskrl.rundir import run_model_folder

CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "countdown_diffu_grpo.yaml")
EVAL = ["--task", "countdown", "--gen-length", "16", "--block-length", "16", "--steps", "4", "--limit", "3"]
GEN = ["--prompt", "1,2,3>6:", "--gen-length", "8", "--block-length", "8", "--steps", "4"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished LoRA run: config.json, configs.jsonl, metrics.jsonl, tb/, checkpoints/step_1, model/."""
    out = tmp_path_factory.mktemp("runs") / "lora_run"
    assert main(["train", "--config", CONFIG, *TINY_CLI,
                 *cli_sets(*TINY_RL, "train.steps=1", "train.save_every=1", "model.lora_rank=4",
                           f"output_dir={out}")]) == 0
    assert (out / "model" / "adapter").is_dir() and (out / "checkpoints" / "step_1").is_dir()
    return out


def _crashed(run: Path, tmp: Path, keep_checkpoint: bool = True) -> Path:
    """A copy of ``run`` as a run that stopped before its end: no model/ (and maybe no checkpoint)."""
    dst = tmp / ("crashed" if keep_checkpoint else "crashed_early")
    shutil.copytree(run, dst, ignore=shutil.ignore_patterns("model", *(() if keep_checkpoint else ("checkpoints",))))
    return dst


def test_run_model_folder_rules(run, tmp_path):
    model = run / "model"
    assert run_model_folder(str(run)) == str(model) and run_model_folder(run) == model  # str stays str
    assert run_model_folder(str(model)) == str(model)  # a model folder: as given
    assert run_model_folder("GSAI-ML/LLaDA-8B-Instruct") == "GSAI-ML/LLaDA-8B-Instruct"  # a Hub id
    assert run_model_folder(str(tmp_path / "missing")) == str(tmp_path / "missing")  # load() reports it
    assert run_model_folder(str(tmp_path)) == str(tmp_path)  # a folder that is no run
    assert run_model_folder(None) is None and run_model_folder("") == ""
    sft_out = tmp_path / "sft_out"  # `maskrl sft` with the default --out writes only <output_dir>/model
    shutil.copytree(model, sft_out / "model")
    assert run_model_folder(sft_out) == sft_out / "model"


def test_eval_of_a_run_folder_is_the_eval_of_its_model(run, tmp_path, capsys):
    """bf16: the LoRA export is read as bf16 base + float32 adapter, the same either way."""
    for name, model in (("by_run", run), ("by_model", run / "model")):
        assert main(["eval", "--model", str(model), *EVAL, "--dtype", "bfloat16", "--out", str(tmp_path / name)]) == 0
    settings = [json.loads((tmp_path / n / "settings.json").read_text()) for n in ("by_run", "by_model")]
    assert settings[0] == settings[1] and settings[0]["model"] == str(run / "model")
    assert settings[0]["weights_sha256"]  # the export's weights, not an empty fingerprint of the run folder
    samples = [(tmp_path / n / "samples_L16.jsonl").read_text() for n in ("by_run", "by_model")]
    assert samples[0] == samples[1] and len(samples[0].splitlines()) == 3
    capsys.readouterr()
    outs = []
    for model in (run, run / "model"):
        assert main(["generate", "--model", str(model), *GEN]) == 0
        outs.append(capsys.readouterr().out.strip().splitlines()[-1])
    assert outs[0] == outs[1] and json.loads(outs[0])["prompt"] == "1,2,3>6:"


def test_lm_eval_pretrained_run_folder_is_base_plus_adapter(run):
    pytest.importorskip("lm_eval")
    from peft import PeftModel

    from maskrl.lm_eval_model import MaskrlLM

    lm, ref = (MaskrlLM(pretrained=str(p), dtype="bfloat16") for p in (run, run / "model"))
    assert lm.pretrained == ref.pretrained == str(run / "model")
    assert isinstance(lm.adapter.model, PeftModel)  # the LoRA export's training policy: base + adapter
    assert lm.sampler == ref.sampler  # the prompt card of model/ was read
    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(lm.adapter.logits(ids), ref.adapter.logits(ids))
    with pytest.raises(FileNotFoundError, match="no model/"):
        MaskrlLM(pretrained=str(_crashed(run, run.parent)))


def test_model_path_of_a_run_folder_in_train_and_plan(run, capsys):
    from maskrl.config import load_config
    from maskrl.models import load
    from maskrl.policy import load_policy

    cfg = load_config([CONFIG], [f"model.path={run}"])
    policy, export = load_policy(cfg), load(run / "model")
    with torch.no_grad():
        ids = torch.randint(0, 40, (1, 7), generator=torch.Generator().manual_seed(1))
        assert torch.equal(policy.logits(ids), export.logits(ids))
    assert main(["plan", "--config", CONFIG, *TINY_CLI, "--set", f"model.path={run}", "--no-search"]) == 0
    assert "PEAK" in capsys.readouterr().out


@pytest.mark.parametrize("what", ["no_model", "no_checkpoint", "no_weights"])
def test_a_run_without_its_export_is_a_clear_error(run, tmp_path, capsys, what):
    if what == "no_weights":  # model/ begun but not written out (no weight file)
        folder = tmp_path / "partial"
        shutil.copytree(run, folder, ignore=shutil.ignore_patterns("*.safetensors"))
        shutil.copytree(run / "checkpoints", folder / "checkpoints", dirs_exist_ok=True)
    else:
        folder = _crashed(run, tmp_path, keep_checkpoint=what == "no_model")
    for cmd in (["eval", "--model", str(folder), *EVAL, "--out", str(tmp_path / "ev")],
                ["generate", "--model", str(folder), *GEN]):
        assert main(cmd) == 2
        err = capsys.readouterr().err
        assert f"--model {folder} is a training run folder" in err and "config.json" in err and "1 step logged" in err
        if what == "no_checkpoint":
            assert "no model/" in err and "saved no checkpoint" in err
        else:
            assert ("no model/" if what == "no_model" else "incomplete model/ (no weights)") in err
            assert "checkpoints/step_1" in err and "--resume" in err
    assert not (tmp_path / "ev").exists()  # refused before anything was written
    with pytest.raises(FileNotFoundError, match="model.path .* is a training run folder"):
        run_model_folder(str(folder), "model.path")
