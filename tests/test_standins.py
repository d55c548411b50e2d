"""Real-width stand-ins (``maskrl.models.standins``) and the 8B rehearsal harness (``benchmarks/rehearsal/rehearse_8b.py``).

The published shapes are checked without allocating a weight (tensor shapes and parameter counts against
the plan's meta-device model and the published LLaDA-8B count); folders are written at a reduced width
(the real vocabularies and ids, width / 16) and loaded through ``maskrl.models.load``, whose logits must
equal the family's own layout reader (a plain float32 forward from the checkpoint names). The smoke test
runs the rehearsal itself on one recipe for one step on 2 processes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import WAIT_CAP_S
import torch

from maskrl.models import load, save_model
from maskrl.models.standins import (SDAR_8B_CONFIG, DREAM_7B_CONFIG, LLADA_8B_CONFIG, SPECIAL_IDS, TOKENIZER_SIZE, build_tokenizer,
                                    family_config, read_tensors, reference_logits, tensor_shapes, write_standin)

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ["Janet has 3 apples and buys 5 more. How many apples does she have?",
          "Using the numbers 3, 5, 7 create an equation that equals 22."]


def _params(cfg: dict) -> int:
    n = 0
    for shape in tensor_shapes(cfg).values():
        k = 1
        for s in shape:
            k *= s
        n += k
    return n


def test_published_shapes_match_the_published_parameter_count_and_the_plans_model():
    """LLaDA-8B-Instruct has 8,015,581,184 parameters (its published count); both families' tensor shapes
    give exactly the parameter count of the plan's transformers model built on the meta device."""
    from maskrl.plan import KNOWN_MODELS, ModelShape, param_memory

    assert _params(LLADA_8B_CONFIG) == 8_015_581_184
    for cfg, hub in ((LLADA_8B_CONFIG, "GSAI-ML/LLaDA-8B-Instruct"), (DREAM_7B_CONFIG, "Dream-org/Dream-v0-Instruct-7B"),
                     (SDAR_8B_CONFIG, "Gen-Verse/TraDo-8B-Instruct")):
        for layers in (1, 2):
            fam = "llada" if "d_model" in cfg else cfg["model_type"].lower()
            shape = ModelShape(**{**KNOWN_MODELS[hub], "num_layers": layers})
            pm = param_memory(shape, torch.bfloat16, None)
            assert _params(family_config(fam, layers)) == pm["params"], (fam, layers)


def test_family_config_keeps_every_published_value_but_the_depth():
    for fam, full, key in (("llada", LLADA_8B_CONFIG, "n_layers"), ("dream", DREAM_7B_CONFIG, "num_hidden_layers"),
                           ("sdar", SDAR_8B_CONFIG, "num_hidden_layers")):
        cfg = family_config(fam, 2)
        assert cfg[key] == 2 and full[key] in (32, 28, 36)
        assert {k: v for k, v in cfg.items() if k not in (key, "max_window_layers")} == \
               {k: v for k, v in full.items() if k not in (key, "max_window_layers")}
    with pytest.raises(ValueError, match="family"):
        family_config("gpt2", 2)
    with pytest.raises(ValueError, match="num_layers"):
        family_config("llada", 0)


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_tokenizer_has_the_family_size_ids_and_template(family):
    tok = build_tokenizer(family, CORPUS, bpe_size=512)
    assert len(tok) == TOKENIZER_SIZE[family]
    for text, i in SPECIAL_IDS[family].items():
        assert tok.convert_tokens_to_ids(text) == i
    mask = {"llada": 126336, "dream": 151666, "sdar": 151669}[family]
    assert tok.mask_token_id == mask and tok.eos_token_id == tok.pad_token_id == {"llada": 126081, "dream": 151643,
                                                                                  "sdar": 151643}[family]
    chat = tok.apply_chat_template([{"role": "user", "content": CORPUS[0]}], add_generation_prompt=True, tokenize=False)
    ids = tok(chat, add_special_tokens=False).input_ids
    assert tok.decode(ids) == chat  # byte-level BPE: lossless
    start = {"llada": "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\n",
             "dream": "<|im_start|>system\n", "sdar": "<|im_start|>user\n"}[family]
    assert chat.startswith(start) and CORPUS[0] in chat
    assert ids[0] == {"llada": 126080, "dream": 151644, "sdar": 151644}[family]
    # the same corpus gives the same tokenizer
    again = build_tokenizer(family, CORPUS, bpe_size=512)
    assert again.get_vocab() == tok.get_vocab() and again(chat).input_ids == tok(chat).input_ids


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("standins")
    return {fam: write_standin(root / fam, fam, num_layers=2, width_divisor=16, corpus=CORPUS, bpe_size=512, seed=3)
            for fam in ("llada", "dream", "sdar")}


@pytest.mark.numerics
@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_standin_loads_with_the_family_ids_and_matches_the_layout_reader(folders, family):
    """The real vocabulary, ids and layout at width / 16: maskrl's loader and the independent reader agree."""
    folder = folders[family]
    ad = load(folder, dtype="float32")
    assert ad.family == family
    assert (ad.mask_id, ad.eos_id, ad.pad_id) == {"llada": (126336, 126081, 126081),
                                                  "dream": (151666, 151643, 151643),
                                                  "sdar": (151669, 151643, 151643)}[family]
    assert ad.block_size == (4 if family == "sdar" else None)
    if family == "llada":
        assert ad.stop_ids == (126348,)
    if family == "sdar":  # generation_config.json's [151645, 151643]: both end a completion
        assert ad.stop_ids == (151645,)
    v = {"llada": 126464, "dream": 152064, "sdar": 151936}[family]
    assert ad.model.get_output_embeddings().weight.shape[0] == v
    if family == "dream":  # the output layer has rows no tokenizer id reaches, as Dream-7B does
        assert v - len(ad.tokenizer) == 397
    chat = ad.tokenizer.apply_chat_template([{"role": "user", "content": CORPUS[1]}], add_generation_prompt=True,
                                            tokenize=False)
    ids = torch.tensor([ad.tokenizer(chat, add_special_tokens=False).input_ids + [ad.mask_id] * 4])
    with torch.no_grad():
        got = ad.logits(ids).float()
    ref = reference_logits(folder, ids)
    lo = 1 if family == "dream" else 0
    scale = ref[:, lo:].abs().max()
    assert (got[:, lo:] - ref[:, lo:]).abs().max() <= 1e-4 * scale  # float32 both; summation order differs
    # the reader is sensitive to the layout: reading Dream's logits unshifted puts them one position off
    if family == "dream":
        raw = reference_logits(folder, ids, aligned=False)
        assert (raw[:, 1:-1] - got[:, 1:-1]).abs().max() > 100 * 1e-4 * scale
    if family == "sdar":  # block-causal: a later block's tokens change no earlier block's logits
        later = ids.clone()
        later[0, 4:] = 200
        moved = reference_logits(folder, later)
        assert torch.equal(moved[:, :4], ref[:, :4]) and (moved[:, 4:] - ref[:, 4:]).abs().max() > 1e-2 * scale


def test_standin_weights_follow_the_seed_not_the_sharding(tmp_path, folders):
    a = read_tensors(folders["llada"], ["model.transformer.blocks.1.q_proj.weight", "model.transformer.ln_f.weight"])
    b_dir = write_standin(tmp_path / "b", "llada", num_layers=1, width_divisor=16, corpus=CORPUS, bpe_size=512, seed=3)
    c_dir = write_standin(tmp_path / "c", "llada", num_layers=2, width_divisor=16, corpus=CORPUS, bpe_size=512, seed=4)
    b = read_tensors(b_dir, ["model.transformer.blocks.0.q_proj.weight"])
    c = read_tensors(c_dir, ["model.transformer.blocks.1.q_proj.weight"])
    assert a["model.transformer.blocks.1.q_proj.weight"].dtype == torch.bfloat16
    assert not torch.equal(a["model.transformer.blocks.1.q_proj.weight"], c["model.transformer.blocks.1.q_proj.weight"])
    assert not torch.equal(a["model.transformer.blocks.1.q_proj.weight"], b["model.transformer.blocks.0.q_proj.weight"])
    again = write_standin(tmp_path / "d", "llada", num_layers=2, width_divisor=16, corpus=CORPUS, bpe_size=512, seed=3)
    d = read_tensors(again)
    assert all(torch.equal(d[k], v) for k, v in read_tensors(folders["llada"]).items())
    w = a["model.transformer.ln_f.weight"].float()
    assert 0.8 < float(w.min()) and float(w.max()) < 1.2 and float(w.std()) > 0.01  # norms near 1, not all ones
    index = json.loads((folders["llada"] / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 4  # embedding, 2 blocks, head


@pytest.mark.numerics
@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_the_layout_reader_reads_maskrls_exports(folders, family, tmp_path):
    """An export of a changed model (``save_model``) read by the family's layout reader gives the exported
    adapter's logits: the reader checks exports, not only stand-ins."""
    ad = load(folders[family], dtype="float32")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ad.model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
    out = save_model(ad, tmp_path / "export")
    ids = torch.tensor([[5, 9, 200, 31, ad.mask_id, ad.mask_id]])
    with torch.no_grad():
        want = ad.logits(ids).float()
    got = reference_logits(out, ids)
    lo = 1 if family == "dream" else 0
    assert (got[:, lo:] - want[:, lo:]).abs().max() <= 1e-4 * want[:, lo:].abs().max()
    base = reference_logits(folders[family], ids)
    assert (base[:, lo:] - want[:, lo:]).abs().max() > 1e-2 * want[:, lo:].abs().max()  # the change is visible


# ------------------------------------------------------------------------------------------------
# the harness
# ------------------------------------------------------------------------------------------------
def _bench(part: str = "rehearse_8b"):
    """The rehearsal script (``rehearse_8b``) or one of its parts (``rehearse_children``, ...) as a module."""
    import importlib

    sys.path.insert(0, str(ROOT / "benchmarks" / "rehearsal"))
    try:
        return importlib.import_module(part)
    finally:
        sys.path.pop(0)


def test_every_shipped_8b_recipe_is_rehearsed_and_its_overrides_validate(tmp_path):
    bench = _bench()
    shipped = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml") if p.stem.startswith(("llada8b_", "dream7b_")))
    assert sorted(bench.RECIPES) == shipped and len(shipped) == 12
    for name in bench.RECIPES:
        cfg = bench.load_recipe(name)
        ov = bench.rehearsal_overrides(cfg, tmp_path / "model", tmp_path / "run", 3, 2)
        r = bench.load_recipe(name, ov)  # validated by the config's own checks
        assert (r.rollout.gen_length, r.rollout.block_length, r.train.prompts_per_step, r.train.group_size) == (32, 32, 1, 2)
        assert r.rollout.gen_length // r.rollout.steps == cfg.rollout.gen_length // cfg.rollout.steps  # tokens per step
        assert r.train.inner_iterations == min(2, cfg.train.inner_iterations)
        for key in ("lora_rank", "lora_alpha", "lora_target_modules", "dtype", "gradient_checkpointing"):
            assert getattr(r.model, key) == getattr(cfg.model, key), (name, key)
        assert (r.objective, r.likelihood, r.credit, r.rollout.cache) == (cfg.objective, cfg.likelihood, cfg.credit,
                                                                          cfg.rollout.cache)
        assert r.task.name == f"rehearse_{cfg.task.name}"


def test_block_recipes_keep_their_blocks_and_decoding_in_the_rehearsal(tmp_path):
    """The SDAR-8B / TraDo-8B recipes reduce to 32 tokens in the recipe's own blocks of 4 at its steps per block
    (8 blocks x 4 steps), with the recipe's remasking, threshold, block cache and early stop; the stand-in is SDAR's."""
    bench = _bench()
    shipped = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml") if p.stem.startswith(("sdar8b_", "trado8b_")))
    assert sorted(bench.BLOCK_RECIPES) == shipped and len(shipped) == 3
    for name in bench.BLOCK_RECIPES:
        cfg = bench.load_recipe(name)
        assert bench.standin_family(cfg) == "sdar"
        ov = bench.rehearsal_overrides(cfg, tmp_path / "model", tmp_path / "run", 3, 2, block_model=True)
        r = bench.load_recipe(name, ov)
        for got, want in ((r.rollout, cfg.rollout), (r.eval, cfg.eval)):
            assert (got.gen_length, got.block_length, got.steps) == (32, 4, 32), name
            per_block = want.steps // (want.gen_length // want.block_length)
            assert got.steps // (got.gen_length // got.block_length) == per_block == 4
            for key in ("remasking", "threshold", "cache", "early_stop", "temperature", "top_p"):
                assert getattr(got, key) == getattr(want, key), (name, key)
        assert (r.objective, r.likelihood, r.credit) == (cfg.objective, cfg.likelihood, cfg.credit)
    full = bench.rehearsal_overrides(bench.load_recipe("llada8b_gsm8k_diffu_grpo"), tmp_path, tmp_path, 3, 2)
    assert "rollout.block_length=32" in full  # a full-attention model still decodes the 32 tokens as one block


def test_llada2_recipes_rehearse_on_the_llada2_standin_in_their_blocks(tmp_path):
    """The LLaDA2.0-mini recipes map to the ``llada2`` stand-in (20 published blocks) and reduce to 32 tokens in
    the recipe's one block of 32 at its 32 steps a block, with its threshold rule, cache and objective."""
    bench = _bench()
    shipped = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml") if p.stem.startswith("llada2_mini_"))
    assert sorted(bench.LLADA2_RECIPES) == shipped and len(shipped) == 3
    assert bench.PUBLISHED_LAYERS["llada2"] == 20 and "llada2" in bench.BLOCK_FAMILIES
    for name in bench.LLADA2_RECIPES:
        cfg = bench.load_recipe(name)
        assert bench.standin_family(cfg) == "llada2"
        r = bench.load_recipe(name, bench.rehearsal_overrides(cfg, tmp_path / "m", tmp_path / "r", 3, 2, block_model=True))
        for got, want in ((r.rollout, cfg.rollout), (r.eval, cfg.eval)):
            per_block = want.steps // (want.gen_length // want.block_length)
            assert (got.gen_length, got.block_length, got.steps) == (32, want.block_length, per_block) == (32, 32, 32)
            for key in ("remasking", "threshold", "cache", "early_stop", "temperature"):
                assert getattr(got, key) == getattr(want, key), (name, key)
        assert (r.objective, r.likelihood, r.credit) == (cfg.objective, cfg.likelihood, cfg.credit)


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_export_layout_sees_config_keys_and_tensor_names(folders, tmp_path, family):
    """``export_layout``: maskrl's export of each stand-in keeps the family's ``model_type``, ``auto_map`` and
    every tensor name and shape; (SDAR) a dropped ``auto_map`` or a renamed tensor is seen."""
    import shutil

    bench = _bench("rehearse_children")
    out = save_model(load(folders[family], dtype="bfloat16"), tmp_path / "export")
    lay = bench.export_layout(folders[family], out)
    assert lay["config_equal"] and lay["names_equal"], lay
    assert lay["config_keys"]["model_type"]["export"] == {"llada": "llada", "dream": "Dream", "sdar": "sdar"}[family]
    assert lay["config_keys"]["auto_map"]["export"]
    assert lay["tensors"] == len(tensor_shapes(json.loads((folders[family] / "config.json").read_text())))
    if family != "sdar":
        return
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    cfg = json.loads((bad / "config.json").read_text())
    del cfg["auto_map"]
    (bad / "config.json").write_text(json.dumps(cfg))
    from safetensors.torch import save_file

    t = read_tensors(bad)
    t["model.layers.0.attn.q_proj.weight"] = t.pop("model.layers.0.self_attn.q_proj.weight")
    for f in bad.glob("*.safetensors*"):
        f.unlink()
    save_file(t, str(bad / "model.safetensors"))
    lay = bench.export_layout(folders["sdar"], bad)
    assert not lay["config_equal"] and lay["config_keys"]["auto_map"]["export"] is None
    assert lay["only_in_base"] == ["model.layers.0.self_attn.q_proj.weight"]
    assert lay["only_in_export"] == ["model.layers.0.attn.q_proj.weight"] and not lay["names_equal"]


def test_plan_vs_measured_and_the_hashed_reward():
    bench = _bench()
    rec = {"phases": {"plan": {"peak_gib": 3.3, "static_gib": {"ddp_buckets": 0.3}, "flops": 10},
                      "count": {"measured_peak_gib": 2.5, "measured_flops": 10, "base_rss_gib": 0.5},
                      "run_a": {"windows": [{"name": "start_to_step_1", "peak_gib": {"0": 9.0}},
                                            {"name": "step_2", "peak_gib": {"0": 3.5, "1": 3.4}},
                                            {"name": "step_3", "peak_gib": {"0": 3.3, "1": 3.6}}]}}}
    out = bench.plan_vs_measured(rec)
    assert out["one_process_step"]["error"] == pytest.approx(3.0 / 2.5 - 1)
    assert out["one_process_step"]["within_15pct"] is False and out["one_process_step"]["flops_equal"]
    assert out["two_process_rank0_steps_2_3"]["measured_gib"] == pytest.approx(3.0)  # the first window is not a step
    assert out["two_process_rank1_steps_2_3"]["measured_gib"] == pytest.approx(3.1)
    assert out["two_process_rank1_steps_2_3"]["bound"] is True and "within_15pct" not in out["two_process_rank0_steps_2_3"]
    assert out["two_process_steps_2_3"]["measured_gib"] == pytest.approx(3.1)  # the largest rank is the one checked
    assert out["two_process_steps_2_3"]["within_15pct"] is True
    rec["plan_vs_measured"] = out
    assert bench.plan_faults(rec) == ["plan: one_process_step off by +20.0 % (plan 3.000 GiB, measured 2.500 GiB)"]
    low = {"phases": {**rec["phases"], "run_a": {"windows": [{"name": "step_2", "peak_gib": {"0": 1.0, "1": 3.5}}]}}}
    low["plan_vs_measured"] = bench.plan_vs_measured(low)  # rank 0 far below the plan: not a fault, rank 1 is checked
    assert low["plan_vs_measured"]["two_process_rank0_steps_2_3"]["bound"] is True
    assert not [f for f in bench.plan_faults(low) if "two_process" in f]
    high = {"phases": {**rec["phases"], "run_a": {"windows": [{"name": "step_2", "peak_gib": {"0": 5.0, "1": 3.0}}]}}}
    high["plan_vs_measured"] = bench.plan_vs_measured(high)  # a rank above the plan by more than 15 %: a fault
    assert any("two_process_rank0" in f for f in bench.plan_faults(high))
    assert "checkpoint_size" not in out  # no file sizes recorded, none compared
    gib = 2 ** 30
    rec["phases"]["files"] = {"checkpoint": {"weights_bytes": gib, "optimizer_bytes": 2 * gib}, "export_bytes": 4 * gib}
    rec["phases"]["run_a"]["windows"].append({"name": "last_step_to_exit", "peak_gib": {"0": 8.0, "1": 3.0}})
    out = bench.plan_vs_measured(rec, {"checkpoint": 3.3, "export_disk": 4.0, "export_host": 4.5})
    assert out["checkpoint_size"]["error"] == pytest.approx(0.1) and out["checkpoint_size"]["within_15pct"]
    assert out["export_size"]["error"] == pytest.approx(0.0)
    assert out["export_host_rank0_extra"] == {"plan_gib": 4.5, "measured_gib": 5.0}
    sys.path.insert(0, str(ROOT / "benchmarks" / "rehearsal"))
    try:
        import rehearse_plugin
    finally:
        sys.path.pop(0)
    rewards = [rehearse_plugin.hashed_reward(f"completion {i}") for i in range(200)]
    assert set(rewards) == {0.0, 1.0} and 60 < sum(rewards) < 140
    assert rehearse_plugin.hashed_reward("abc") == rehearse_plugin.hashed_reward("abc")


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["llada8b_gsm8k_diffu_grpo", "sdar8b_math500_tracerl"])
def test_rehearsal_smoke_one_recipe_one_step(tmp_path, recipe):
    """``rehearse_8b.py --smoke``: a LLaDA recipe and a block-diffusion (SDAR) one for one step on 2 gloo
    processes through ``accelerate launch``, at width / 16 and 1 block, then ``maskrl eval`` and the checks
    of the export (for SDAR: decoded in blocks of 4, exported in SDAR's layout)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "rehearsal" / "rehearse_8b.py"), "--smoke", "--width-divisor", "16",
                        "--layers", "1", "--recipes", recipe, "--out-dir", str(tmp_path / "out"), "--work", str(tmp_path / "work")],
                       capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=WAIT_CAP_S)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = json.loads((tmp_path / "out" / f"{recipe}_L1_w16.json").read_text())
    ph = rec["phases"]
    # MATH's train split is not in the shipped data folder: recorded, not a fault (the rehearsal's task has rows)
    assert ph["data"]["ok"] or (recipe.startswith("sdar") and "math500/train.jsonl" in ph["data"]["missing_file"])
    assert ph["run_a"]["returncode"] == 0 and ph["eval"]["returncode"] == 0
    assert all(int(r) in (0, 1) for r in ph["run_a"]["peak_gib_per_rank"]) and len(ph["run_a"]["peak_gib_per_rank"]) == 2
    assert all(v > 0.2 for v in ph["run_a"]["peak_gib_per_rank"].values())
    f = ph["files"]  # the checkpoint holds LoRA and AdamW, not the bf16 base the export merged into
    assert 0 < f["checkpoint"]["weights_bytes"] < 0.05 * f["export_bytes"]
    assert rec["faults"] == [], rec["faults"]
    assert ph["count"]["measured_flops"] > 0 and ph["count"]["prompt_length"] == 32, ph["count"]  # the 1-process count ran
    c = ph["checks"]
    assert "error" not in c, c
    assert c["live_lora_tensors_loaded"] == 2 * 7  # A and B of the 7 linear layers of the one block
    assert c["export_weights"]["matrices"] == 7 and c["export_weights"]["max_update_norm"] > 0  # training moved LoRA
    lg = c["logits"]
    assert lg["layout_reader_vs_maskrl_load_max_abs"] <= 2 ** -6 * lg["logit_scale_max_abs"]  # bf16 compute vs fp32
    assert c["completions"]["rows"] == 2 and len(c["completions"]["lm_eval_export"]) == 2
    assert c["reloaded_weights"]["bit_equal"], c["reloaded_weights"]  # base_plus_adapter rebuilt the live bits
    assert c["completions"]["in_process_equal_live"] and c["completions"]["float32_equal"], c["completions"]
    assert c["export_layout"]["config_equal"] and c["export_layout"]["names_equal"], c["export_layout"]
    if recipe.startswith("sdar"):
        assert rec["family"] == "sdar" and c["config_model"]["path"].endswith("sdar_L1_w16_s0_c100")
        assert c["export_layout"]["config_keys"]["model_type"]["export"] == "sdar"
        es = c["completions"]["eval_sampler"]
        assert (es["block_length"], es["steps"], es["cache"], es["early_stop"]) == (4, 32, "block", True)


def _checks(**cm):
    base = {"maskrl_eval_equal_live": True, "lm_eval_equal_live": True, "in_process_equal_live": True,
            "float32_equal": True}
    return {"completions": base | cm, "reloaded_weights": {"bit_equal": True, "tensors": 15, "n_differ": 0, "differ": []}}


def test_completion_faults_tell_bf16_ties_from_a_wrong_export():
    """Another process's bf16 completions may differ from the live policy's on a random stand-in (exact ties
    between bf16 logits flip with the kernel order); that is a fault only when the export is not shown to be
    the live policy: bit-equal reloaded weights, equal in-process completions, equal float32 completions."""
    f = _bench().completion_faults
    assert f(_checks()) == []
    assert f(_checks(maskrl_eval_equal_live=False, lm_eval_equal_live=False)) == []  # proven the same model
    got = f(_checks(maskrl_eval_equal_live=False, float32_equal=False))
    assert len(got) == 2 and "float32" in got[0] and got[1].startswith("eval: maskrl eval")
    bad_bits = _checks(lm_eval_equal_live=False)
    bad_bits["reloaded_weights"] = {"bit_equal": False, "tensors": 15, "n_differ": 1, "differ": ["lm_head.weight"]}
    got = f(bad_bits)
    assert "lm_head.weight" in got[0] and got[1].startswith("lm-eval:")
    got = f(_checks(in_process_equal_live=False))
    assert got == ["eval: the export's completions in the live policy's process differ from the live policy's"]
    old = {"completions": {"maskrl_eval_equal_live": False, "lm_eval_equal_live": True}}  # a record before the control
    assert f(old) == ["eval: maskrl eval's completions on the export differ from the live policy's"]


def test_weight_digests_see_one_flipped_bit():
    import torch

    bench = _bench("rehearse_children")
    m = torch.nn.Linear(4, 3).to(torch.bfloat16)
    a = bench.weight_digests(m)
    with torch.no_grad():
        m.weight.view(torch.int16)[1, 2] ^= 1  # the last mantissa bit of one entry
    b = bench.weight_digests(m)
    assert a.keys() == b.keys() == {"weight", "bias"} and a["bias"] == b["bias"] and a["weight"] != b["weight"]
    assert a["weight"].startswith("bfloat16 ")


def test_rehearsal_table_in_the_docs_is_the_records():
    """docs/scaling.md's rehearsal table is what ``benchmarks/rehearsal/rehearse_summary.py`` makes of the committed
    records (re-run it after adding a record)."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "rehearsal"))
    try:
        import rehearse_summary
    finally:
        sys.path.pop(0)
    recs = rehearse_summary.records()
    text = (ROOT / "docs" / "scaling.md").read_text()
    block = text[text.index(rehearse_summary.BEGIN):text.index(rehearse_summary.END) + len(rehearse_summary.END)]
    assert block == rehearse_summary.table(recs), "run python benchmarks/rehearsal/rehearse_summary.py"
    assert all(r["_file"] == f"{r['recipe']}_L{r['layers']}.json" for r in recs)


def test_rescore_recomputes_the_plan_faults_from_the_record(tmp_path):
    bench = _bench()
    rec = {"benchmark": "rehearse_8b", "recipe": "r", "layers": 1,
           "faults": ["plan: two_process_rank0_steps_2_3 off by +20.6 % (old rule)", "eval: something else"],
           "phases": {"plan": {"peak_gib": 3.3, "static_gib": {"ddp_buckets": 0.3}, "flops": 10},
                      "count": {"measured_peak_gib": 2.9, "measured_flops": 10, "base_rss_gib": 0.5},
                      "run_a": {"windows": [{"name": "step_2", "peak_gib": {"0": 3.2, "1": 3.8}}]}},
           "plan_vs_measured": {}}
    f = tmp_path / "r_L1.json"
    f.write_text(json.dumps(rec))
    assert bench.rescore(tmp_path) == [f]
    new = json.loads(f.read_text())
    assert new["faults"] == ["eval: something else"]  # the largest rank (3.3 GiB) is within 15 % of the plan
    assert new["plan_vs_measured"]["two_process_steps_2_3"]["measured_gib"] == pytest.approx(3.3)
    assert "rescored" in new and bench.rescore(tmp_path) == []  # a second pass changes nothing


@pytest.mark.numerics
def test_llada2_standin_is_the_mini_at_real_expert_width_with_reduced_experts_and_vocabulary(tmp_path):
    """Real width (hidden 2048, experts of 512, 16 / 4 heads of 128) on the meta device; a width / 16 folder
    loads through the family with the stand-in's ids, block 32 and per-expert names."""
    from maskrl.models.llada2_moe import LLaDA2MoeConfig, parameter_counts
    from maskrl.models.standins import LLADA2_STANDIN

    cfg = family_config("llada2", 2)
    shapes = tensor_shapes(cfg)
    assert shapes["model.layers.1.mlp.experts.7.gate_proj.weight"] == (512, 2048)
    assert shapes["model.layers.0.mlp.gate_proj.weight"] == (5120, 2048)  # the dense first block
    assert shapes["model.layers.1.attention.query_key_value.weight"] == ((16 + 2 * 4) * 128, 2048)
    assert shapes["model.layers.1.mlp.gate.expert_bias"] == (8,) and shapes["lm_head.weight"] == (4608, 2048)
    keys = {k: v for k, v in cfg.items() if k in LLaDA2MoeConfig().to_dict() or k == "head_dim"}
    assert _params(cfg) - 8 == parameter_counts(LLaDA2MoeConfig(**keys))["total"]  # the bias is a buffer
    folder = write_standin(tmp_path / "llada2", "llada2", num_layers=2, width_divisor=16, corpus=CORPUS, bpe_size=512)
    a = load(folder)
    assert (a.family, a.block_size, a.mask_id, a.eos_id, a.pad_id) == ("llada2", 32, 4503, 4500, 4500)
    assert a.tokenizer.mask_token_id == LLADA2_STANDIN["mask_token_id"] and len(a.tokenizer) == 4608
    chat = a.tokenizer.apply_chat_template([{"role": "user", "content": "1+1?"}], add_generation_prompt=True,
                                           tokenize=False)
    assert chat == "<role>HUMAN</role>1+1?<|role_end|><role>ASSISTANT</role>"
    ids = torch.randint(0, 4096, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.isfinite(a.logits(ids).float()).all()
