"""Smoke test of the LLaDA2 path through the real CLI (issue 52): ``maskrl train`` with the shipped
``configs/llada2_mini_gsm8k_diffu_grpo.yaml`` shrunk to a tiny LLaDA2 (2 layers, 4 experts of 16, 2 active + 1
shared, the character tokenizer; LoRA r 4 on the recipe's bf16 base, the family's block 32 and decoding rule)
for 2 RL steps, then ``maskrl eval`` on the exported ``model/``, and the export read back by
:func:`maskrl.models.load` in the family's layout. About 3 s on one CPU core, so it runs in the default suite
(it skips without the GSM8K data)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import cli_sets
from maskrl.cli import main
from maskrl.models import load, save_model
from maskrl.tasks import default_data_dir
from test_llada2_export import _tiny_llada2_with_tokenizer

RECIPE = str(Path(__file__).resolve().parents[1] / "configs" / "llada2_mini_gsm8k_diffu_grpo.yaml")
#: the recipe's decoding (block 32, threshold 0.95, block cache, early stop) at 32 tokens; a 2-step run
SHRUNK = ("model.lora_rank=4", "model.lora_alpha=8", "model.chat_template=false", "task.train_size=8",
          "rollout.gen_length=32", "rollout.steps=32", "eval.gen_length=32", "eval.steps=32", "train.steps=2",
          "train.prompts_per_step=2", "train.group_size=2", "train.inner_iterations=2", "train.micro_batch_size=2",
          "train.save_every=2")


def test_llada2_recipe_trains_evaluates_exports_and_reloads_through_the_cli(tmp_path):
    data = default_data_dir()
    if data is None or not (data / "gsm8k").is_dir():
        pytest.skip("no gsm8k data (set MASKRL_DATA_DIR)")
    base = tmp_path / "base"
    with torch.random.fork_rng():  # GSM8K prompts in characters: up to ~650 positions
        save_model(_tiny_llada2_with_tokenizer(seed=0, max_positions=1024), base)
    run = tmp_path / "run"
    assert main(["train", "--config", RECIPE, *cli_sets(*SHRUNK, f"model.path={base}", f"output_dir={run}")]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [r["step"] for r in rows if "reward" in r][-1] == 2 and (run / "checkpoints" / "step_2").is_dir()

    model = run / "model"
    cfg = json.loads((model / "config.json").read_text())
    assert (cfg["model_type"], cfg["architectures"], cfg["maskrl_lora"]["base_dtype"]) == (
        "llada2_moe", ["LLaDA2MoeModelLM"], "bfloat16")
    names = set().union(*(load_file(f).keys() for f in model.glob("*.safetensors")))
    assert {"model.layers.1.mlp.experts.3.down_proj.weight", "model.layers.1.mlp.gate.expert_bias",
            "model.layers.0.attention.query_key_value.weight", "lm_head.weight"} <= names
    assert not any("lora_" in n for n in names)

    back = load(model, dtype=torch.bfloat16)  # bf16 base + the float32 adapter, as trained
    assert (back.family, back.block_size, back.mask_id) == ("llada2", 32, back.tokenizer.mask_token_id)
    bias = back.model.get_base_model().model.layers[1].mlp.gate.expert_bias
    assert bias.dtype == torch.bfloat16

    assert main(["eval", "--model", str(run), "--task", "gsm8k", "--gen-length", "32", "--limit", "2",
                 "--out", str(tmp_path / "eval")]) == 0
    (r,) = json.loads((tmp_path / "eval" / "summary.json").read_text())["results"]
    assert {k: r["sampler"][k] for k in ("block_length", "remasking", "threshold", "cache", "early_stop")} == {
        "block_length": 32, "remasking": "low_confidence_dynamic", "threshold": 0.95, "cache": "block",
        "early_stop": True}
