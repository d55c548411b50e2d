"""The 8B rehearsal's in-process phases (``rehearse_8b.py --child checks|count``): the live policy against
its export (LoRA updates, logits, completions, weights) and the plan's FLOPs and peak memory counted on one
step."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rehearse_launch import GIB, EVAL_ROWS, load_recipe
from rehearse_memory import KERNEL_CACHES_OFF, phase_peaks, proc_status, reset_peak


def _lora_state(ckpt: Path) -> dict:
    from safetensors import safe_open

    with safe_open(ckpt / "model.safetensors", framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys() if "lora_" in k}


def weight_digests(model) -> dict[str, str]:
    """``{name: "dtype sha256"}`` of every parameter and buffer of a model, names as in the base model (peft's
    ``base_model.model.`` and ``.base_layer`` taken out): two models with equal digests compute bit for bit
    the same forward under the same kernels."""
    import hashlib

    import torch

    out = {}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        key = name.replace("base_model.model.", "").replace(".base_layer", "")
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
        out[key] = f"{str(t.dtype).removeprefix('torch.')} {hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:16]}"
    return out


#: config.json keys by which a family's own code (and the inference engines) recognise its layout
LAYOUT_KEYS = ("model_type", "architectures", "auto_map", "block_size", "mask_token_id", "tie_word_embeddings")


def tensor_layout(folder: Path) -> dict[str, list[int]]:
    """``{checkpoint name: shape}`` of a folder's safetensors (index or single file), read from the headers."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    out = {}
    for file in files:
        with safe_open(folder / file, framework="pt") as f:
            out |= {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    return out


def export_layout(base_dir: Path, export: Path) -> dict:
    """The export against the base checkpoint's own layout: the :data:`LAYOUT_KEYS` of ``config.json`` and
    every tensor's name and shape equal (the export is read by the family's own code, e.g. SDAR's
    ``auto_map`` classes, only if they are). An ``auto_map`` entry ``<repo>--module.Class`` (LLaDA's export
    names the Hub repo that holds its code) counts as ``module.Class``."""
    cb, ce = (json.loads((d / "config.json").read_text()) for d in (base_dir, export))
    keys = {k: {"base": cb.get(k), "export": ce.get(k)} for k in LAYOUT_KEYS if k in cb or k in ce}
    tb, te = tensor_layout(base_dir), tensor_layout(export)
    shape_differ = sorted(k for k in tb.keys() & te.keys() if tb[k] != te[k])

    def same(k: str, v: dict) -> bool:  # transformers' "<repo>--module.Class" names module.Class of that repo
        if k == "auto_map" and isinstance(v["base"], dict) and isinstance(v["export"], dict):
            return {a: c.split("--")[-1] for a, c in v["base"].items()} == {a: c.split("--")[-1] for a, c in v["export"].items()}
        return v["base"] == v["export"]

    return {"config_keys": keys, "config_equal": all(same(k, v) for k, v in keys.items()),
            "tensors": len(te), "only_in_base": sorted(tb.keys() - te.keys())[:8],
            "only_in_export": sorted(te.keys() - tb.keys())[:8], "shape_differ": shape_differ[:8],
            "names_equal": tb.keys() == te.keys() and not shape_differ}


def child_checks(recipe: str, overrides: list[str], run_dir: Path, eval_dir: Path) -> dict:
    """The live policy against its export (module docstring, ``checks``)."""
    import gc

    import torch

    from maskrl.config import to_dict
    from maskrl.evaluate import run_harness
    from maskrl.models import load
    from maskrl.models.loading import llada_to_checkpoint
    from maskrl.models.standins import read_tensors, reference_logits
    from maskrl.pipeline import load_policy, read_prompt_card
    from maskrl.trainer import latest_checkpoint

    torch.set_num_threads(2)
    cfg = load_recipe(recipe, overrides)
    export = run_dir / "model"
    base_dir = Path(cfg.model.path)
    ckpt = latest_checkpoint(run_dir)
    out: dict = {"checkpoint": str(ckpt), "export": str(export)}
    t0 = time.time()
    out["export_layout"] = export_layout(base_dir, export)

    # ---- the live policy: the run's own construction, LoRA tensors of its last checkpoint
    live = load_policy(cfg)
    state = _lora_state(ckpt)
    # a fresh construction of the same config draws LoRA's A matrices again: with a seeded init they equal the
    # run's own up to its few small updates (lr ~1e-6 for 3 steps), otherwise they are another random draw
    fresh = {k: v for k, v in live.model.state_dict().items() if "lora_A" in k}
    drift = max(float((fresh[k].float() - state[k].float()).abs().max()) for k in fresh if k in state)
    out["lora_init"] = {"max_abs_diff_fresh_vs_run": drift, "reproducible": drift < 1e-3}
    result = live.model.load_state_dict(state, strict=False)
    out["live_lora_tensors_loaded"] = len(state) - len(result.unexpected_keys)
    live.model.eval()
    family = live.family
    lora_cfg = live.model.peft_config["default"]
    scale = lora_cfg.lora_alpha / lora_cfg.r

    # ---- weights: exported update vs the adapter's own scale * B A
    per = {}
    names = sorted({k.split(".lora_")[0] for k in state})
    for mod in names:
        a = state[f"{mod}.lora_A.default.weight"].float()  # float32: bf16 differences are exact in it
        b = state[f"{mod}.lora_B.default.weight"].float()
        native = mod.removeprefix("base_model.model.") + ".weight"
        ck = llada_to_checkpoint(native) if family == "llada" else native
        w_base = read_tensors(base_dir, [ck])[ck]
        w_exp = read_tensors(export, [ck])[ck]
        dtype = str(w_exp.dtype).removeprefix("torch.")
        same = float((w_exp.float() == w_base.float()).float().mean())
        got = w_exp.float().sub_(w_base.float())
        del w_exp, w_base
        delta = (b @ a).mul_(scale)
        dn = float(delta.norm())
        per[ck] = {"update_norm": dn, "rel_error": float(got.sub_(delta).norm()) / dn if dn > 0 else None,
                   "equal_to_base_frac": same, "export_dtype": dtype}
        del got, delta
    errs = [v["rel_error"] for v in per.values() if v["rel_error"] is not None]
    out["export_weights"] = {
        "matrices": len(per), "lora_scale": scale,
        "max_update_norm": max(v["update_norm"] for v in per.values()) if per else 0.0,
        "median_rel_error": sorted(errs)[len(errs) // 2] if errs else None, "max_rel_error": max(errs) if errs else None,
        "mean_equal_to_base_frac": sum(v["equal_to_base_frac"] for v in per.values()) / max(1, len(per)),
        "export_dtypes": sorted({v["export_dtype"] for v in per.values()}),
        "per_matrix": dict(list(per.items())[:4])}
    out["export_weights"]["carries_update"] = bool(errs) and max(errs) < 0.05

    # ---- logits on a few real prompts: live, live with adapters off (the base), export (two readers)
    from maskrl.pipeline import prompt_formatter, task_and_data
    from maskrl.text import encode_prompts

    task, held_out, _, train = task_and_data(cfg)
    fmt = prompt_formatter(live, cfg.model.chat_template)
    prompt = fmt(train[0].prompt)
    ids, _ = encode_prompts(live.tokenizer, [prompt])
    ids = torch.cat([ids, torch.full((1, 8), live.mask_id)], 1)  # 8 masked positions, as in a rollout
    with torch.no_grad():
        l_live = live.logits(ids).float()
        with live.reference() as ref:
            l_base = ref.logits(ids).float()
    out["prompt_tokens_row0"] = int(ids.shape[1] - 8)

    # ---- greedy completions of the live policy on the eval rows (maskrl eval's code, the adapter), in the
    # recipe's dtype and, as the tie-free control, with every weight in float32
    card = read_prompt_card(export)
    from maskrl.evaluate import RULE_FIELDS

    def completions(folder: Path) -> list[str]:
        f = sorted(folder.glob("samples_L*.jsonl"))
        return [json.loads(x)["completion"] for x in f[0].read_text().splitlines() if x.strip()] if f else []

    def complete_rows(model, name: str) -> list[str]:
        run_harness(model=model, task_name=task.name, limit=EVAL_ROWS, out_dir=eval_dir.parent / name,
                    batch_size=EVAL_ROWS, progress=False, overwrite=True,
                    gen_lengths=card["eval_sampler"]["gen_length"], block_length=card["eval_sampler"]["block_length"],
                    steps=card["eval_sampler"]["steps"], chat_template=card["chat_template"],
                    rule={k: v for k, v in card["eval_sampler"].items() if k in RULE_FIELDS})
        return completions(eval_dir.parent / name)

    c_live = complete_rows(live, "eval_live")
    d_live = weight_digests(live.model)
    live.model.float()
    c_live32 = complete_rows(live, "eval_live_f32")
    del live, state, ref
    gc.collect()
    c_cli = completions(eval_dir)

    exp = load(export, dtype=cfg.model.dtype)
    d_exp = weight_digests(exp.model)
    with torch.no_grad():
        l_exp = exp.logits(ids).float()
    c_exp = complete_rows(exp, "eval_export_inproc")
    del exp
    gc.collect()
    exp32 = load(export, dtype=torch.float32)
    c_exp32 = complete_rows(exp32, "eval_export_f32")
    del exp32
    gc.collect()
    differ = sorted(k for k in d_live.keys() | d_exp.keys() if d_live.get(k) != d_exp.get(k))
    out["reloaded_weights"] = {"tensors": len(d_live), "bit_equal": not differ, "differ": differ[:8],
                               "n_differ": len(differ), "threads": torch.get_num_threads()}
    # the layout reader has no MoE forward: LLaDA2's export is read by maskrl.models.load only (checked above)
    ref_l = None if family == "llada2" else reference_logits(export, ids)
    lo = 1 if family == "dream" else 0  # Dream's position 0 has no aligned logit
    effect = float((l_live - l_base)[:, lo:].abs().max())
    out["logits"] = {
        "update_effect_max_abs": effect,
        "export_vs_live_max_abs": float((l_exp - l_live)[:, lo:].abs().max()),
        "export_vs_base_max_abs": float((l_exp - l_base)[:, lo:].abs().max()),
        "layout_reader_vs_maskrl_load_max_abs": None if ref_l is None else float((ref_l - l_exp)[:, lo:].abs().max()),
        "logit_scale_max_abs": float(l_live[:, lo:].abs().max()),
        "positions": int(ids.shape[1] - lo)}
    out["logits"]["export_error_over_update_effect"] = (out["logits"]["export_vs_live_max_abs"] / effect
                                                       if effect > 0 else None)

    # ---- lm-eval's model on the same rows
    from lm_eval.api.instance import Instance
    from lm_eval.api.registry import get_model

    import maskrl.lm_eval_model  # noqa: F401  (registers "maskrl")

    lm = get_model("maskrl")(pretrained=str(export), dtype=str(cfg.model.dtype), batch_size=EVAL_ROWS)
    reqs = [Instance("generate_until", {}, (ex.prompt, {"until": []}), i) for i, ex in enumerate(held_out[:EVAL_ROWS])]
    lm_out = lm.generate_until(reqs)
    del lm
    gc.collect()
    out["completions"] = {"rows": len(c_live), "live": c_live, "maskrl_eval_export": c_cli, "lm_eval_export": lm_out,
                          "export_in_process": c_exp, "live_float32": c_live32, "export_float32": c_exp32,
                          "maskrl_eval_equal_live": c_cli == c_live, "lm_eval_equal_live": lm_out == c_live,
                          "in_process_equal_live": c_exp == c_live, "float32_equal": c_exp32 == c_live32,
                          "eval_sampler": card["eval_sampler"]}
    out["seconds"] = time.time() - t0
    out["peak_rss_gib"] = proc_status().get("VmHWM", 0) / GIB
    out["config_model"] = to_dict(cfg)["model"]
    return out


def _exact_prompt(tokenizer, n: int) -> str:
    """A text that tokenises to exactly ``n`` tokens (bos included) with this tokenizer."""
    from maskrl.text import encode_prompts

    for ch in "~^`|@#$&_":
        for k in range(max(1, n - 2), n + 2):
            text = ch * k
            if encode_prompts(tokenizer, [text])[0].shape[1] == n:
                return text
    raise RuntimeError(f"no text of exactly {n} tokens found for this tokenizer")


def child_count(recipe: str, overrides: list[str], prompt_length: int, phases: bool = False) -> dict:
    """Counted FLOPs of one step and measured peak of the next (module docstring, ``count``); ``phases``: the
    second step's peak per phase too (``phase_peaks``, :func:`rehearse_memory.phase_peaks`; ``measured_peak_gib``
    is then the largest of them)."""
    import dataclasses
    import gc

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from maskrl.pipeline import load_policy
    from maskrl.plan import spread_rewards, synthetic_trainer
    from maskrl.tasks.base import Example, Task
    from maskrl.trainer import RLTrainer

    torch.set_num_threads(2)
    cfg = load_recipe(recipe, overrides)
    # as the plan counts it: each credit module at its worst case (CreditModule.for_planning: DiSPO keeps every
    # branched state, DTCA max_steps states a sequence)
    cfg.credit = [m.for_planning() for m in cfg.credit]
    cfg.output_dir = "/nonexistent-rehearsal-count"
    # the warm-up step runs the rehearsal's lengths and rows on the plan's tiny model: the shipped recipe's own
    # (TraDo: 8 x 16 rollouts of 2,000 tokens) would take hours on a CPU and warm nothing more
    warm = load_recipe(recipe, [o for o in overrides if not o.startswith(("model.path=", "output_dir="))])
    from maskrl.plan import standin_config

    t = synthetic_trainer(standin_config(warm), 8)
    t.step()  # imports, kernels, optimizer code paths
    del t
    gc.collect()
    base = proc_status()["VmRSS"]
    policy = load_policy(cfg)
    policy = dataclasses.replace(policy, eos_id=-1, stop_ids=())  # no early stop: every completion L long
    gen = torch.Generator().manual_seed(0)

    class _Synthetic(Task):
        name = "rehearsal_synthetic"

        def reward(self, prompts, completions, **_):  # every group trains, as the plan assumes
            return spread_rewards(len(completions), cfg.train.group_size, gen)

    text = _exact_prompt(policy.tokenizer, prompt_length)
    trainer = RLTrainer(cfg, policy, _Synthetic(), [Example(id=i, prompt=text) for i in range(cfg.train.prompts_per_step)])
    lazy = proc_status()["VmRSS"] - base
    # the loader's tensors are views of the memory-mapped safetensors files: a page becomes resident only when
    # read (an embedding row no prompt uses never is). The plan counts every weight, as a GPU holds them, so
    # every parameter is read once here (2 processes under DDP read them all anyway: rank 0 broadcasts them).
    with torch.no_grad():
        for prm in policy.model.parameters():
            prm.sum()  # reads every page, allocates nothing large
    after_load = proc_status()["VmRSS"] - base
    t0 = time.time()
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        trainer.step()
    first_s = time.time() - t0
    gc.collect()
    by_phase = phase_peaks(trainer, base) if phases else None
    reset_peak()
    t0 = time.time()
    trainer.step()
    second_s = time.time() - t0
    peak = proc_status()["VmHWM"] - base if not phases else max(p["peak_gib"] for p in by_phase) * GIB
    from rehearse_launch import _code_commit

    return {"code": _code_commit(), "prompt_length": prompt_length, "measured_flops": int(fc.get_total_flops()),
            "measured_peak_gib": peak / GIB, "base_rss_gib": base / GIB, "after_load_gib": after_load / GIB,
            "after_load_untouched_gib": lazy / GIB,
            "rss_after_step_gib": (proc_status()["VmRSS"] - base) / GIB,
            "first_step_seconds": first_s, "second_step_seconds": second_s,
            "kernel_caches": {k: os.environ.get(k) for k in KERNEL_CACHES_OFF},  # as measured (rehearse_memory)
            **({"phase_peaks": by_phase} if phases else {})}
