"""Worker of ``tests/test_dispo.py::test_two_processes_with_unequal_kept_states`` (not collected).

``python tests/dispo_dist_worker.py OUT`` -- one rank of a 2-process gloo run (the launcher sets the
``torch.distributed`` variables). Each rank runs one DiSPO trainer step; rank 1's task rewards every
completion equally, so it keeps no branched state while rank 0 keeps some. Saves the weights and
metrics to ``OUT/rank{r}.pt``.
"""
from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch

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


def main(out: Path) -> None:
    from accelerate import PartialState

    rank = int(os.environ["RANK"])
    PartialState(cpu=True, timeout=timedelta(seconds=60))
    y = out / f"run{rank}.yaml"
    y.write_text(f"""
output_dir: {out / f'r{rank}'}
rollout: {{gen_length: 8, block_length: 4, steps: 4, temperature: 1.0}}
objective: {{name: diffu_grpo}}
credit: [{{name: dispo, z: 3}}]
train: {{steps: 1, prompts_per_step: 4, group_size: 3, inner_iterations: 2, lr: 1.0e-2}}
""")
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    tr = RLTrainer(load_config([y]), a, RankTask(), [Example(id=i, prompt=f"say {i}") for i in range(8)])
    m = tr.step()
    torch.save({"metrics": m, "weights": [p.detach().clone() for p in a.model.parameters()]}, out / f"rank{rank}.pt")
    tr.acc.wait_for_everyone()
    # tear the process group down before exit: left to interpreter shutdown, gloo's threads can abort
    # the process ("terminate called without an active exception", exit -6) after the work is done
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
