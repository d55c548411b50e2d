"""``maskrl bench overhead --method NAME``: what a credit-assignment method costs per RL step.

One RL step (rollout + optimisation) of the built-in tiny model on generated Sudoku puzzles, for a
base recipe and the method's variants, repeated; the variants run interleaved within each repetition
(so that load from other processes hits them alike) and every ratio is taken between timings of the
same repetition. The JSON reports, per variant, the median and spread of step seconds and of its
ratio to the base, plus the method's named ratios (e.g. ``dps_step_ratio``).

A method is registered in :data:`OVERHEAD_METHODS` as :class:`OverheadMethod`: variants are lists of
config overrides (the ``--set`` syntax) on top of :data:`BASE_SETS`, so a new method adds one entry
and needs no new timing code. Method-specific extra measurements (SML's likelihood pass alone)
are an optional ``extra`` function.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

__all__ = ["BASE_SETS", "OVERHEAD_METHODS", "OverheadMethod", "run_overhead_bench", "time_variants"]

#: the base recipe of every overhead run: the demo's tiny shape and Sudoku sampler, random weights,
#: μ = 1, 8 prompts × 6 completions
BASE_SETS = ["task.name=sudoku4x4", "task.prompt_template={puzzle}=", "task.train_size=200",
             "rollout.gen_length=16", "rollout.block_length=16", "rollout.steps=16", "rollout.temperature=0.9",
             "train.prompts_per_step=8", "train.group_size=6", "train.inner_iterations=1", "train.lr=1e-5",
             "objective.name=diffu_grpo"]


@dataclass(frozen=True)
class OverheadMethod:
    """A method's overhead benchmark.

    Attributes:
        variants: ``{name: [overrides]}``; the first entry is the base all ratios refer to.
        ratios: ``{json key: variant name}``: the step-time ratio ``variant / base`` reported under
            that key (median over repetitions).
        extra: optional ``extra(quick) -> dict`` merged into the JSON (e.g. a likelihood-pass ratio).
    """

    variants: dict[str, list[str]]
    ratios: dict[str, str]
    extra: Callable[[bool], dict] | None = field(default=None)


def _spread(values: Sequence[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def _trainer(overrides: Sequence[str], out_dir: str):
    from maskrl.config import load_config
    from maskrl.pipeline import load_policy
    from maskrl.tasks import get_task
    from maskrl.trainer import RLTrainer

    cfg = load_config([], [*BASE_SETS, f"output_dir={out_dir}", *overrides])
    task = get_task(cfg.task.name, cfg.task.prompt_template or None)
    rows = task.generate(cfg.task.train_size, seed=cfg.task.train_seed)
    policy = load_policy(cfg)
    return RLTrainer(cfg, policy, task, rows)


def time_variants(variants: dict[str, list[str]], reps: int, warmup: int = 1, out_dir: str = "/tmp/maskrl-bench-overhead",
                  progress: bool = True, on_cell=None) -> dict[str, list[float]]:
    """Seconds of one ``RLTrainer.step()`` per variant and repetition, variants interleaved.

    Every variant starts from the same random tiny model and seeds, so the rollouts are alike; the
    first ``warmup`` steps of each are not timed. ``on_cell(record)`` is called with each timing as
    it finishes (:class:`~maskrl.bench_record.BenchRecord`).

    Returns:
        ``{variant: [seconds per repetition]}``.
    """
    trainers = {name: _trainer(sets, f"{out_dir}/{name}") for name, sets in variants.items()}
    for tr in trainers.values():
        for _ in range(warmup):
            tr.step()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(reps):
        for name, tr in trainers.items():
            t0 = time.perf_counter()
            tr.step()
            times[name].append(time.perf_counter() - t0)
            if on_cell is not None:
                on_cell({"part": "step", "rep": r, "variant": name, "seconds": times[name][-1]})
        if progress:
            print(f"  repetition {r + 1}/{reps}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in variants), flush=True)
    return times


def _sml_likelihood_pass(quick: bool) -> dict:
    """SML's likelihood pass alone (forward + backward), pure SML with K strata vs mean-field, on one
    rollout of the tiny model; interleaved repetitions. Target (issue 9): ``<= 1.1·K``."""
    from maskrl.likelihood import LIKELIHOODS

    k = 4
    tr = _trainer([], "/tmp/maskrl-bench-overhead/sml")
    batch = tr.collect()
    ro, need = batch.rollout, batch.rollout.completion_mask
    estimators = {"mean_field": LIKELIHOODS.get("mean_field")(),
                  "stratified": LIKELIHOODS.get("stratified")(k=k, full=0.0, sml=1.0)}
    times: dict[str, list[float]] = {n: [] for n in estimators}
    for r in range(3 if quick else 7):
        for name, est in estimators.items():
            tr.policy.model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            lp = est(tr.policy, ro, torch.Generator().manual_seed(r), need)
            (lp * need).sum().backward()
            times[name].append(time.perf_counter() - t0)
    ratios = [s / m for s, m in zip(times["stratified"], times["mean_field"])]
    return {"sml_k": k, "sml_likelihood_ratio": statistics.median(ratios), "sml_likelihood_ratio_spread": _spread(ratios),
            "sml_likelihood_seconds": {n: _spread(v) for n, v in times.items()},
            "sml_likelihood_target": f"<= {1.1 * k:.1f} (1.1·K)"}


_RLDF_SETS = ["objective.name=rldf", "rollout.schedule=threshold", "rollout.threshold=0.9"]

OVERHEAD_METHODS: dict[str, OverheadMethod] = {
    # DACA-GRPO (docs/spec.md §2): diffu-GRPO with mean-field ℓ, + DPS (λ 0.5), + SML (K 4, mixed ½/½)
    "daca": OverheadMethod(
        variants={"base": [], "dps": ["credit=[{name: dps}]"], "sml": ["likelihood={name: stratified, k: 4}"]},
        ratios={"dps_step_ratio": "dps", "sml_step_ratio": "sml"},
        extra=_sml_likelihood_pass),
    # DiSPO (docs/spec.md §4): diffu-GRPO as above, + one branched state per rollout row (Z 2, late), its
    # fillings rewarded in one call and trained by the step term (α_step 0.5). Target (issue 11): ≤ 1.5.
    # The random tiny model rarely tells two fillings apart, so most states are skipped; the
    # dispo_all variant keeps every state (skip_equal false): the step term's worst-case cost.
    "dispo": OverheadMethod(
        variants={"base": [], "dispo": ["credit=[{name: dispo}]"],
                  "dispo_all": ["credit=[{name: dispo, skip_equal: false}]"]},
        ratios={"dispo_step_ratio": "dispo", "dispo_all_states_step_ratio": "dispo_all"}),
    # DTCA (docs/spec.md §3) vs its RLDF base (docs/spec.md §1.5): both rldf objective, state likelihood, threshold
    # rollouts (0.9); RLDF trains k = 4 sampled states per sequence, DTCA the coverage-selected states
    # (2..32) with POS credit and entropy-flow calibration (uniform w_c: no tagging cost), and
    # ``dtca_sampled`` DTCA on RLDF's 4 sampled states (what the extra entropy statistics alone cost)
    "dtca": OverheadMethod(
        variants={"rldf": [*_RLDF_SETS, "credit=[{name: rldf_steps}]"],
                  "dtca": [*_RLDF_SETS, "credit=[{name: dtca}]"],
                  "dtca_sampled": [*_RLDF_SETS, "credit=[{name: dtca, selection: sample}]"]},
        ratios={"dtca_step_ratio": "dtca", "dtca_sampled_step_ratio": "dtca_sampled"}),
}


def run_overhead_bench(method: str, out: str | Path, quick: bool = False, reps: int | None = None) -> dict:
    """Run the overhead benchmark of ``method`` and write its JSON to ``out``: each timing as it
    finishes (``cells``; a stopped bench keeps them), the summary at the end (``complete``).

    Raises:
        ValueError: naming the valid methods for an unknown one; ``reps`` below 1 (``--reps``).
    """
    if method not in OVERHEAD_METHODS:
        raise ValueError(f"unknown method {method!r}; valid: {', '.join(sorted(OVERHEAD_METHODS))}")
    if reps is not None and reps < 1:  # 0 fell back to the default count, silently
        raise ValueError(f"--reps: must be >= 1, got {reps}")
    from maskrl.bench_record import BenchRecord

    spec = OVERHEAD_METHODS[method]
    torch.set_num_threads(1)
    reps = reps or (3 if quick else 7)
    rec = BenchRecord(out, {"benchmark": "overhead", "method": method, "repetitions": reps, "base_sets": BASE_SETS,
                            "variants": spec.variants})
    times = time_variants(spec.variants, reps, on_cell=rec.cell)
    base = next(iter(spec.variants))
    result: dict = {"step_seconds": {n: _spread(v) for n, v in times.items()}, "ratio_to_base": {}}
    for name, values in times.items():
        result["ratio_to_base"][name] = _spread([v / b for v, b in zip(values, times[base])])
    for key, name in spec.ratios.items():
        result[key] = result["ratio_to_base"][name]["median"]
    rec.update(**result)
    if spec.extra is not None:
        result.update(spec.extra(quick))
    return rec.finish(**result)
