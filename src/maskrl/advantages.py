"""Group-relative advantages (docs/spec.md §1.3)."""
from __future__ import annotations

import torch

NORMALIZE = ("mean", "mean_std", "mean_std_unbiased", "leave_one_out")

#: verl's GRPO estimator adds this to the std (``compute_grpo_outcome_advantage``, ``epsilon``)
GRPO_STD_EPS = 1e-6


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, normalize: str = "mean",
                     std_floor: float = 0.01) -> torch.Tensor:
    """Advantage of each completion relative to the other completions of its prompt.

    Args:
        rewards: ``[N]`` float rewards.
        group_ids: ``[N]`` long, equal for completions of the same prompt (any order, any group sizes).
        normalize: **[choice]** ``"mean"`` (``A = r − mean_g r``), ``"mean_std"``
            (``(r − mean)/max(std, std_floor)``, population std), ``"mean_std_unbiased"`` (verl's GRPO
            estimator, DARE's ``adv_estimator: grpo``: ``(r − mean)/(std + 1e-6)`` with Bessel's std, and
            for a group of one mean 0 and std 1), ``"leave_one_out"``
            (``r − mean of the other G−1``; 0 for a group of one).
        std_floor: lower bound of the std in ``mean_std`` (docs/spec.md: 0.01).

    Returns:
        ``[N]`` float32 advantages.

    Raises:
        ValueError: on an unknown ``normalize`` or mismatched shapes.
    """
    if normalize not in NORMALIZE:
        raise ValueError(f"normalize {normalize!r} is not one of {NORMALIZE}")
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must both be [N]")
    r = rewards.float()
    _, inv = torch.unique(group_ids, return_inverse=True)  # [N] -> 0..B-1
    n_groups = int(inv.max()) + 1
    count = torch.zeros(n_groups, device=r.device).index_add_(0, inv, torch.ones_like(r))  # [B]
    total = torch.zeros(n_groups, device=r.device).index_add_(0, inv, r)  # [B]
    mean = (total / count)[inv]  # [N]
    if normalize == "mean":
        return r - mean
    if normalize == "leave_one_out":
        others = (count[inv] - 1).clamp(min=1)
        loo = (total[inv] - r) / others
        return torch.where(count[inv] > 1, r - loo, torch.zeros_like(r))
    sq = torch.zeros(n_groups, device=r.device).index_add_(0, inv, (r - mean) ** 2)  # [B]
    if normalize == "mean_std_unbiased":
        single = count[inv] == 1
        std = (sq / (count - 1).clamp(min=1)).sqrt()[inv]
        return torch.where(single, r, r - mean) / (torch.where(single, torch.ones_like(std), std) + GRPO_STD_EPS)
    std = (sq / count).sqrt()[inv]
    return (r - mean) / std.clamp(min=std_floor)


def informative_group_counts(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[int, int]:
    """``(informative, groups)``: how many groups have rewards that are not all equal, and how many
    groups there are (sums over processes give the whole batch's, :func:`informative_groups` is their
    ratio).

    Args:
        rewards: ``[N]`` float rewards.
        group_ids: ``[N]`` long group of each completion.

    Returns:
        Two ints, ``0 <= informative <= groups``; ``(0, 0)`` for an empty batch.
    """
    if group_ids.numel() == 0:
        return 0, 0
    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1
    r = rewards.float()
    lo = torch.full((n_groups,), float("inf"), device=r.device).scatter_reduce(0, inv, r, "amin")
    hi = torch.full((n_groups,), float("-inf"), device=r.device).scatter_reduce(0, inv, r, "amax")
    return int((hi > lo).sum()), n_groups


def informative_groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Fraction of groups whose rewards are not all equal -- the groups that carry a learning signal
    (a group of equal rewards gets advantage 0 under every ``normalize``).

    Args:
        rewards: ``[N]`` float rewards.
        group_ids: ``[N]`` long group of each completion.

    Returns:
        A float in ``[0, 1]`` (0.0 for an empty batch).
    """
    informative, groups = informative_group_counts(rewards, group_ids)
    return informative / max(groups, 1)
