"""The values behind the golden digests, for the twins that hold on every x86-64 CPU (``twin.py``).

``pin.py`` pins sha256 digests, valid only on the machine key that recorded them. This module records
the same runs as values -- per sampler case the decoded rows (completion ids and mask, commit steps,
step counts) and their floats (commit probabilities, the observers' per-step statistics); per trainer
recipe the metrics of both steps and, per weight tensor, the norm of the two steps' update and its
projections on two fixed random directions -- into ``tests/golden/portable.json``, and
``tests/test_golden.py``'s twins compare with them on any machine: rows exactly, where they are not
ties; floats within tolerances that follow float32's ``eps`` and the quantity's scale.

``python tests/golden/portable.py`` re-records (only for a change meant to move values, as pin.py).
"""
from __future__ import annotations

import copy
import json
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
PORTABLE = HERE / "portable.json"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import pin  # noqa: E402

#: the Rollout fields that are decisions (compared exactly, row by row, outside ties)
DECISIONS = ("completion_ids", "completion_mask", "commit_step")
#: weight directions per tensor for the update's projections
DIRECTIONS = 2


def sampler_models() -> dict:
    """``{"tiny": adapter, "dream": adapter}``: pin.py's two models."""
    return {"tiny": pin._tiny(), "dream": pin._dream()}


def run_case(models: dict, case):
    """One pin.py sampler case on pin.PROMPTS, generator seeded 7: the Rollout."""
    from maskrl.sampling import SamplerConfig, generate
    from maskrl.text import encode_prompts

    _, model, kw, observe = case
    ad = models[model]
    ids, mask = encode_prompts(ad.tokenizer, pin.PROMPTS)
    obs = [pin.ExactObserver(len(pin.PROMPTS))] if observe else []
    return generate(ad, ids, mask, SamplerConfig(**kw), generator=torch.Generator().manual_seed(7), observers=obs)


def decisions(ro) -> torch.Tensor:
    """``[N, 3L + 1]`` long: a row's decisions (completion ids, mask, commit steps, its step count)."""
    return torch.cat([getattr(ro, f).long() for f in DECISIONS] + [ro.num_steps.long()[:, None]], 1)


def floats(ro) -> dict[str, torch.Tensor]:
    """The rollout's float fields, ``[N, L]`` / ``[N, T]`` each: commit probabilities and every step
    statistic (one of ``[N, T, L]``, as the entropy, summed over its positions: NaN where none)."""
    out = {"commit_prob": ro.commit_prob}
    for k, v in sorted(ro.step_stats.items()):
        if isinstance(v, torch.Tensor) and v.dim() > 2:
            flat = v.flatten(2)
            v = flat.nansum(-1).where(~flat.isnan().all(-1), torch.nan)
        if isinstance(v, torch.Tensor):
            out[f"step_stats.{k}"] = v
    return out


def sampler_records() -> dict:
    models = sampler_models()
    out = {}
    for case in pin.sampler_cases():
        ro = run_case(models, case)
        out[case[0]] = {"decisions": decisions(ro).tolist(),
                        "floats": {k: _short(v.double().tolist()) for k, v in floats(ro).items()}}
    return out


def _short(x):
    """Floats with 9 significant digits (every float32 round-trips), nested lists kept."""
    return [_short(y) for y in x] if isinstance(x, list) else float(f"{x:.9g}")


def directions(name: str, shape: torch.Size) -> torch.Tensor:
    """``[DIRECTIONS, *shape]`` float64 Gaussian directions, seeded by the tensor's name (stable)."""
    seed = int.from_bytes(name.encode()[-8:].rjust(8, b"\0"), "little") % (2 ** 63)
    return torch.randn((DIRECTIONS, *shape), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def update_summary(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    """Per weight tensor ``[||Δ||, <Δ, d_1>, <Δ, d_2>]`` (float64) of the update ``Δ = after - before``."""
    out = {}
    for name, w in after.items():
        delta = w.detach().double() - before[name].double()
        proj = (directions(name, delta.shape) * delta).flatten(1).sum(1)
        out[name] = [float(delta.norm())] + proj.tolist()
    return out


def train_recipe(sets: list[str], hook=None) -> dict:
    """Two RL steps of one pin.RECIPES recipe: ``{"metrics": [...], "update": update_summary}``.
    ``hook(model)`` returns a context manager entered around training (the twins' noise probe)."""
    import contextlib

    from conftest import OddChars, fresh_tiny, small_cfg
    from maskrl.tasks.base import Example
    from maskrl.trainer import RLTrainer

    with tempfile.TemporaryDirectory() as d:
        cfg = small_cfg(Path(d), **dict(s.split("=", 1) for s in sets))
        model = copy.deepcopy(fresh_tiny())
        before = {n: p.detach().clone() for n, p in model.model.named_parameters()}
        tr = RLTrainer(cfg, model, OddChars(), [Example(id=i, prompt=f"say a {i}") for i in range(6)])
        with (hook(tr.policy_eval.model) if hook else contextlib.nullcontext()):
            hist = tr.train(steps=2, progress=False, catch_signals=False)
        tr.close()
        after = dict(tr.policy_eval.model.named_parameters())
        return {"metrics": [pin._stable(h) for h in hist], "update": update_summary(before, after)}


def trainer_records() -> dict:
    return {name: train_recipe(sets) for name, sets in pin.RECIPES.items()}


if __name__ == "__main__":
    torch.set_num_threads(1)  # as the test suite runs (conftest TEST_THREADS)
    data = {"machine": pin.machine_key(), "sampler": sampler_records(), "trainer": trainer_records()}
    PORTABLE.write_text(json.dumps(data, indent=None, sort_keys=True) + "\n")
    print(f"recorded on {pin.machine_key()} in {PORTABLE} ({PORTABLE.stat().st_size} bytes)")
