"""Worker of ``tests/test_dispo.py::test_two_processes_with_unequal_kept_states`` (not collected).

``python tests/dispo_dist_worker.py OUT`` -- one rank of a 2-process gloo run (the launcher sets the
``torch.distributed`` variables). Rank 1's task rewards every completion equally, so it keeps no
branched state while rank 0 keeps some. Each rank runs one DiSPO trainer step twice from the same
initial weights and seeds: first with the trainer's multi-process padding turned off
(``maskrl.trainer.pad_counts`` patched to return zeros: the behaviour before padding existed), then
as shipped. For each run it counts the model forwards of ``optimize`` (θ_old, reference and θ
passes, by forward pre-hooks) and the rows of every loss term, and saves them with the weights and
metrics to ``OUT/rank{r}.pt`` as ``{"nopad": {...}, "pad": {...}}``.
"""
from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch

import maskrl.trainer
from maskrl.config import load_config
from maskrl.models import build_tiny
from maskrl.tasks.base import Example, Task
from maskrl.trainer import RLTrainer


class RankTask(Task):
    name = "rank_dispo"

    def reward(self, prompts, completions, **_):
        if int(os.environ["RANK"]) == 1:
            return [0.5] * len(completions)
        return [sum(ord(ch) % 2 for ch in c) / max(1, len(c)) for c in completions]


def run(out: Path, rank: int, tag: str, keep: list) -> dict:
    y = out / f"run{rank}_{tag}.yaml"
    y.write_text(f"""
output_dir: {out / f'r{rank}_{tag}'}
rollout: {{gen_length: 8, block_length: 4, steps: 4, temperature: 1.0}}
objective: {{name: diffu_grpo}}
credit: [{{name: dispo, z: 3}}]
train: {{steps: 1, prompts_per_step: 4, group_size: 3, inner_iterations: 2, lr: 1.0e-2, micro_batch_size: 4}}
""")
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    tr = RLTrainer(load_config([y]), a, RankTask(), [Example(id=i, prompt=f"say {i}") for i in range(8)])
    keep.append(tr)  # keeps the DiSPO instance alive: a new one must not reuse its id (observer seeds)
    forwards = {"old": 0, "ref": 0, "theta": 0}
    counting = [False]

    def hook(kind):
        def count(module, args, kwargs=None):
            if counting[0]:
                forwards["theta" if kind == "policy" and torch.is_grad_enabled() else
                         "old" if kind == "policy" else "ref"] += 1
        return count

    a.model.register_forward_pre_hook(hook("policy"))
    assert tr.reference is not None  # diffu_grpo's default β > 0 and no peft: a frozen copy
    tr.reference.model.register_forward_pre_hook(hook("ref"))
    term_rows = {}
    loss_terms, optimize = tr.loss_terms, tr.optimize

    def recording_loss_terms(batch):
        terms = loss_terms(batch)
        term_rows.update({t.name: t.rollout.batch_size for t in terms})
        return terms

    def counting_optimize(batch):
        counting[0] = True
        try:
            return optimize(batch)
        finally:
            counting[0] = False

    local = {}  # this rank's own credit metrics (before the trainer averages them over ranks)
    collect = tr.collect

    def recording_collect(*args, **kwargs):
        b = collect(*args, **kwargs)
        local.update(b.metrics)
        return b

    tr.loss_terms, tr.optimize, tr.collect = recording_loss_terms, counting_optimize, recording_collect
    m = tr.step()
    return {"metrics": m, "weights": [p.detach().clone() for p in a.model.parameters()], "forwards": forwards,
            "term_rows": term_rows, "credit_local": local}


def main(out: Path) -> None:
    from accelerate import PartialState

    rank = int(os.environ["RANK"])
    PartialState(cpu=True, timeout=timedelta(seconds=float(os.environ.get("MASKRL_TEST_DIST_TIMEOUT", "60"))))
    keep: list = []
    shipped = maskrl.trainer.pad_counts
    maskrl.trainer.pad_counts = lambda work: torch.zeros_like(work, dtype=torch.long)  # padding off
    try:
        nopad = run(out, rank, "nopad", keep)
    finally:
        maskrl.trainer.pad_counts = shipped
    pad = run(out, rank, "pad", keep)
    torch.save({"nopad": nopad, "pad": pad}, out / f"rank{rank}.pt")
    from dist_worker import end_group

    end_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
