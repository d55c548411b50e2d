"""Worker processes of ``tests/test_distributed.py``'s logging tests (not collected: no ``test_`` prefix):
what N processes log must be what one process logs (issue 50 §1).

``python tests/logging_dist_worker.py lr OUT`` -- on one process (no launcher variables) or one rank of a
gloo launch: short runs under every ``train.lr_scheduler`` with and without warmup (:data:`SCHEDULES`);
each run's logged ``lr`` per step and the rate after its last optimizer step go to ``OUT/lr_single.pt``
(one process) or ``OUT/lr{rank}.pt``.

``python tests/logging_dist_worker.py batch OUT`` -- one rank of a gloo launch training one step on
:class:`RankRewards` (rewards all 0 on rank 0, alternating on rank 1): this rank's batch (rewards,
group ids and rollout fields) and the step's metrics, and (main process) the ``metrics.jsonl`` row,
go to ``OUT/batch{rank}.pt``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

from maskrl.config import RunConfig, TinyModelConfig, TrainConfig
from maskrl.models import build_tiny
from maskrl.sampling import SamplerConfig
from maskrl.tasks.base import Example, Task
from maskrl.trainer import RLTrainer

SHAPE = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, seed=0)
STEPS = 4
#: (train.lr_scheduler, train.warmup_steps, train.inner_iterations): every schedule, with and without warmup
SCHEDULES = [(name, warmup, mu) for name in ("constant_with_warmup", "constant", "linear", "cosine")
             for warmup, mu in ((0, 1), (1, 2))]


class RankRewards(Task):
    """A plug-in task whose reward depends on the process: 0 for every row on rank 0, and 0, 1, 0, 1, ...
    on the other ranks (so each group of 2 there has one of each)."""

    name = "rank_rewards"

    def reward(self, prompts, completions, **_):
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        return [0.0 if rank == 0 else float(i % 2) for i in range(len(completions))]


def trainer(out_dir: Path, task: Task, rollout: dict | None = None, **train) -> RLTrainer:
    """The tiny model on a small run (L 8 in blocks of 4, 2 prompts × 2 per process); ``rollout``:
    more sampler settings."""
    cfg = RunConfig(output_dir=str(out_dir), model=dataclasses.replace(RunConfig().model, tiny=SHAPE),
                    rollout=SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=1.0, **(rollout or {})),
                    train=TrainConfig(**{"prompts_per_step": 2, "group_size": 2, "lr": 1e-4, "seed": 7, "steps": STEPS,
                                         "save_every": 0, "report_to": [], **train}))
    policy = build_tiny(hidden_size=SHAPE.hidden_size, num_layers=SHAPE.num_layers, num_heads=SHAPE.num_heads,
                        intermediate_size=SHAPE.intermediate_size, seed=SHAPE.seed)
    return RLTrainer(cfg, policy, task, [Example(id=i, prompt=f"say {i}", fields={}) for i in range(4)])


def run_lr(out: Path) -> None:
    from conftest import OddChars

    rank = start()
    got = {}
    for name, warmup, mu in SCHEDULES:
        tr = trainer(out / f"lr_{name}_{warmup}_{rank}", OddChars(), lr_scheduler=name, warmup_steps=warmup,
                     inner_iterations=mu)
        history = tr.train(progress=False, catch_signals=False)
        got[(name, warmup, mu)] = {"logged": [m["lr"] for m in history], "after": tr.optimizer.param_groups[0]["lr"]}
        tr.close()
    torch.save(got, out / ("lr_single.pt" if rank is None else f"lr{rank}.pt"))
    finish(rank)


def run_batch(out: Path) -> None:
    import maskrl.sampling

    rank = start()
    # the prefix cache makes rollout/mismatch non-zero; record this rank's own value and token count
    tr = trainer(out / f"batch_rank{rank}", RankRewards(), {"cache": "prefix", "mismatch_every": 1}, steps=1,
                 inner_iterations=1)
    own, real = [], maskrl.sampling.rollout_mismatch
    maskrl.sampling.rollout_mismatch = lambda adapter, rollout: own.append(real(adapter, rollout)) or own[-1]
    batches = []
    collect = tr.collect
    tr.collect = lambda examples=None: batches.append(collect(examples)) or batches[-1]
    history = tr.train(progress=False, catch_signals=False)
    tr.close()
    b = batches[0]
    ro = b.rollout
    result = {"rewards": b.rewards, "group_ids": ro.group_ids, "completion_ids": ro.completion_ids,
              "completion_mask": ro.completion_mask, "commit_prob": ro.commit_prob, "metrics": history[0],
              "mismatch": own}
    if tr.acc.is_main_process:
        result["jsonl"] = [json.loads(x) for x in (tr.out_dir / "metrics.jsonl").read_text().splitlines()]
    torch.save(result, out / f"batch{rank}.pt")
    finish(rank)


def start() -> int | None:
    """Start the gloo group when launched as a rank (:func:`dist_worker.start_group`); its rank, or
    ``None`` on a plain single process."""
    if "RANK" not in os.environ:
        return None
    from dist_worker import start_group

    return start_group()[0]


def finish(rank: int | None) -> None:
    if rank is not None:
        from dist_worker import end_group

        end_group()


if __name__ == "__main__":
    mode, out_dir = sys.argv[1], Path(sys.argv[2])
    {"lr": run_lr, "batch": run_batch}[mode](out_dir)
