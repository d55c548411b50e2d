"""DTCA (docs/spec.md §3; Chen et al., "DTCA: Denoising Token Credit Assignment for Reinforcement Learning in
Diffusion Language Models"): part-of-speech token credit, step selection and entropy-flow calibration
on the RLDF base (:mod:`maskrl.credit.rldf`).

Three separately switchable pieces, each a pure function tested on hand-computed cases:

- **step selection** (§3.2): ``I_t = Σ_{i∈C_t} w_{c_i}(1 − p_i)``; keep the smallest set of
  highest-scoring steps whose sum reaches 70 % of ``Σ_t I_t``, clamped to [2, 32] steps
  (:func:`step_importance`, :func:`coverage_steps`). Replaces RLDF's k = 4 sampled steps.
- **in-step POS credit** (§3.3): at a chosen step the trained positions B_t are the step's commits
  plus the masked positions kept by RLDF's p ≥ 0.6 filter; ``a_{t,i} = w_{c_i}/mean_{j∈B_t} w_{c_j}``
  (mean 1 inside a step), ``A_{t,i} = a_{t,i}·A`` (:func:`in_step_credit`).
- **entropy-flow calibration** (§3.4, OPEFO-style): ``ΔH_i = −η·A_{t,i}·p_i·(log p_i + H_i)``; per
  response b, ``λ_b = clip((Σ_{S⁻}|ΔH| − Σ_{S⁺}|ΔH|)/(Σ|ΔH| + 1e-12), ±0.95)``, credit in S⁺ × (1 + λ_b),
  in S⁻ × (1 − λ_b), then rescaled so that ``Σ|A_{t,i}|`` of the response is unchanged
  (:func:`entropy_flow_calibrate`).

POS classes come from the **final** completion: a tagging function (``tagger: "pkg.module:function"``,
called as ``fn(tokenizer, completion_ids [N, L], completion_mask [N, L]) -> N lists of L class
names``) and a JSON table ``class -> w_c`` (:func:`load_pos_weights`; the offline estimation of §3.1
writes it). Without a table every w_c is 1 (then selection uses ``1 − p_i`` alone and the POS credit
is the identity: the "DTCA − POS credit" ablation).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch

from maskrl.credit.base import CREDITS, CreditBatch, CreditContext, CreditModule
from maskrl.credit.base import ShareMax, ShareMean, ShareMin
from maskrl.credit.rldf import (check_state_likelihood, check_step_sampling, chosen_pairs, commit_observers,
                                commit_probs, filter_metrics, replace_base, sample_steps, step_surprise, steps_term)
from maskrl.sampling.edit import refuse_edited

SELECTIONS = ("coverage", "sample")
LAMBDA_CLIP = 0.95


# ---------------------------------------------------------------------------------------------- pieces
def step_importance(commit_step: torch.Tensor, commit_prob: torch.Tensor, token_weight: torch.Tensor,
                    valid: torch.Tensor, num_steps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """DTCA's step scores ``I_t = Σ_{i∈C_t} w_{c_i}·(1 − p_i)`` (docs/spec.md §3.2).

    Args:
        commit_step: ``[N, L]`` long; commit_prob: ``[N, L]`` float (``p_i`` at commit);
        token_weight: ``[N, L]`` float, ``w_{c_i}`` of each position; valid: ``[N, L]`` bool.
        num_steps: width T (default ``max(commit_step) + 1``).

    Returns:
        ``(I [N, T] float32, present [N, T] bool)``; ``present``: the step committed a valid position.
    """
    n = commit_step.shape[0]
    t = num_steps if num_steps is not None else (int(commit_step.max().item()) + 1 if commit_step.numel() else 0)
    cs = commit_step.long().clamp(min=0)
    val = (token_weight.double() * (1.0 - commit_prob.double())) * valid
    imp = torch.zeros(n, t, dtype=torch.float64, device=cs.device).scatter_add_(1, cs, val)
    count = torch.zeros(n, t, dtype=torch.float64, device=cs.device).scatter_add_(1, cs, valid.double())
    return imp.float(), count > 0


def coverage_steps(importance: torch.Tensor, present: torch.Tensor, coverage: float = 0.7, min_steps: int = 2,
                   max_steps: int = 32) -> torch.Tensor:
    """Per row, the smallest set of highest-``I`` steps whose sum reaches ``coverage·Σ_t I_t``, its size
    clamped to ``[min_steps, max_steps]`` (and to the row's present steps) (docs/spec.md §3.2).

    Args:
        importance: ``[N, T]`` float ``I_t >= 0``; present: ``[N, T]`` bool.
        coverage: share of ``Σ I`` to reach (0.7); min_steps, max_steps: the clamp (2, 32).

    Returns:
        ``[N, max_steps]`` long chosen steps, highest ``I`` first (ties: lower step first), padded
        with ``-1``.

    Raises:
        ValueError: ``coverage`` outside (0, 1] or ``1 <= min_steps <= max_steps`` violated.
    """
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"coverage (={coverage}) must lie in (0, 1]")
    if not 1 <= min_steps <= max_steps:
        raise ValueError(f"need 1 <= min_steps (={min_steps}) <= max_steps (={max_steps})")
    n, t = importance.shape
    imp = torch.where(present, importance.double(), torch.full_like(importance, -1.0, dtype=torch.float64))
    # stable descending sort: equal scores keep step order
    order = torch.sort(imp, dim=1, descending=True, stable=True).indices  # [N, T]
    vals = imp.gather(1, order).clamp(min=0.0)
    total = vals.sum(1, keepdim=True)
    # smallest count whose cumulative sum reaches the target (1e-12 relative slack for float sums)
    reached = vals.cumsum(1) >= coverage * total * (1 - 1e-12)
    need = reached.long().argmax(1) + 1  # first index that reaches, as a count
    avail = present.sum(1)
    count = need.clamp(min=min_steps, max=max_steps)
    count = torch.minimum(count, avail)
    width = max_steps
    idx = torch.arange(t, device=imp.device)[None, :]
    chosen = torch.where(idx < count[:, None], order, torch.full_like(order, -1))
    if t >= width:
        return chosen[:, :width]
    return torch.cat([chosen, chosen.new_full((n, width - t), -1)], 1)


def in_step_credit(token_weight: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
    """``a_{t,i} = w_{c_i} / mean_{j∈B_t} w_{c_j}`` (docs/spec.md §3.3): mean 1 over each row's trained set.

    Args:
        token_weight: ``[M, L]`` float ``w_{c_i}`` (> 0); trained: ``[M, L]`` bool, B_t of each state row.

    Returns:
        ``[M, L]`` float32, 0 outside ``trained`` (a row with empty B_t is all 0).
    """
    w = token_weight.double() * trained
    mean = w.sum(-1, keepdim=True) / trained.sum(-1, keepdim=True).clamp(min=1)
    return torch.where(trained, w / mean.clamp(min=1e-300), torch.zeros_like(w)).float()


def entropy_flow_calibrate(advantages: torch.Tensor, prob: torch.Tensor, entropy: torch.Tensor,
                           trained: torch.Tensor, response: torch.Tensor, eta: float = 1.0,
                           clip: float = LAMBDA_CLIP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Entropy-flow calibration (docs/spec.md §3.4; OPEFO-style), per response.

    ``ΔH_i = −η·A_i·p_i·(log p_i + H_i)``; per response b (all its trained tokens over all its chosen
    steps) S⁺ = {ΔH > 0}, S⁻ = {ΔH < 0};
    ``λ_b = clip((Σ_{S⁻}|ΔH| − Σ_{S⁺}|ΔH|)/(Σ|ΔH| + 1e-12), −clip, clip)``; A × (1 + λ_b) on S⁺,
    × (1 − λ_b) on S⁻ (tokens with ΔH = 0 unchanged), then × ``Σ|A| / Σ|A'|`` over the response so
    its total absolute credit is unchanged. Tokens in the same set keep their ratio. η > 0 does not
    change λ_b (it cancels) and is kept for the record.

    Args:
        advantages: ``[M, L]`` float ``A_{t,i}``; prob: ``[M, L]`` current probability of the target
            token; entropy: ``[M, L]`` entropy H_i (nats) of the position's distribution;
        trained: ``[M, L]`` bool; response: ``[M]`` long, the response (sequence) of each state row.
        eta: η > 0; clip: bound of |λ_b| (0.95).

    Returns:
        ``(A' [M, L] float32, lam [B] float32, delta_h [M, L] float32)``, with B = ``max(response)+1``
        (λ = 0 for a response without tokens).
    """
    a = advantages.double() * trained
    p = prob.double().clamp(min=1e-300)
    dh = torch.where(trained, -eta * a * p * (p.log() + entropy.double()), torch.zeros_like(a))
    b = int(response.max().item()) + 1 if response.numel() else 0
    pos = torch.zeros(b, dtype=torch.float64, device=a.device).index_add_(0, response, (dh.clamp(min=0)).sum(-1))
    neg = torch.zeros(b, dtype=torch.float64, device=a.device).index_add_(0, response, (-dh).clamp(min=0).sum(-1))
    lam = ((neg - pos) / (neg + pos + 1e-12)).clamp(-clip, clip)  # [B]
    lr = lam[response][:, None]
    scale = torch.where(dh > 0, 1 + lr, torch.where(dh < 0, 1 - lr, torch.ones_like(a)))
    a1 = a * scale
    before = torch.zeros(b, dtype=torch.float64, device=a.device).index_add_(0, response, a.abs().sum(-1))
    after = torch.zeros(b, dtype=torch.float64, device=a.device).index_add_(0, response, a1.abs().sum(-1))
    restore = torch.where(after > 0, before / after.clamp(min=1e-300), torch.ones_like(after))
    return (a1 * restore[response][:, None]).float(), lam.float(), dh.float()


# ---------------------------------------------------------------------------------------------- tables
def load_pos_weights(path: str | Path) -> dict[str, float]:
    """A POS contribution table (docs/spec.md §3.1) as ``{class: w_c}``.

    Accepted JSON: ``{"w_c": {class: w}, ...}`` (the estimator's file, with model, corpus, sample
    count and m_c alongside), ``{"weights": {...}}``, or a flat ``{class: w}``.

    Raises:
        FileNotFoundError: no such file. ValueError: no classes, or a weight that is not a finite
            number > 0 (names the class).
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a JSON weight table ({e})") from None
    table = data.get("w_c", data.get("weights", data)) if isinstance(data, dict) else None
    if not isinstance(table, dict) or not table:
        raise ValueError(f"{path}: expected a JSON object of POS class -> weight (or under 'w_c'), got none")
    out = {}
    for c, w in table.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"{path}: weight of class {c!r} must be a finite number > 0, got {w!r}")
        out[str(c)] = float(w)
    return out


def resolve_tagger(spec: str) -> Callable[..., Sequence[Sequence[str]]]:
    """Import ``"package.module:function"``.

    Raises:
        ValueError: not of that form, or the attribute is not callable.
        ModuleNotFoundError: the module cannot be imported.
    """
    if ":" not in spec:
        raise ValueError(f"tagger {spec!r} must be 'package.module:function'")
    mod, _, name = spec.partition(":")
    fn = getattr(importlib.import_module(mod), name, None)
    if not callable(fn):
        raise ValueError(f"tagger {spec!r}: {name!r} is not a callable in {mod}")
    return fn


def token_weights(classes: Sequence[Sequence[str]], table: Mapping[str, float], valid: torch.Tensor) -> torch.Tensor:
    """``[N, L]`` float32 ``w_{c_i}`` from per-position class names (1 outside ``valid``).

    Raises:
        ValueError: wrong number of rows / positions, or a valid position whose class is not in the
            table (names the row, position and class, and the table's classes).
    """
    n, L = valid.shape
    if len(classes) != n:
        raise ValueError(f"tagger returned {len(classes)} rows, expected {n}")
    out = torch.ones(n, L, dtype=torch.float32)
    vmask = valid.cpu()
    for r, row in enumerate(classes):
        if len(row) != L:
            raise ValueError(f"tagger row {r} has {len(row)} classes, expected one per position ({L})")
        for i, c in enumerate(row):
            if vmask[r, i]:
                if c not in table:
                    raise ValueError(f"POS class {c!r} (row {r}, position {i}) is not in the weight table; "
                                     f"its classes: {sorted(table)}")
                out[r, i] = table[c]
    return out.to(valid.device)


# ---------------------------------------------------------------------------------------------- module
@CREDITS.register("dtca")
@dataclass(frozen=True)
class DTCA(CreditModule):
    """Registered as ``dtca`` (docs/spec.md §3): RLDF's state term with DTCA's step selection, in-step POS
    credit and entropy-flow calibration, each switchable (the ablation is a flag).

    Use with ``objective: {name: rldf}`` and the ``state`` likelihood (required).

    Attributes:
        selection: ``"coverage"`` (default; §3.2, 70 % of Σ I, clamp [min_steps, max_steps]) or
            ``"sample"`` (RLDF's k steps from softmax(w_s/T); "DTCA − step selection").
        coverage: share of Σ_t I_t the chosen steps must reach (§3.2; 0.7).
        min_steps: lower end of the clamp on the number of chosen steps (§3.2; 2).
        max_steps: upper end of the clamp (§3.2; 32).
        k: RLDF's steps per sequence when ``selection: sample`` (4).
        temperature: T of RLDF's softmax(w_s/T) when ``selection: sample`` (1).
        pos_credit: in-step POS credit (§3.3; default True).
        calibration: entropy-flow calibration (§3.4; default True).
        pos_weights: path of the JSON table class -> w_c (§3.1); ``None``: every w_c = 1. In a YAML
            file a relative path is read from the file's folder (``metadata={"path": "file"}``).
        tagger: ``"package.module:function"`` giving each completion position's POS class from the
            final completion (required with ``pos_weights``).
        keep_threshold: RLDF's filter threshold (0.6).
        eta: η of ΔH (1; cancels in λ_b).
        weight: weight of the ``dtca`` loss term (1).

    Metrics (``credit/dtca/...``): ``states_per_seq``, ``kept_per_state``, ``filter_keep_frac``,
    ``lambda_mean``, ``lambda_abs_mean`` (over responses), ``credit_min``, ``credit_max`` (a_{t,i}).
    """

    selection: str = "coverage"
    coverage: float = 0.7
    min_steps: int = 2
    max_steps: int = 32
    k: int = 4
    temperature: float = 1.0
    pos_credit: bool = True
    calibration: bool = True
    pos_weights: str | None = field(default=None, metadata={"path": "file"})
    tagger: str | None = None
    keep_threshold: float = 0.6
    eta: float = 1.0
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection {self.selection!r} is not one of {SELECTIONS}")
        if not 0.0 < self.coverage <= 1.0:
            raise ValueError(f"coverage (={self.coverage}) must lie in (0, 1]")
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError(f"need 1 <= min_steps (={self.min_steps}) <= max_steps (={self.max_steps})")
        check_step_sampling(self.k, self.temperature, self.keep_threshold)
        if not self.eta > 0:
            raise ValueError(f"eta (={self.eta}) must be > 0")
        if self.pos_weights is not None and self.tagger is None:
            raise ValueError("tagger is required with pos_weights (the POS class of each completion position)")
        if self.pos_weights is not None:
            if not Path(self.pos_weights).is_file():
                raise ValueError(f"pos_weights file {self.pos_weights!r} does not exist (a relative path is read from the working "
                                 f"directory, {Path.cwd()}, or in a YAML file from the file's folder); write one with `maskrl estimate-pos-weights`")
            load_pos_weights(self.pos_weights)  # fail at config time on a bad table
        if self.tagger is not None:
            resolve_tagger(self.tagger)  # and on a tagger that cannot be imported

    def weights(self, batch: CreditBatch, ctx: CreditContext) -> torch.Tensor:
        """``[N, L]`` float32 ``w_{c_i}`` of the batch's positions (all 1 without a table)."""
        ro = batch.rollout
        if self.pos_weights is None:
            return torch.ones(ro.completion_ids.shape, dtype=torch.float32, device=ro.completion_ids.device)
        table = load_pos_weights(self.pos_weights)
        tag = resolve_tagger(self.tagger)
        classes = tag(getattr(ctx.policy, "tokenizer", None), ro.completion_ids, ro.completion_mask)
        return token_weights(classes, table, ro.completion_mask)

    def for_planning(self) -> "DTCA":
        """The worst case ``maskrl plan`` sizes for: coverage selection keeps ``max_steps`` states of every
        sequence (``min_steps = max_steps``; how few steps reach 70 % of Σ I_t depends on the model's
        p_i, docs/spec.md §3.2), and no POS table or tagger (they only reweight, and the stand-in's text has
        no parts of speech)."""
        worst = {"min_steps": self.max_steps} if self.selection == "coverage" else {}
        return dataclasses.replace(self, pos_weights=None, tagger=None, **worst)

    def planned_rows(self, sequences: int) -> int:
        """Chosen states per RL step at most: ``max_steps`` (coverage) or ``k`` (sample) per sequence."""
        return sequences * (self.max_steps if self.selection == "coverage" else self.k)

    def observers(self, sampler, generator: torch.Generator) -> list:
        """With a cache: θ's exact ``p_i`` for the step scores (:func:`maskrl.credit.rldf.commit_observers`)."""
        return commit_observers(sampler)

    def choose(self, batch: CreditBatch, ctx: CreditContext, w: torch.Tensor) -> torch.Tensor:
        """``[N, S]`` long chosen steps, ``-1`` padded; ``p_i`` is θ's exact commit probability
        (:func:`maskrl.credit.rldf.commit_probs`)."""
        ro = batch.rollout
        p = commit_probs(ro, "dtca")
        if self.selection == "sample":
            s, present = step_surprise(ro.commit_step, p, ro.completion_mask)
            return sample_steps(s, present, self.k, self.temperature, ctx.generator)
        imp, present = step_importance(ro.commit_step, p, w, ro.completion_mask)
        return coverage_steps(imp, present, self.coverage, self.min_steps, self.max_steps)

    def __call__(self, batch: CreditBatch, ctx: CreditContext) -> CreditBatch:
        check_state_likelihood(ctx, "dtca")
        refuse_edited(batch.rollout, "dtca")
        w = self.weights(batch, ctx)
        rows, steps = chosen_pairs(self.choose(batch, ctx, w))
        parts = steps_term(batch, ctx, rows, steps, self.keep_threshold, entropy=self.calibration)
        keep, adv = parts["keep"], parts["advantages"]
        metrics = filter_metrics(parts, batch)
        if self.pos_credit:
            a = in_step_credit(w[rows], keep)
            adv = adv * a
            n_keep = int(keep.sum())
            metrics.update(credit_min=ShareMin(a[keep].min().item() if n_keep else 1.0, n_keep),
                           credit_max=ShareMax(a[keep].max().item() if n_keep else 1.0, n_keep))
        if self.calibration:
            adv, lam, _ = entropy_flow_calibrate(adv, parts["prob"], parts["entropy"], keep, rows, self.eta)
            lam = lam[torch.unique(rows)] if rows.numel() else lam
            metrics.update(lambda_mean=ShareMean(lam.mean().item() if lam.numel() else 0.0, lam.numel()),
                           lambda_abs_mean=ShareMean(lam.abs().mean().item() if lam.numel() else 0.0, lam.numel()))
        return replace_base(batch, ctx, parts, "dtca", self.weight, adv, metrics)
