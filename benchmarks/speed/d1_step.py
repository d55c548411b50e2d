"""One diffu-GRPO RL step: maskrl's ``RLTrainer`` against d1's TRL trainer, side by side at equal work.

d1 (dllm-reasoning/d1 837888f, ``diffu-grpo/diffu_grpo_trainer.py`` and ``diffu_grpo_config.py``) runs in
its own environment (``--d1-python``: transformers 4.49.0, accelerate 1.4.0, peft 0.15.1, TRL at its
pinned commit 0f88c17), with LLaDA-8B-Instruct's own modeling code (``modeling_llada.py`` /
``configuration_llada.py`` as kept in Gen-Verse/dLLM-RL ``models/llada/``, LLaDA-8B-Instruct's Hub files but for commented-out prints). Neither code is part of
maskrl or committed: each is exported with ``git archive`` from a git directory (``--d1-git``,
``--llada-git``) into a temporary folder. ``wandb``, which d1 imports and never uses here, is a stand-in
module on the d1 side only.

**The model.** LLaDA's own ``LLaDAModelLM`` at random (seed 0; ``--width``, ``--layers``, vocabulary per
cell, LLaDA-8B-Instruct's config keys otherwise), built in d1's environment and saved in LLaDA's layout;
maskrl loads that folder (:func:`maskrl.models.load`) and its logits are compared with LLaDA's code's on
one batch (max |Δ| recorded). Prompts are ``--prompt-length`` random ids through a word-level id tokenizer
(``id_tokens.py``), one prompt, ``--group`` completions of it per step, a CRC-32 reward of each
completion's text on both sides.

**Equal work, d1's recipe** (``slurm_scripts/train.yaml`` and the config's defaults, μ 1): LoRA r 128,
α 64, dropout 0.05 on d1's target list, which on LLaDA's module names adapts ``q_proj``, ``k_proj``,
``v_proj`` and ``up_proj`` (maskrl is given those four); reference = the adapter-disabled base, β 0.04,
ε 0.5, prompt masking 0.15, lr 3e-6, weight decay 0.1, clipping 0.2, no gradient checkpointing; the
rollout generates all ``--group`` rows in one batch (d1's ``generation_batch_size`` 6), blocks of 32,
``L / 2`` steps, temperature 0.9, LLaDA's low-confidence remasking; dropout on in θ's forward (maskrl's
``train.dropout: true``, d1's ``model.train()``); float32 weights on both sides. What
each side does of its own: maskrl samples from a merged LoRA copy and draws float64 Gumbel noise at the
block's masked positions; d1 samples through the peft wrapper and draws noise in the model's dtype
over every position. **d1 at μ 1 does not run as published**: with β > 0 its
``_generate_and_score_completions`` reads ``prompt_completion_ids_expanded``, which it defines only when
μ > 1 (NameError); the exported copy gets that one line before the ``if``, the value its μ > 1 branch
computes (:func:`patch_d1`). d1 calls its sampler from ``training_step`` with autograd on (it records a
graph for the LoRA weights at every forward); ``--d1-rollout-no-grad`` (a diagnostic, not d1's code as it
runs) wraps it in ``torch.no_grad``. d1's ``random_masking`` (seeds drawn as a tensor) stops in Python 3.11's
``random.seed`` (TypeError; d1 ran on an older Python), so d1 runs with its fixed mask seeds, at the same cost.

**Timing.** One thread per process; each side runs in its own process (a warm-up step, then ``--steps``
timed steps), the two sides alternated ``--rounds`` times, the first side alternating too. Process CPU
seconds per step and per phase: ``rollout`` (sampling and scoring: d1's ``_generate_and_score_completions``
less its reference pass; maskrl's ``collect``, the LoRA merge included), ``reference`` (the frozen
reference log-probs), ``theta_forward`` (θ's log-probs and the loss), ``backward``, and ``other`` (the
rest of the step: the optimizer, clipping, bookkeeping). Ratios are d1 / maskrl of the medians.

    PYTHONPATH=src python benchmarks/speed/d1_step.py --d1-git <d1 repo>/.git --llada-git <dLLM-RL repo>/.git \\
        --d1-python <venv with d1's pins>/bin/python --out benchmarks/speed/d1_step.json

``--smoke`` runs maskrl's side only, on a tiny LLaDA-layout model written without LLaDA's code (the test suite).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from id_tokens import hash_reward, id_tokenizer, prompt_texts  # noqa: E402  (maskrl-free)

RECIPE = ROOT / "configs" / "llada8b_gsm8k_diffu_grpo.yaml"
D1_REV, LLADA_REV, TRL_REV = "837888f", "10b4fd1", "0f88c17"
LLADA_PATH = "models/llada"
D1_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj"]  # d1's train.py
LLADA_HIT = ["q_proj", "k_proj", "v_proj", "up_proj"]  # those of d1's names LLaDA's modules carry
CELLS = {"vocab8k_L128": dict(vocab=8192, gen_length=128), "vocab126k_L64": dict(vocab=126464, gen_length=64),
         "vocab8k_L256": dict(vocab=8192, gen_length=256)}
PHASES = ("rollout", "reference", "theta_forward", "backward")
MARK = "D1_STEP_RESULT "
D1_BUG = "            if self.num_iterations > 1:\n                # repeat prompt completion ids"


class Clock:
    """Process CPU seconds per phase within one step: ``wrap(key, fn)`` adds each call's time to ``key``
    (a ``key`` of ``(no_grad_key, grad_key)`` picks by ``torch.is_grad_enabled()``); ``nested`` maps a
    phase to the phase that runs inside it, whose time :meth:`end` takes out of the outer one."""

    def __init__(self, nested: dict[str, str]) -> None:
        self.nested, self.spent, self.t0, self.times0 = nested, {}, 0.0, os.times()

    def wrap(self, key, fn):
        def run(*a, **k):
            name = key if isinstance(key, str) else key[torch.is_grad_enabled()]
            t0 = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + time.process_time() - t0
        return run

    def begin(self) -> None:
        self.spent, self.t0, self.times0 = {}, time.process_time(), os.times()

    def end(self) -> dict:
        """``{phase: s}`` for :data:`PHASES`, ``sampler`` (the sampler alone, inside ``rollout``), ``other``
        and ``step`` (with its user and system parts, ``step_user`` / ``step_system``)."""
        out = {k: self.spent.get(k, 0.0) for k in (*PHASES, "sampler")} | {"step": time.process_time() - self.t0}
        for outer, inner in self.nested.items():
            out[outer] -= out[inner]
        out["other"] = out["step"] - sum(out[k] for k in PHASES)
        t = os.times()
        out["step_user"], out["step_system"] = t.user - self.times0.user, t.system - self.times0.system
        return out


def llada_cfg(spec: dict) -> dict:
    """LLaDA-8B-Instruct's config keys at the benchmark's shape (``fast_dllm_llada.llada_config``)."""
    from types import SimpleNamespace

    import fast_dllm_llada

    return fast_dllm_llada.llada_config(SimpleNamespace(width=spec["width"], vocab=spec["vocab"], layers=spec["layers"]))


# ------------------------------------------------------------------ d1's side (d1's environment; no maskrl)
def d1_code(code: Path):
    """d1's trainer and config classes and LLaDA's model classes from the exported folder ``code``."""
    for sub in ("stubs", "diffu-grpo", ""):
        sys.path.insert(0, str(code / sub))
    from diffu_grpo_config import DiffuGRPOConfig
    from diffu_grpo_trainer import DiffuGRPOTrainer
    from llada_code.configuration_llada import LLaDAConfig
    from llada_code.modeling_llada import LLaDAModelLM
    return DiffuGRPOTrainer, DiffuGRPOConfig, LLaDAModelLM, LLaDAConfig


def d1_build(spec: dict) -> dict:
    """LLaDA's model at random (seed 0) saved to ``spec["folder"]`` with the id tokenizer, and its logits on a
    probe batch."""
    from safetensors.torch import save_file

    _, _, LLaDAModelLM, LLaDAConfig = d1_code(Path(spec["code"]))
    cfg, folder = llada_cfg(spec), Path(spec["folder"])
    torch.manual_seed(0)
    model = LLaDAModelLM(LLaDAConfig(**cfg), init_params=True).eval()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: t.contiguous() for k, t in model.state_dict().items()}, folder / "model.safetensors")
    id_tokenizer(spec["vocab"], cfg["mask_token_id"], cfg["eos_token_id"]).save_pretrained(folder)
    probe = torch.randint(0, spec["vocab"] - 3, (2, 48), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.save({"ids": probe, "logits": model(probe).logits}, folder / "probe.pt")
    return {"built": True}


def d1_step(spec: dict) -> dict:
    """d1's trainer on the saved model: ``trainer.train()`` for 1 + ``steps`` steps, each step's phases."""
    import datasets
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback

    Trainer, Config, LLaDAModelLM, _ = d1_code(Path(spec["code"]))
    v, L, G = spec["vocab"], spec["gen_length"], spec["group"]
    model = LLaDAModelLM.from_pretrained(spec["folder"], torch_dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(spec["folder"])  # as d1's train.py loads it, pad = eos
    tok.pad_token = tok.eos_token
    args = Config(output_dir=spec["tmp"], max_steps=1 + spec["steps"], per_device_train_batch_size=G, num_generations=G,
                  generation_batch_size=G, gradient_accumulation_steps=1, num_iterations=1, beta=0.04, epsilon=0.5,
                  p_mask_prompt=0.15, mask_id=v - 1, max_completion_length=L, block_length=spec["block_length"],
                  diffusion_steps=L // 2, temperature=0.9, random_masking=False, learning_rate=3e-6, weight_decay=0.1,
                  max_grad_norm=0.2, adam_beta2=0.99, lr_scheduler_type="constant_with_warmup", report_to="none",
                  save_strategy="no", logging_steps=1, disable_tqdm=True, use_cpu=True, seed=42, bf16=False)
    lora = LoraConfig(r=spec.get("lora_rank", 128), lora_alpha=spec.get("lora_alpha", 64), target_modules=D1_TARGETS,
                      task_type="CAUSAL_LM", lora_dropout=0.05)

    def hash_reward_func(prompts, completions, **_):
        return hash_reward(completions)

    data = datasets.Dataset.from_list([{"prompt": spec["prompt"]}])
    trainer = Trainer(model=model, reward_funcs=[hash_reward_func], args=args, train_dataset=data,
                      processing_class=tok, peft_config=lora)
    clock, steps = Clock({"rollout": "reference"}), []  # d1 runs the reference pass inside its rollout call
    if spec.get("d1_rollout_no_grad"):  # a diagnostic: d1 calls its sampler with autograd on
        trainer.generate = torch.no_grad()(trainer.generate)
    trainer.generate = clock.wrap("sampler", trainer.generate)
    trainer._generate_and_score_completions = clock.wrap("rollout", trainer._generate_and_score_completions)
    trainer._get_per_token_logps = clock.wrap(("reference", "theta_forward"), trainer._get_per_token_logps)
    trainer.accelerator.backward = clock.wrap("backward", trainer.accelerator.backward)

    class Steps(TrainerCallback):
        def on_step_begin(self, *a, **k):
            clock.begin()

        def on_step_end(self, *a, **k):
            steps.append(clock.end())

    trainer.add_callback(Steps())
    trainer.train()
    return {"steps": steps, "completion_length": L}


def patch_d1(path: Path) -> None:
    """d1's trainer at μ 1 with β > 0: define ``prompt_completion_ids_expanded`` (read by the reference pass,
    defined by d1 only under ``num_iterations > 1``) before the ``if``, as that branch computes it."""
    text = path.read_text()
    fix = ("            prompt_completion_ids_expanded = prompt_completion_ids.unsqueeze(0).expand("
           "self.num_iterations, -1, -1)  # maskrl benchmark: defined for mu 1 too\n")
    if text.count(D1_BUG) != 1 or fix in text:
        raise SystemExit(f"{path}: d1's μ > 1 branch not found as expected, unpatched (commit {D1_REV}?)")
    path.write_text(text.replace(D1_BUG, fix + D1_BUG))


# ------------------------------------------------------------------ maskrl's side
def maskrl_trainer(spec: dict):
    """maskrl's ``RLTrainer`` on the saved model with d1's recipe at the cell's shape (see the module doc)."""
    import gpu_grid
    from maskrl.config import load_config
    from maskrl.policy import load_policy
    from maskrl.tasks.base import Example
    from maskrl.trainer import RLTrainer

    L, G = spec["gen_length"], spec["group"]
    sets = [f"output_dir={spec['tmp']}", f"model.path={spec['folder']}", "train.report_to=[]", "model.dtype=float32",
            "model.gradient_checkpointing=false", f"model.lora_target_modules={','.join(LLADA_HIT)}",
            f"rollout.gen_length={L}", f"rollout.block_length={spec['block_length']}", f"rollout.steps={L // 2}",
            "train.prompts_per_step=1", f"train.group_size={G}", f"train.micro_batch_size={G}",
            "train.inner_iterations=1", "train.dropout=true", f"model.lora_rank={spec.get('lora_rank', 128)}",
            f"model.lora_alpha={spec.get('lora_alpha', 64)}"] + spec.get("sets", [])
    cfg = load_config([RECIPE], sets)
    return RLTrainer(cfg, load_policy(cfg), gpu_grid.HashReward(), [Example(id=0, prompt=spec["prompt"])])


def maskrl_step(spec: dict) -> dict:
    """maskrl's trainer: 1 + ``steps`` calls of ``RLTrainer.step``, each step's phases."""
    import maskrl.trainer as trainer_module

    trainer = maskrl_trainer(spec)
    clock, steps = Clock({"theta_forward": "backward"}), []  # the backward runs inside _theta_backward
    trainer_module.generate = clock.wrap("sampler", trainer_module.generate)
    trainer.collect = clock.wrap("rollout", trainer.collect)
    trainer._frozen_log_probs = clock.wrap("reference", trainer._frozen_log_probs)
    trainer._theta_backward = clock.wrap("theta_forward", trainer._theta_backward)
    trainer.acc.backward = clock.wrap("backward", trainer.acc.backward)
    for _ in range(1 + spec["steps"]):
        clock.begin()
        trainer.step()
        steps.append(clock.end())
    return {"steps": steps}


def smoke_checkpoint(spec: dict) -> None:
    """A random model in LLaDA's layout at ``spec``'s shape without LLaDA's code (for ``--smoke``): a
    transformers Llama of the same shape, its tensors renamed by :func:`maskrl.models.names.llada_to_checkpoint`."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from maskrl.models.names import llada_to_checkpoint

    cfg, folder = llada_cfg(spec), Path(spec["folder"])
    llama = LlamaConfig(vocab_size=cfg["vocab_size"], hidden_size=cfg["d_model"], intermediate_size=cfg["mlp_hidden_size"],
                        num_hidden_layers=cfg["n_layers"], num_attention_heads=cfg["n_heads"],
                        num_key_value_heads=cfg["n_kv_heads"], tie_word_embeddings=False)
    torch.manual_seed(0)
    state = LlamaForCausalLM(llama).state_dict()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({llada_to_checkpoint(k): t.contiguous() for k, t in state.items() if "rotary" not in k},
              folder / "model.safetensors")
    id_tokenizer(spec["vocab"], cfg["mask_token_id"], cfg["eos_token_id"]).save_pretrained(folder)


def smoke(tmp: Path) -> dict:
    """maskrl's side only, in this process, on a tiny :func:`smoke_checkpoint` model (the test suite)."""
    spec = {"vocab": 96, "gen_length": 8, "width": 64, "layers": 1, "group": 2, "block_length": 8, "steps": 1,
            "prompt": prompt_texts(1, 4, 93, 1)[0], "folder": str(tmp / "model"), "tmp": str(tmp / "run")}
    smoke_checkpoint(spec)
    torch.set_num_threads(1)
    return maskrl_step(spec)


def worker(side: str, spec: dict) -> None:
    torch.set_num_threads(1)
    out = {"build": d1_build, "d1": d1_step, "maskrl": maskrl_step}[side](spec)
    print(MARK + json.dumps(out), flush=True)


# ------------------------------------------------------------------ the side-by-side run
def export_code(d1_git: Path, llada_git: Path, dest: Path) -> Path:
    """d1's ``diffu-grpo/`` (``git archive``) and LLaDA's two modeling files (``git show``, as package
    ``llada_code``) exported into ``dest``, d1's μ-1 line added (:func:`patch_d1`), and a ``wandb`` stand-in under ``stubs/``."""
    dest.mkdir(parents=True)
    tar = subprocess.run(["git", "--git-dir", str(d1_git), "archive", D1_REV, "diffu-grpo"], check=True,
                         capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    pkg = dest / "llada_code"
    pkg.mkdir()
    for name in ("configuration_llada.py", "modeling_llada.py"):  # two files (a checkout may be partial)
        text = subprocess.run(["git", "--git-dir", str(llada_git), "show", f"{LLADA_REV}:{LLADA_PATH}/{name}"],
                              check=True, capture_output=True).stdout
        (pkg / name).write_bytes(text)
    (pkg / "__init__.py").write_text("")
    (dest / "stubs").mkdir()
    (dest / "stubs" / "wandb.py").write_text("run = None  # stand-in: d1 imports wandb; report_to is none here\n")
    patch_d1(dest / "diffu-grpo" / "diffu_grpo_trainer.py")
    return dest


def run_worker(side: str, spec: dict, python: str) -> dict:
    """One worker process (``side`` under ``python``, one thread); its result and the load around it."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", WANDB_DISABLED="true",
               TOKENIZERS_PARALLELISM="false")
    if side == "maskrl":
        env["PYTHONPATH"] = str(ROOT / "src")
    else:
        env.pop("PYTHONPATH", None)
    load0 = os.getloadavg()[0]
    proc = subprocess.run([python, str(Path(__file__).resolve()), "--worker", side, "--spec", json.dumps(spec)],
                          capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode or not lines:
        raise SystemExit(f"{side} worker failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return json.loads(lines[-1][len(MARK):]) | {"load_1min": [load0, os.getloadavg()[0]]}


def logit_check(folder: Path) -> float:
    """max |logits(LLaDA's code) − logits(maskrl)| on the probe batch the build saved."""
    from maskrl.models import load

    probe = torch.load(folder / "probe.pt")
    ad = load(folder, tokenizer=False)
    with torch.no_grad():
        return float((ad.logits(probe["ids"]) - probe["logits"]).abs().max())


def summarize(runs: dict[str, list[dict]]) -> dict:
    """Medians of the timed steps per side and phase, and d1 / maskrl of each."""
    med = {side: {k: statistics.median(s[k] for s in steps) for k in (*PHASES, "sampler", "other", "step", "step_user", "step_system")}
           for side, steps in runs.items()}
    ratio = {k: med["d1"][k] / med["maskrl"][k] if med["maskrl"][k] > 0 else None for k in med["d1"]}
    return {"median_s": med, "ratio_d1_over_maskrl": ratio}


def measure_cell(name: str, spec: dict, args, code: Path, tmp: Path) -> dict:
    """Build the cell's model (d1's side), compare logits, then the alternated rounds of both sides."""
    spec = spec | {"code": str(code), "folder": str(tmp / name), "tmp": str(tmp / f"{name}_run")}
    run_worker("build", spec, args.d1_python)
    cell = {"max_abs_logit_diff": logit_check(Path(spec["folder"])), "processes": [],
            "timed_steps": {"d1": [], "maskrl": []}, "warmup_steps": {"d1": [], "maskrl": []}}
    print(f"{name}: max |logits(LLaDA) - logits(maskrl)| = {cell['max_abs_logit_diff']:.3g}", flush=True)
    for r in range(args.rounds):
        for side in (("d1", "maskrl") if r % 2 == 0 else ("maskrl", "d1")):
            out = run_worker(side, spec, args.d1_python if side == "d1" else sys.executable)
            cell["warmup_steps"][side].append(out["steps"][0])
            cell["timed_steps"][side] += out["steps"][1:]
            cell["processes"].append({"round": r, "side": side, "load_1min": out["load_1min"]})
            print(f"{name} round {r} {side}: " + ", ".join(f"{s['step']:.1f} s" for s in out["steps"]), flush=True)
    return cell | summarize(cell["timed_steps"])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", choices=("build", "d1", "maskrl"), help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--d1-git", type=Path, default=os.environ.get("MASKRL_D1_GIT"), help="d1's git directory")
    ap.add_argument("--llada-git", type=Path, default=os.environ.get("MASKRL_LLADA_GIT"),
                    help="Gen-Verse/dLLM-RL's git directory (LLaDA's modeling code)")
    ap.add_argument("--d1-python", default=os.environ.get("MASKRL_D1_PYTHON"), help="python of d1's environment")
    ap.add_argument("--cells", default="vocab8k_L128,vocab126k_L64", help=f"of {','.join(CELLS)}")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--group", type=int, default=6)
    ap.add_argument("--prompt-length", type=int, default=64)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per process (after one warm-up step)")
    ap.add_argument("--rounds", type=int, default=2, help="processes per side, alternated")
    ap.add_argument("--lora-rank", type=int, default=128, help="d1's 128; LLaDA-8B's width is 16x this model's")
    ap.add_argument("--lora-alpha", type=float, default=64)
    ap.add_argument("--d1-rollout-no-grad", action="store_true",
                    help="diagnostic: d1's sampler under torch.no_grad (d1 runs it with autograd on)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--smoke", action="store_true", help="maskrl's side only on a tiny model (no d1 needed)")
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker, json.loads(args.spec))
    if args.smoke:
        with tempfile.TemporaryDirectory() as tmp:
            return smoke(Path(tmp))
    from maskrl.machine import cpu_identity  # maskrl's side only from here on
    from maskrl.records import write_record

    if not (args.d1_git and args.llada_git and args.d1_python):
        ap.error("--d1-git, --llada-git and --d1-python (or $MASKRL_D1_GIT, $MASKRL_LLADA_GIT, $MASKRL_D1_PYTHON) are needed")
    shape = {"width": args.width, "layers": args.layers, "group": args.group, "block_length": args.block_length,
             "steps": args.steps, "prompt_length": args.prompt_length, "lora_rank": args.lora_rank,
             "lora_alpha": args.lora_alpha, "d1_rollout_no_grad": args.d1_rollout_no_grad}
    record = {"command": "PYTHONPATH=src python benchmarks/speed/d1_step.py --d1-git <d1>/.git --llada-git <dLLM-RL>/.git "
                         f"--d1-python <d1 venv>/bin/python --cells {args.cells} --width {args.width} --layers {args.layers} "
                         f"--group {args.group} --prompt-length {args.prompt_length} --steps {args.steps} --rounds {args.rounds}"
                         f" --lora-rank {args.lora_rank} --lora-alpha {args.lora_alpha:g}"
                         + (" --d1-rollout-no-grad" if args.d1_rollout_no_grad else ""),
              "d1": f"dllm-reasoning/d1 {D1_REV} diffu-grpo/ (μ-1 line added, see patch_d1)",
              "llada_code": f"Gen-Verse/dLLM-RL {LLADA_REV} {LLADA_PATH}/modeling_llada.py",
              "d1_environment": d1_versions(args.d1_python) | {"trl_source": f"huggingface/trl {TRL_REV} (d1's pin)"}, "torch": torch.__version__, "threads": 1,
              "timer": "process CPU seconds per phase, one process per side per round, alternated",
              "processor": cpu_identity(), "args": shape, "cells": {}, "complete": False}
    if args.out and args.out.is_file():  # cells measured by an earlier run stay; the ones run now replace theirs
        record["cells"] = json.loads(args.out.read_text()).get("cells", {})
    prompt = prompt_texts(1, args.prompt_length, 8189, 1)[0]
    with tempfile.TemporaryDirectory() as tmp:
        code = export_code(args.d1_git, args.llada_git, Path(tmp) / "code")
        for name in args.cells.split(","):
            spec = CELLS[name] | shape | {"prompt": prompt}
            record["cells"][name] = CELLS[name] | {"command": record["command"], "cpu_load_1min_at_start": os.getloadavg()[0]}
            record["cells"][name] |= measure_cell(name, spec, args, code, Path(tmp)) | {"cpu_load_1min_at_end": os.getloadavg()[0]}
            if args.out:
                write_record(args.out, record)
    record["complete"] = True
    if args.out:
        write_record(args.out, record)
    return record


def d1_versions(python: str) -> dict:
    """The versions of d1's environment's packages (``importlib.metadata`` run under ``python``)."""
    code = ("import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
            "('torch', 'transformers', 'accelerate', 'peft', 'trl', 'datasets')}))")
    return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)


if __name__ == "__main__":
    main()
