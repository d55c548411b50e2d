"""E[Σ_i ELBO_i] and E[Σ_i EUBO_i] of ``spg_bounds`` against the number of blocks (issue 19 item 1).

On a model whose every token has p = 1/V (a constant model, no transformer), both bounds' expected
sums must not depend on how the completion is cut into blocks (docs/spec.md §1.5). Writes, per block count,
the mean and standard error over N sequences and the ratio to one block, as JSON::

    PYTHONPATH=src python benchmarks/fidelity/spg_eubo_blocks.py --out benchmarks/fidelity/spg_eubo_blocks.json

Before the fix (the ``n_blocks`` factor inside the EUBO's log) 4 blocks gave an EUBO ratio of 0.196
(L = 16, N = 20000, V = 64, draws 1); after it, 1.000 within its standard error.
"""
from __future__ import annotations

import argparse
import json
import math

import torch

from maskrl.likelihood import LIKELIHOODS
from maskrl.types import Rollout


class Constant:
    """``log_probs_at`` of a model giving every token probability ``1/V``."""

    mask_id = -1

    def __init__(self, vocab: int):
        self.lp = -math.log(vocab)

    def log_probs_at(self, x, attn, rows, cols, targets):
        return torch.full(rows.shape, self.lp)


def rollout(n: int, L: int) -> Rollout:
    z = torch.zeros(n, L, dtype=torch.long)
    return Rollout(prompt_ids=torch.ones(n, 3, dtype=torch.long), prompt_mask=torch.ones(n, 3, dtype=torch.bool),
                   completion_ids=z + 5, completion_mask=torch.ones(n, L, dtype=torch.bool), commit_step=z,
                   commit_prob=torch.ones(n, L), num_steps=torch.ones(n, dtype=torch.long), group_ids=torch.arange(n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--sequences", type=int, default=20000)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--draws", type=int, default=1)
    ap.add_argument("--masking", default="block")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    L, n = a.length, a.sequences
    res = {}
    for nb in (1, 2, 4, 8):
        est = LIKELIHOODS.get("spg_bounds")(block_length=L // nb, draws=a.draws, masking=a.masking,
                                            nodes=1 if a.masking == "spg_public" else 2)
        out = est(Constant(a.vocab), rollout(n, L), torch.Generator().manual_seed(nb))
        el, eu = out["elbo"], out["eubo"]
        row = {}
        for k, v in (("elbo", el.sum(-1).double()), ("eubo", eu.sum(-1).double())):
            row[k], row[k + "_se"] = v.mean().item(), v.std().item() / math.sqrt(n)
        res[str(nb)] = row
    for row in res.values():
        row["elbo_ratio"], row["eubo_ratio"] = row["elbo"] / res["1"]["elbo"], row["eubo"] / res["1"]["eubo"]
    doc = {"config": vars(a), "exact_elbo": -L * math.log(a.vocab), "blocks": res}
    text = json.dumps(doc, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
