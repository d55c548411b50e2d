"""DiSPO (docs/spec.md §4; Oba, Furuta, Okazaki, "Diffusion-State Policy Optimization for Masked Diffusion
Language Models"): branch-and-score at intermediate denoising states.

**Branching (an observer, no extra forward).** Before the rollout, each trajectory gets one state
from the observer's own generator. At that step the sampler has the logits of every still-masked
position (the observer asks for them, at that step only, with ``logit_positions``); the observer
draws Z complete fillings of all masked positions from ``softmax(logits/τ)`` (Gumbel-max in float64,
as the sampler) and records the state and the fillings. Nothing else is kept: no ``T·L·V`` cache.
The main rollout is the same with branching on or off (the observer never touches the sampler's
generator, and the sampler commits from the same logits).

**What t means.** ``t/T`` is the fraction of the completion already committed in the branched state
x_t. The fixed schedule knows T (``rollout.steps``) and commits ``L/T`` tokens per step, so t is a step
index drawn from ``{0, …, T−1}`` with ``P(t) ∝ w(t/T)``. Under the threshold schedule T is not known in
advance; a fraction ``u ∈ [0, 1)`` is drawn from the continuous density ∝ ``w(u)`` and the row branches
at its first step whose state has at least ``u·L`` committed positions -- or at its last step if it
finishes before that (the last step's masked positions all lie in the last block, whose logits the
sampler computes anyway). ``w(u) = u^p`` (``late``, p = 4, docs/spec.md §4), 1 (``uniform``) or ``(1 − u)^p``
(``early``).

**Step loss (a loss term).** The Z fillings of every state are rewarded through ``ctx.score`` in one
batched call (a filling's completion = the state's committed tokens + the filling; it ends at its
first stop token). ``A_z = R_z − mean_Z R``; states whose Z rewards are all equal are skipped (no
gradient). Each kept branch becomes one row of the term's rollout whose ``commit_step`` is t at the
filled positions and the original (< t) elsewhere, so the ``state`` likelihood scores the filled
tokens at x_t in one forward row per branch (prompt masked as mean-field). The term trains only on
the filled positions (token-local) -- by default those up to the branch's first stop token
(``train_after_stop``), with diffu-GRPO's per-token clipped ratio and a β·KL3 term to the reference
(``beta``; the paper adds one, docs/spec.md §4), averaged over each branch's tokens and then over all
branches of all kept states (``seq_mean``; every kept state has Z branches, so this is the mean over states of the mean
over its branches -- the paper sums over states; we average). With α_step > 0 the term is always
present, with 0 rows where no state was kept, so every process has the same list of terms (and the
trainer pads the term's forwards so that every process runs as many: ``RLTrainer.optimize``).
``L = α_base·L_base + α_step·L_step``:
α_base scales the base term (``CreditBatch.base_weight``), α_step is the term's weight.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from maskrl.credit.base import CREDITS, CreditBatch, CreditContext, CreditModule
from maskrl.credit.base import ShareCount, ShareMean
from maskrl.likelihood.state import State
from maskrl.objectives.diffu_grpo import DiffuGRPO
from maskrl.sampling.commit import gumbel_max
from maskrl.sampling.edit import refuse_edited
from maskrl.types import LossTerm

TIMINGS = ("late", "uniform", "early")


def timing_weights(num_steps: int, timing: str = "late", power: float = 4.0) -> torch.Tensor:
    """``[T]`` float64 probabilities of branching at step ``t ∈ {0, …, T−1}`` (fixed schedule):
    ∝ ``(t/T)^p`` (late), 1 (uniform) or ``(1 − t/T)^p`` (early).

    Raises:
        ValueError: ``num_steps < 1`` (late needs T ≥ 2), or an unknown ``timing``.
    """
    if timing not in TIMINGS:
        raise ValueError(f"timing {timing!r} is not one of {TIMINGS}")
    if num_steps < 1 or (timing == "late" and num_steps < 2):
        raise ValueError(f"DiSPO needs at least {2 if timing == 'late' else 1} denoising steps, got {num_steps}")
    u = torch.arange(num_steps, dtype=torch.float64) / num_steps
    w = u ** power if timing == "late" else (torch.ones_like(u) if timing == "uniform" else (1 - u) ** power)
    return w / w.sum()


def draw_fractions(n: int, timing: str, power: float, generator: torch.Generator) -> torch.Tensor:
    """``[n]`` float64 fractions ``u ∈ [0, 1)`` with density ∝ ``u^p`` / 1 / ``(1−u)^p`` (inverse CDF)."""
    if timing not in TIMINGS:
        raise ValueError(f"timing {timing!r} is not one of {TIMINGS}")
    v = torch.rand(n, generator=generator, dtype=torch.float64)
    if timing == "uniform":
        return v
    root = v ** (1.0 / (power + 1.0))
    return root if timing == "late" else 1.0 - root


def draw_fillings(logits: torch.Tensor, z: int, temperature: float, generator: torch.Generator,
                  chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Z samples per position from ``softmax(logits/τ)``.

    Args:
        logits: ``[M, V]`` (the ``[M]`` token's logit and those of ids without a tokenizer entry
            already −inf, as the sampler's view gives them: the fillings' candidates are the
            sampler's, :func:`~maskrl.sampling.commit.candidate_logits`).
        z: Z.
        temperature: τ; 0 gives the argmax Z times.
        generator: CPU generator for the Gumbel noise (float64, drawn ``chunk`` rows at a time, Z
            draws per chunk, by the sampler's :func:`~maskrl.sampling.commit.gumbel_max`).

    Returns:
        ``(tokens [Z, M] long, logp [Z, M] float32)`` with ``logp = log softmax(logits)[token]``
        (noise-free, as ``commit_prob``).
    """
    m, v = logits.shape
    tokens = torch.empty((z, m), dtype=torch.long, device=logits.device)
    logp = torch.empty((z, m), dtype=torch.float32, device=logits.device)
    for a in range(0, m, chunk):
        part = logits[a:a + chunk]
        lsm = torch.log_softmax(part.float(), -1)
        for k in range(z):
            tok = gumbel_max(part, temperature, generator)  # the sampler's own draw
            tokens[k, a:a + chunk] = tok
            logp[k, a:a + chunk] = lsm.gather(-1, tok[:, None]).squeeze(-1)
    return tokens, logp


class BranchObserver:
    """Sampler observer of DiSPO: picks each row's branching state before the rollout and draws Z
    fillings there (module docstring).

    Args:
        z: fillings per state.
        temperature: τ of the fillings.
        timing, power: the branching distribution.
        steps: T of the fixed schedule, or ``None`` for the threshold schedule.
        generator: the observer's own CPU generator (never the sampler's).
        block_length: the sampler's b (threshold schedule: which rows are in their last block;
            ``None``: every row not yet branched counts as possibly finishing).

    ``result()``: ``dispo_step [N]`` long (−1: no branch), ``dispo_masked [N, L]`` bool (masked in
    x_t), ``dispo_fill [N, Z, L]`` long (the fillings at those positions, −1 elsewhere),
    ``dispo_logp_old [N, Z, L]`` float32 (``log softmax(logits)`` of each filled token, 0 elsewhere).

    ``exact_logits = True``: the fillings are drawn from θ's distribution at x_t, the one the step
    term's ratio scores them under (docs/spec.md §4), so under a key/value cache the sampler gives the rows
    this observer asks for exact logits (one full forward per branching row; under the threshold
    schedule also the steps of a row's last block, where its fallback branch may fall) or refuses
    (:attr:`maskrl.sampling.SamplerConfig.observer_logits`).
    """

    exact_logits = True

    def __init__(self, z: int, temperature: float, timing: str, power: float, steps: int | None,
                 generator: torch.Generator, block_length: int | None = None) -> None:
        self.z, self.temperature, self.timing, self.power, self.steps = z, temperature, timing, power, steps
        self.block_length = block_length
        self.gen = generator
        self.target: torch.Tensor | None = None  # [N] step (fixed) or fraction (threshold)
        self.done: torch.Tensor | None = None  # [N] bool, branched
        self.records: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._pending: tuple[int, torch.Tensor] | None = None

    def _init(self, rows: torch.Tensor) -> None:
        n = int(rows.max().item()) + 1 if rows.numel() else 0
        if self.steps is not None:
            w = timing_weights(self.steps, self.timing, self.power)
            self.target = torch.multinomial(w, n, replacement=True, generator=self.gen) if n else torch.zeros(0, dtype=torch.long)
        else:
            self.target = draw_fractions(n, self.timing, self.power, self.gen)
        self.done = torch.zeros(n, dtype=torch.bool)
        self.n = n

    def _due(self, step: int, rows: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        """``[n]`` bool: rows that branch at this step (before the fallback)."""
        r = rows.cpu()
        if self.steps is not None:
            due = self.target[r] == step
        else:
            frac = 1.0 - masked.sum(-1).double().cpu() / masked.shape[1]
            due = frac >= self.target[r]
        return (due & ~self.done[r]).to(masked.device)

    def logit_positions(self, step: int, rows: torch.Tensor, masked: torch.Tensor, block_start: torch.Tensor):
        """Every masked position of the rows that branch at this step; nothing extra elsewhere. Under
        the threshold schedule also the rows not yet branched whose masks all lie in their current
        block (they may finish at this step and then branch there, :meth:`on_step`): in-block
        positions, which cost nothing extra, but with a cache they get exact logits."""
        if self.target is None:
            self._init(rows)
        due = self._due(step, rows, masked)
        self._pending = (step, due)
        ask = due
        if self.steps is None:
            pos = torch.arange(masked.shape[1], device=masked.device)
            b = self.block_length if self.block_length is not None else masked.shape[1]
            beyond = masked & (pos[None, :] >= block_start[:, None] + b)
            ask = due | (~beyond.any(-1) & ~self.done[rows.cpu()].to(masked.device))
        return masked & ask[:, None]

    def on_step(self, view: Any) -> None:
        step, due = self._pending if self._pending is not None and self._pending[0] == view.step else \
            (view.step, self._due(view.step, view.rows, view.masked))
        self._pending = None
        if self.steps is None:  # threshold: a row finishing before reaching its fraction branches now
            finishes = ~(view.masked & ~view.committed).any(-1)
            due = due | (finishes & ~self.done[view.rows.cpu()].to(due.device))
        if not due.any():
            return
        sel = view.masked & due[:, None]  # [n, L]
        if (sel & ~view.covered).any():
            raise ValueError("DiSPO: the sampler did not compute logits at every masked position of a branching row")
        if not view.exact[due].all():
            raise ValueError("DiSPO: a branching row's logits came from the key/value cache, not theta's full forward; "
                             "the sampler must honour exact_logits (SamplerConfig.observer_logits='exact')")
        vidx = view.covered.flatten().long().cumsum(0).view(view.covered.shape) - 1
        tokens, logp = draw_fillings(view.logits[vidx[sel]], self.z, self.temperature, self.gen)  # [Z, M]
        local = due.nonzero().squeeze(-1)
        self.done[view.rows[local].cpu()] = True
        self.records.append((int(view.step), view.rows[local].clone(), sel[local].clone(), tokens, logp))

    def result(self) -> dict[str, torch.Tensor]:
        if self.target is None:
            return {}
        n, z = self.n, self.z
        L = self.records[0][2].shape[1] if self.records else 0
        device = self.records[0][1].device if self.records else torch.device("cpu")
        step = torch.full((n,), -1, dtype=torch.long, device=device)
        masked = torch.zeros((n, L), dtype=torch.bool, device=device)
        fill = torch.full((n, z, L), -1, dtype=torch.long, device=device)
        lp = torch.zeros((n, z, L), dtype=torch.float32, device=device)
        for s, rows, sel, tokens, logp in self.records:
            step[rows] = s
            masked[rows] = sel
            r_idx, i_idx = sel.nonzero(as_tuple=True)  # row-major: the order of the drawn tokens
            for k in range(z):
                fill[rows[r_idx], k, i_idx] = tokens[k]
                lp[rows[r_idx], k, i_idx] = logp[k]
        return {"dispo_step": step, "dispo_masked": masked, "dispo_fill": fill, "dispo_logp_old": lp}


BINS = ("early", "mid", "late")


def time_bins(frac: torch.Tensor) -> torch.Tensor:
    """Timestep bin of each state: ``[S]`` float t/T -> ``[S]`` long, 0 early (t/T < 1/3), 1 mid
    (< 2/3), 2 late (the rest). t/T is the committed fraction of the completion (module docstring)."""
    return (frac >= 1 / 3).long() + (frac >= 2 / 3).long()


@CREDITS.register("dispo")
@dataclass(frozen=True)
class DiSPO(CreditModule):
    """Registered as ``dispo`` (docs/spec.md §4): branch-and-score at one intermediate state per trajectory,
    plus a state-level loss term (module docstring).

    Attributes:
        z: Z, fillings per state **[choice]** (default 2).
        timing: **[choice]** ``"late"`` (∝ (t/T)^p, default), ``"uniform"`` or ``"early"`` (∝ (1−t/T)^p).
        power: p (default 4).
        temperature: τ of the fillings; < 0 (default) uses the rollout's τ.
        alpha_base: α_base, weight of the base term (default 1).
        alpha_step: α_step, weight of the step term (default 0.5; docs/spec.md: 0.1 after SFT); 0 adds no
            term and scores nothing.
        clip_eps: ε of the step term's per-token clipped ratio (default 0.5, diffu-GRPO's).
        beta: **[choice]** β of the step term's KL3 to the reference (docs/spec.md §4 leaves it open; the
            paper adds a KL term to the step loss, whose value we do not have: default 0.04, the
            diffu-GRPO base's β (d1, docs/spec.md §1.5), which the step term's ratio copies). 0 drops the term
            and, when nothing else needs one, the reference policy. With β > 0 the trainer keeps a
            reference (a frozen copy, or the LoRA base) and scores each branch row under it.
        train_after_stop: **[choice]** also train the filled positions after the branch's first stop
            token (default False: as the base term's ``completion_mask`` and the reward, which reads a
            completion up to its first stop token, so those tokens cannot change A_z; True trains every
            filled position, "only the newly filled tokens" read literally).
        p_mask_prompt: prompt masking of the step term's state likelihood (default 0.15).
        skip_equal: skip states whose Z rewards are all equal (default True, docs/spec.md §4). False keeps
            them (advantages 0, no gradient, full cost): the cost's worst case, for benchmarks.

    Metrics (``credit/dispo/...``, of the whole batch on any number of processes,
    :mod:`maskrl.credit.base`): ``states`` (states branched), ``kept_frac``
    (share with distinguishable rewards), ``branch_reward``, ``adv_abs`` (mean |A_z| of kept
    branches), ``t_frac`` (mean t / num_steps of the branched states), and per timestep bin
    ``b`` in ``early`` / ``mid`` / ``late`` (t/T in [0, 1/3), [1/3, 2/3), [2/3, 1]) the counts
    ``states_<b>`` and ``kept_<b>`` (states with distinguishable rewards; with ``skip_equal: false``
    still the distinguishable ones), so that Σ kept_b / Σ states_b over steps is the paper's
    reward-distinguishable fraction by bin.
    """

    z: int = 2
    timing: str = "late"
    power: float = 4.0
    temperature: float = -1.0
    alpha_base: float = 1.0
    alpha_step: float = 0.5
    clip_eps: float = 0.5
    beta: float = 0.04
    train_after_stop: bool = False
    p_mask_prompt: float = 0.15
    skip_equal: bool = True

    def __post_init__(self) -> None:
        if self.z < 2:
            raise ValueError(f"z (={self.z}) must be >= 2 (a baseline needs two fillings)")
        if self.timing not in TIMINGS:
            raise ValueError(f"timing {self.timing!r} is not one of {TIMINGS}")
        if not self.power >= 0:
            raise ValueError(f"power (={self.power}) must be >= 0")
        if self.alpha_base < 0 or self.alpha_step < 0:
            raise ValueError(f"alpha_base (={self.alpha_base}) and alpha_step (={self.alpha_step}) must be >= 0")
        if self.clip_eps < 0:
            raise ValueError(f"clip_eps (={self.clip_eps}) must be >= 0")
        if not self.beta >= 0:
            raise ValueError(f"beta (={self.beta}) must be >= 0")
        if not 0.0 <= self.p_mask_prompt <= 1.0:
            raise ValueError(f"p_mask_prompt (={self.p_mask_prompt}) must lie in [0, 1]")

    @property
    def needs_reference(self) -> bool:
        """True when the step term has a KL to the reference (``alpha_step > 0`` and ``beta > 0``)."""
        return self.alpha_step > 0 and self.beta > 0

    def for_planning(self) -> "DiSPO":
        """Every branched state kept (``skip_equal: false``): the step term's worst case (docs/spec.md §4)."""
        return dataclasses.replace(self, skip_equal=False)

    def planned_rows(self, sequences: int) -> int:
        """B·G·Z: each trajectory branches at one state, each kept state is Z rows (0 without a step term)."""
        return sequences * self.z if self.alpha_step > 0 else 0

    def observers(self, sampler: Any, generator: torch.Generator) -> list[BranchObserver]:
        """One fresh :class:`BranchObserver` per rollout; it draws the branching steps and the
        fillings from ``generator`` (the trainer's, per run seed, step and process), never from the
        sampler's."""
        gen = generator
        tau = self.temperature if self.temperature >= 0 else float(getattr(sampler, "temperature", 1.0))
        steps = None if getattr(sampler, "schedule", "fixed") == "threshold" else int(sampler.steps)
        return [BranchObserver(self.z, tau, self.timing, self.power, steps, gen,
                               block_length=getattr(sampler, "block_length", None))]

    def _term(self, rollout, adv: torch.Tensor, mask: torch.Tensor) -> LossTerm:
        return LossTerm(name="step", weight=float(self.alpha_step), rollout=rollout,
                        advantages=(adv[:, None] * mask.float()).float(), mask=mask,
                        objective=DiffuGRPO(clip_eps=self.clip_eps, beta=self.beta, aggregation="seq_mean"),
                        likelihood=State(p_mask_prompt=self.p_mask_prompt))

    def _empty_term(self, ro) -> LossTerm:
        """A 0-row step term: every process then has the same list of terms (the trainer all-reduces
        one count pair per term), even where no state was kept; it costs no forward."""
        none = torch.zeros(0, dtype=torch.long, device=ro.completion_ids.device)
        sub = dataclasses.replace(ro.select(none), step_stats={})
        return self._term(sub, torch.zeros(0, device=none.device), torch.zeros_like(sub.completion_mask))

    def step_term(self, batch: CreditBatch, ctx: CreditContext) -> tuple[LossTerm, dict[str, float]]:
        """The step loss term (0 rows when no state is kept) and metrics.

        Raises:
            ValueError: the rollout has no DiSPO statistics (the observer did not run).
        """
        ro = batch.rollout
        st = ro.step_stats
        if "dispo_step" not in st:
            raise ValueError("dispo: rollout.step_stats has no 'dispo_step'; pass the module's observers to generate()")
        t_all = st["dispo_step"]
        idx = (t_all >= 0).nonzero().squeeze(-1)  # [S]
        frac = t_all[idx].float() / ro.num_steps[idx].float()  # [S] t/T of each branched state
        bins = time_bins(frac)
        s = idx.numel()
        # shares of this process's rows, combined over processes by the trainer (maskrl.credit.base)
        metrics = {"states": ShareCount(s), "kept_frac": ShareMean(0.0, 0), "branch_reward": ShareMean(0.0, 0),
                   "adv_abs": ShareMean(0.0, 0), "t_frac": ShareMean(frac.mean().item() if s else 0.0, s)}
        metrics.update({f"states_{b}": ShareCount((bins == i).sum()) for i, b in enumerate(BINS)})
        metrics.update({f"kept_{b}": ShareCount(0.0) for b in BINS})
        if s == 0:
            return self._empty_term(ro), metrics
        z, L = self.z, ro.gen_length
        masked = st["dispo_masked"][idx]  # [S, L]
        comp = ro.completion_ids[idx]
        branch = torch.where(masked[:, None, :], st["dispo_fill"][idx], comp[:, None, :])  # [S, Z, L]
        rewards = ctx.score(idx.repeat_interleave(z), branch.reshape(-1, L)).to(comp.device).float().view(-1, z)
        if not torch.isfinite(rewards).all():
            raise ValueError("dispo: non-finite branch rewards from the score callback")
        keep = rewards.max(1).values > rewards.min(1).values  # [S]; all-equal states carry no gradient
        metrics.update({f"kept_{b}": ShareCount((keep & (bins == i)).sum()) for i, b in enumerate(BINS)})
        if not self.skip_equal:
            keep = torch.ones_like(keep)
        metrics.update(kept_frac=ShareMean(keep.float().mean().item(), s),
                       branch_reward=ShareMean(rewards.mean().item(), rewards.numel()))
        if not keep.any():
            return self._empty_term(ro), metrics
        adv = (rewards - rewards.mean(1, keepdim=True))[keep].reshape(-1)  # [K·Z]
        metrics["adv_abs"] = ShareMean(adv.abs().mean().item(), adv.numel())
        src = idx[keep].repeat_interleave(z)  # [K·Z] batch row of each branch
        comp_b = branch[keep].reshape(-1, L)
        filled = masked[keep].repeat_interleave(z, 0)  # [K·Z, L]
        valid = ctx.policy.completion_mask(comp_b)  # [K·Z, L]
        t_b = t_all[src]
        sub = ro.select(src)
        rollout = dataclasses.replace(
            sub, completion_ids=comp_b, completion_mask=valid,
            commit_step=torch.where(filled, t_b[:, None], sub.commit_step),
            group_ids=torch.arange(int(keep.sum()), device=comp.device).repeat_interleave(z), step_stats={})
        return self._term(rollout, adv, filled if self.train_after_stop else filled & valid), metrics

    def __call__(self, batch: CreditBatch, ctx: CreditContext) -> CreditBatch:
        refuse_edited(batch.rollout, "dispo")
        weight = batch.base_weight * float(self.alpha_base)
        if self.alpha_step == 0:
            return dataclasses.replace(batch, base_weight=weight, metrics={})
        term, metrics = self.step_term(batch, ctx)
        return dataclasses.replace(batch, base_weight=weight, terms=batch.terms + (term,), metrics=metrics)
