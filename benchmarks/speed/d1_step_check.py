"""A check of ``d1_step.py``'s vocab-8k / L-128 cell: one worker process of either side (d1's trainer, or
maskrl's ``RLTrainer`` from whichever ``src`` ``PYTHONPATH`` names, an older commit's included), with

- a forward counter: every forward of the LLaDA-layout model (its vocabulary-sized ``nn.Embedding``, a
  global forward hook) counted per phase of ``d1_step.Clock`` (``sampler``, ``reference``,
  ``theta_forward``) and the input shapes ``[N, prompt + L]`` seen;
- the threads torch runs with inside the worker and the ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` it sees;
- on maskrl's side, the hash-reward task defined here from ``id_tokens.hash_reward`` (``gpu_grid``, where
  ``d1_step`` takes it from, imports modules older maskrl commits lack); the same reward.

It prints ``d1_step``'s result line with ``info``, ``forwards_per_step`` and ``shapes_total`` added. The
cell's folder and spec come from ``d1_step.py`` (``export_code`` and its ``build`` worker); run each
process under ``/usr/bin/time -v`` for page faults and user / system time::

    python benchmarks/speed/d1_step_check.py <d1|maskrl> "$(cat spec.json)"

``docs/sampler.md`` (the d1 section) gives the whole procedure and the numbers; the record is
``benchmarks/speed/d1_step_check.json``.
"""
import collections
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import d1_step as m  # noqa: E402

side, spec = sys.argv[1], json.loads(sys.argv[2])
if side == "maskrl":  # the same reward as gpu_grid.HashReward, free of the modules older commits lack
    import types

    from id_tokens import hash_reward
    from maskrl.tasks.base import Task

    class HashReward(Task):
        name = "hash_reward"

        def reward(self, prompts, completions, **_):
            return hash_reward(completions)
    sys.modules["gpu_grid"] = types.SimpleNamespace(HashReward=HashReward)

stack = ["step_other"]
fwd: collections.Counter = collections.Counter()
shapes: collections.Counter = collections.Counter()
orig_wrap = m.Clock.wrap


def wrap(self, key, fn):
    inner = orig_wrap(self, key, fn)

    def run(*a, **k):
        stack.append(key if isinstance(key, str) else key[torch.is_grad_enabled()])
        try:
            return inner(*a, **k)
        finally:
            stack.pop()
    return run


m.Clock.wrap = wrap


def hook(mod, inp, out):
    if isinstance(mod, torch.nn.Embedding) and mod.num_embeddings == spec["vocab"]:
        fwd[stack[-1]] += 1
        shapes[f"{stack[-1]}:{tuple(inp[0].shape)}"] += 1


torch.nn.modules.module.register_module_forward_hook(hook)
torch.set_num_threads(1)
info = {"threads": torch.get_num_threads(), "interop": torch.get_num_interop_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS"),
        "pythonpath": os.environ.get("PYTHONPATH")}
out = {"d1": m.d1_step, "maskrl": m.maskrl_step}[side](spec)
info["threads_after"] = torch.get_num_threads()
n = len(out["steps"])
print(m.MARK + json.dumps(out | {"info": info, "forwards_per_step": {k: v / n for k, v in fwd.items()},
                                  "shapes_total": dict(shapes), "n_steps": n}), flush=True)
