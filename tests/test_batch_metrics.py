"""The metrics of a step's batch are those of the whole global batch (issue 50 §1,
:mod:`maskrl.training.batch_metrics`): two processes' shares give the metrics of their rows together,
hand-computed, where the mean of the shares' metrics does not. (The 2-process trainer run is in
tests/test_distributed.py.)"""
import math

import pytest
import torch

from maskrl.advantages import informative_group_counts, informative_groups
from maskrl.health import rollout_diagnostics
from maskrl.training.batch_metrics import BATCH_COUNTS, batch_counts, batch_metrics, sum_over_processes
from maskrl.types import Rollout

E = math.exp(-1.0)


def _rollout(ids: list[list[int]], valid: list[int], prob: float, groups: list[int]) -> Rollout:
    ids_t = torch.tensor(ids)
    n, L = ids_t.shape
    mask = torch.arange(L)[None] < torch.tensor(valid)[:, None]
    return Rollout(prompt_ids=torch.zeros(n, 1, dtype=torch.long), prompt_mask=torch.ones(n, 1, dtype=torch.bool),
                   completion_ids=ids_t, completion_mask=mask, commit_step=torch.zeros(n, L, dtype=torch.long),
                   commit_prob=torch.full((n, L), prob), num_steps=torch.full((n,), L), group_ids=torch.tensor(groups))


# share A (process 0): one row "5 5 5 5", every token committed with probability 1; reward 0, 1 group
A = (torch.tensor([0.0]), _rollout([[5, 5, 5, 5]], [4], 1.0, [0]))
# share B (process 1): "5 6 7 8" and a row that is only its stop token, each token at probability e^-1;
# rewards 0 and 1 in one group (informative)
B = (torch.tensor([0.0, 1.0]), _rollout([[5, 6, 7, 8], [9, 9, 9, 9]], [4, 1], E, [0, 0]))


class TwoProcesses:
    """An accelerator stand-in on process 0 of 2 whose other process holds ``other``'s counts."""

    num_processes, device = 2, "cpu"

    def __init__(self, other: dict[str, float]) -> None:
        self.other = other

    def reduce(self, t: torch.Tensor, reduction: str) -> torch.Tensor:
        assert reduction == "sum" and t.dtype == torch.float64
        return t + torch.tensor([self.other[k] for k in BATCH_COUNTS], dtype=torch.float64)


@pytest.mark.numerics
def test_two_shares_give_the_metrics_of_the_whole_batch_by_hand():
    mine, other = batch_counts(*A), batch_counts(*B)
    diag, groups = batch_metrics(sum_over_processes(TwoProcesses(other), mine))
    # 9 tokens, Σ −log p = 0 + 5; rows: distinct 1/4 + 1 + 1, runs 4 + 1 + 1, 1 empty, degenerate: A's
    # run of 4 and the empty row; groups: A's (0) and B's (informative); 9 tokens over 3 rows
    want = {"commit_nll": 5 / 9, "distinct_frac": 2.25 / 3, "longest_run": 2.0, "empty_frac": 1 / 3,
            "degenerate_frac": 2 / 3}
    eps = torch.finfo(torch.float32).eps  # −log of float32 e^-1, 5 terms
    assert diag == pytest.approx(want, rel=8 * eps)
    assert groups == {"informative_groups": 0.5, "completion_tokens": 3.0}
    # the mean of the two shares' own metrics is not the whole batch's (what the test guards against)
    own = [rollout_diagnostics(r.completion_ids, r.completion_mask, r.commit_prob) for _, r in (A, B)]
    assert (own[0]["commit_nll"] + own[1]["commit_nll"]) / 2 == pytest.approx(0.5, rel=8 * eps) != diag["commit_nll"]
    assert (own[0]["distinct_frac"] + own[1]["distinct_frac"]) / 2 == 0.625


def test_one_process_keeps_the_metrics_as_they_were():
    """On one process: the counts are not reduced, and the values are bit for bit the float32 means and
    the diagnostics the trainer logged before (pinned by tests/golden)."""
    # C: 3 groups, 1 informative, 17 tokens over 6 rows (1/3 and 17/6 round differently in float32)
    C = (torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
         _rollout([[5, 6, 7]] * 3 + [[5, 5, 6], [8, 8, 8], [8, 7, 8]], [3, 3, 3, 3, 3, 2], 0.5, [0, 0, 1, 1, 2, 2]))
    for rewards, ro in (A, B, C):
        counts = batch_counts(rewards, ro)

        class One:
            num_processes = 1

        assert sum_over_processes(One(), counts) is counts
        diag, groups = batch_metrics(counts)
        assert diag == rollout_diagnostics(ro.completion_ids, ro.completion_mask, ro.commit_prob)
        assert groups["completion_tokens"] == ro.completion_mask.sum(-1).float().mean().item()
        informative, n_groups = informative_group_counts(rewards, ro.group_ids)
        was = torch.tensor([1.0] * informative + [0.0] * (n_groups - informative)).mean().item()
        assert groups["informative_groups"] == was
    assert informative_group_counts(*C[:1], C[1].group_ids) == (1, 3) and batch_metrics(counts)[1]["completion_tokens"] \
        != 17 / 6  # (C's float32 rounding was exercised)


def test_informative_group_counts():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5])
    g = torch.tensor([0, 0, 1, 1, 7, 7])
    assert informative_group_counts(r, g) == (1, 3)
    assert informative_groups(r, g) == 1 / 3
    assert informative_group_counts(torch.zeros(0), torch.zeros(0, dtype=torch.long)) == (0, 0)
