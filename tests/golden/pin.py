"""Pinned outputs of the sampler and the trainer (the values, not a comparison of two code paths).

``python tests/golden/pin.py`` records, for this machine's key (:func:`maskrl.machine.float_key`: torch
version, CPU kernel set, threads and the processor), the sha256 digests of every :class:`~maskrl.types.Rollout` field over a matrix of sampler
settings and of the weights and every metric after two RL steps of several recipes, into
``tests/golden/digests.json``. ``tests/test_golden.py`` recomputes them and compares; on a machine
whose key was never recorded it skips with the reason (float kernels differ across CPUs, so the
bits are only pinned where they were recorded).
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import torch

from maskrl.machine import float_key

HERE = Path(__file__).resolve().parent
DIGESTS = HERE / "digests.json"
sys.path.insert(0, str(HERE.parent))


def machine_key() -> str:
    """Where a digest is valid: :func:`maskrl.machine.float_key` (torch, kernel set, threads, processor),
    or ``$MASKRL_FLOAT_KEY`` where set: the tests then act as on that machine (e.g. any other value
    shows what runs on a processor that recorded nothing)."""
    return os.environ.get("MASKRL_FLOAT_KEY") or float_key()


def tensor_digest(t: torch.Tensor) -> str:
    t = t.detach().cpu().contiguous()
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def value_digest(v) -> str:
    """Digest of a JSON-able value with floats written exactly (hex), keys in their order."""
    def enc(x):
        if isinstance(x, float):
            return "nan" if math.isnan(x) else float.hex(x)
        if isinstance(x, dict):
            return [[k, enc(y)] for k, y in x.items()]
        if isinstance(x, (list, tuple)):
            return [enc(y) for y in x]
        if isinstance(x, torch.Tensor):
            return tensor_digest(x)
        return x
    return hashlib.sha256(json.dumps(enc(v)).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------- sampler
PROMPTS = ["abc", "hello world", "x", "countdown 1,2,3"]


def _tiny():
    from maskrl.models import build_tiny
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    with torch.no_grad():
        a.model.get_output_embeddings().weight.mul_(20.0)  # confident: threshold commits several per step
    a.model.eval()
    return a


def _dream():
    from conftest import tiny_dream
    return tiny_dream(scale=20.0)


class ExactObserver:
    """Reads theta's exact logits on every still-masked position: max log-prob, entropy and the
    log-prob of the tokens after the step, per (row, step)."""

    exact_logits = True
    logit_scope = "masked"

    def __init__(self, n):
        from maskrl.sampling import StepRecorder
        self.n, self.maxlp, self.ent, self.tok = n, StepRecorder(), StepRecorder(), StepRecorder()

    def on_step(self, view):
        self.maxlp.add(view, view.max_log_prob.nansum(-1))
        self.ent.add(view, view.entropy)
        self.tok.add(view, view.token_log_prob(view.tokens).nansum(-1))

    def result(self):
        return {"maxlp": self.maxlp.tensor(self.n), "entropy": self.ent.tensor(self.n), "toklp": self.tok.tensor(self.n)}


def sampler_cases():
    """``(name, model, SamplerConfig kwargs, observe)`` of the pinned matrix."""
    cases = []
    for model in ("tiny", "dream"):
        for cache in ("none", "prefix", "dual"):
            for schedule in ("fixed", "threshold"):
                for tau in (0.0, 0.9):
                    for observe in (False, True):
                        kw = dict(gen_length=16, block_length=4, cache=cache, temperature=tau)
                        kw.update(steps=8) if schedule == "fixed" else kw.update(schedule="threshold", threshold=0.5)
                        cases.append((f"{model}-{cache}-{schedule}-t{tau}-obs{int(observe)}", model, kw, observe))
        cases += [
            (f"{model}-random", model, dict(gen_length=16, block_length=8, steps=8, remasking="random", temperature=0.7), False),
            (f"{model}-cfg", model, dict(gen_length=8, block_length=4, steps=4, cfg_scale=1.0, temperature=0.9), True),
            (f"{model}-suppress_eos", model, dict(gen_length=16, block_length=4, steps=16, suppress_eos=True), False),
            (f"{model}-suppress_eos-threshold", model,
             dict(gen_length=16, block_length=8, schedule="threshold", threshold=0.3, suppress_eos=True), False),
            (f"{model}-L64b16-prefix", model, dict(gen_length=64, block_length=16, steps=32, cache="prefix",
                                                   temperature=0.9), True),
        ]
    return cases


def rollout_digests(ro) -> dict[str, str]:
    out = {f: tensor_digest(getattr(ro, f)) for f in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask",
                                                      "commit_step", "commit_prob", "num_steps", "group_ids")}
    for k in sorted(ro.step_stats):
        v = ro.step_stats[k]
        out[f"step_stats.{k}"] = tensor_digest(v) if isinstance(v, torch.Tensor) else value_digest(v)
    return out


def sampler_digests() -> dict[str, dict[str, str]]:
    from maskrl.sampling import SamplerConfig, generate
    from maskrl.text import encode_prompts
    models = {"tiny": _tiny(), "dream": _dream()}
    out = {}
    for name, model, kw, observe in sampler_cases():
        ad = models[model]
        ids, mask = encode_prompts(ad.tokenizer, PROMPTS)
        obs = [ExactObserver(len(PROMPTS))] if observe else []
        ro = generate(ad, ids, mask, SamplerConfig(**kw), generator=torch.Generator().manual_seed(7), observers=obs)
        out[name] = rollout_digests(ro)
    return out


# ------------------------------------------------------------------------------------------- trainer
RECIPES = {
    "mean_field": [],
    "state_prefix_cache": ["likelihood.name=state", "rollout.cache=prefix"],
    "wd1_dps": ["objective.name=wd1", "credit=[{name: dps, lam: 0.5, dps_scope: all, clip: 2.0}]"],
    "spg_dispo": ["objective.name=spg", "likelihood={name: spg_bounds, nodes: 2, draws: 1, masking: block, "
                  "block_length: 0, eubo_beta: 1.5, p_mask_prompt: 0.0}",
                  "credit=[{name: dispo, z: 2, timing: late, power: 4.0, alpha_step: 0.1, clip_eps: 0.5}]"],
    "rldf_dtca": ["objective.name=rldf", "likelihood={name: state}", "rollout.schedule=threshold",
                  "rollout.threshold=0.3", "credit=[{name: dtca, coverage: 0.7, min_steps: 2, max_steps: 32, "
                  "pos_credit: false, calibration: true}]"],
    "state_micro_batched": ["likelihood.name=state", "train.micro_batch_size=2"],
}


def trainer_digests() -> dict[str, dict]:
    from conftest import OddChars, fresh_tiny, small_cfg
    from maskrl.tasks.base import Example
    from maskrl.trainer import RLTrainer
    out = {}
    for name, sets in RECIPES.items():
        with tempfile.TemporaryDirectory() as d:
            cfg = small_cfg(Path(d), **dict(s.split("=", 1) for s in sets))
            tr = RLTrainer(cfg, copy.deepcopy(fresh_tiny()), OddChars(), [Example(id=i, prompt=f"say a {i}") for i in range(6)])
            hist = tr.train(steps=2, progress=False, catch_signals=False)
            tr.close()
            weights = {n: tensor_digest(p) for n, p in tr.policy_eval.model.named_parameters()}
            lines = (Path(d) / "metrics.jsonl").read_text().splitlines()
        out[name] = {"weights": value_digest(weights),
                     "metrics": [value_digest(_stable(h)) for h in hist],
                     "metric_keys": [list(h) for h in hist],
                     "metrics_jsonl": hashlib.sha256("\n".join(_strip_time(l) for l in lines).encode()).hexdigest()[:16]}
    return out


def _stable(metrics: dict) -> dict:
    """The metrics without wall-clock fields (``seconds``, ``rollout_seconds``, ...: they vary run to run)."""
    return {k: v for k, v in metrics.items() if "seconds" not in k and "time" not in k}


def _strip_time(line: str) -> str:
    """A metrics.jsonl line without its wall-clock fields."""
    return json.dumps(_stable(json.loads(line)))


def compute() -> dict:
    return {"sampler": sampler_digests(), "trainer": trainer_digests()}


if __name__ == "__main__":
    torch.set_num_threads(1)  # as the test suite runs (conftest TEST_THREADS)
    data = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
    data[machine_key()] = compute()
    DIGESTS.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"recorded {machine_key()} in {DIGESTS}")
