"""The main job (``make demo``): SFT the tiny model, evaluate, run RL, evaluate again.

Writes ``<output_dir>/summary.json`` (base and final metrics with 95 % intervals, a paired comparison of
the two on the same rows -- exact McNemar p-value and paired bootstrap 95 % interval of the accuracy
gain --, steps, wall time, where the evaluation rows came from and, when they are generated rather than
the task's test file, ``eval_note``, also the last printed line), the per-row results of both
evaluations (``eval_base.jsonl``, ``eval_final.jsonl``) and ``<output_dir>/curves.png`` (rollout reward and evaluation
accuracy against RL steps), and prints a small table. The SFT model is cached under
``<output_dir>/sft-cache/<hash of the settings it depends on and of the package code>`` and reused by later runs.

Honesty rules: the evaluation rows are never used for training (training puzzles are generated and
filtered against them), the reported final model is the last RL step (no checkpoint picking on the
evaluation set), and the periodic evaluations only draw the curve.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path


from maskrl.config import RunConfig, to_dict
from maskrl.credit import CREDITS
from maskrl.evaluate import EvalResult, eval_source_note, evaluate_examples
from maskrl.likelihood import LIKELIHOODS
from maskrl.objectives import OBJECTIVES
from maskrl.models import load_tiny, save_model
from maskrl.pipeline import (check_run_lengths, check_run_samplers, export_model, load_policy, prompt_formatter,
                             sft_from_config, task_and_data, write_json)
from maskrl.rundir import prepare_run_dir, run_lock
from maskrl.stats import paired_comparison
from maskrl.trainer import RLTrainer

METRIC_KEYS = ("accuracy", "accuracy_ci95", "cell_accuracy", "cell_accuracy_ci95", "mean_reward", "mean_reward_ci95", "n")


def package_source_digest() -> str:
    """sha256 (16 hex) of every ``.py`` file of the installed ``maskrl`` package, by relative path and
    content: any change to the code that builds, trains or saves a model gives another digest."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def sft_cache_key(cfg: RunConfig) -> str:
    """Hash of every setting the SFT model depends on, and of the package's code
    (:func:`package_source_digest`): a code change never serves an SFT model that older code made."""
    blob = json.dumps({"model": to_dict(cfg.model), "sft": to_dict(cfg.sft), "task": cfg.task.name,
                       "train_size": cfg.task.train_size, "train_seed": cfg.task.train_seed,
                       "gen_length": cfg.rollout.gen_length, "code": package_source_digest()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _pick(metrics: dict) -> dict:
    return {k: metrics[k] for k in METRIC_KEYS if k in metrics}


def accuracy_points(history: list[dict], base: dict) -> list[tuple[int, float, float, float]]:
    """The evaluation points of the accuracy panel: ``(RL step, accuracy, CI low, CI high)``, step 0
    being the base model (``base``: its metrics with ``accuracy`` and ``accuracy_ci95``), then every
    history entry with ``eval/accuracy`` (and ``eval/accuracy_ci95``, the 95 % Wilson interval of
    :func:`maskrl.stats`; the point itself where a run logged none)."""
    def point(step: int, acc: float, ci) -> tuple[int, float, float, float]:
        lo, hi = ci if ci is not None else (acc, acc)
        return step, float(acc), float(lo), float(hi)

    pts = [point(0, base["accuracy"], base.get("accuracy_ci95"))]
    pts += [point(h["step"], h["eval/accuracy"], h.get("eval/accuracy_ci95")) for h in history if "eval/accuracy" in h]
    return pts


def plot_curves(history: list[dict], base: dict, path: Path) -> None:
    """Rollout reward and evaluation accuracy (with 95 % interval bars and band) against RL steps, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    ax[0].plot(steps, [h["reward"] for h in history], lw=1, alpha=0.5, label="rollout reward (per step)")
    if len(history) >= 5:
        w = max(1, len(history) // 10)
        smooth = [sum(h["reward"] for h in history[max(0, i - w + 1): i + 1]) / len(history[max(0, i - w + 1): i + 1])
                  for i in range(len(history))]
        ax[0].plot(steps, smooth, lw=2, label=f"moving mean ({w})")
    ax[0].set_xlabel("RL step")
    ax[0].set_ylabel("reward")
    ax[0].legend()
    pts = accuracy_points(history, base)
    s, a, lo, hi = (list(v) for v in zip(*pts))
    ax[1].fill_between(s, lo, hi, alpha=0.15, color="C0", lw=0)
    ax[1].errorbar(s, a, yerr=[[x - y for x, y in zip(a, lo)], [y - x for x, y in zip(a, hi)]], marker="o", capsize=3)
    ax[1].set_title(f"test accuracy with 95 % intervals (n = {base.get('n', '?')}; step 0 = SFT base)", fontsize=9)
    ax[1].set_xlabel("RL step")
    ax[1].set_ylabel("eval accuracy (solved)")
    fig.suptitle("maskrl demo: diffu-GRPO on the tiny model")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: bootstrap resamples of the paired accuracy-gain interval
PAIRED_RESAMPLES = 10_000


def write_per_item(path: Path, task, examples, result: EvalResult) -> None:
    """One JSON line per evaluation row: ``{"id", "completion", "reward", "correct"}``, in row order."""
    with open(path, "w", encoding="utf-8") as fh:
        for ex, c, r in zip(examples, result.completions, result.rewards):
            fh.write(json.dumps({"id": ex.id, "completion": c, "reward": float(r), "correct": bool(task.is_correct(r))},
                                ensure_ascii=False) + "\n")


def interrupt_hint(run_dir: str | Path | None) -> str:
    """What to do after a Ctrl-C of ``maskrl demo`` in ``run_dir``: run it again with ``--overwrite``;
    the SFT cache is named as kept only when there is one (``sft-cache/<key>/maskrl_sft.json``)."""
    cached = sorted(Path(run_dir).glob("sft-cache/*/maskrl_sft.json")) if run_dir else []
    kept = (f"; its cached SFT model ({cached[-1].parent}) is kept (reused while the SFT settings are "
            "unchanged)" if cached else "; no SFT model was cached yet, so SFT runs again")
    return "; the demo does not resume: run it again with --overwrite" + kept


def run_demo(cfg: RunConfig, force_sft: bool = False, overwrite: bool = False) -> dict:
    """Run the main job; returns the summary dict (also written to ``summary.json``).

    ``output_dir`` is locked while the demo runs (:func:`maskrl.rundir.run_lock`). A folder holding an
    earlier run is refused unless ``overwrite`` (which removes that run's files and keeps the SFT
    cache; :func:`maskrl.rundir.prepare_run_dir`): a re-run never mixes its logs with an old run's.

    Raises:
        maskrl.rundir.RunDirError: the folder is in use or holds a run and ``overwrite`` is False.
    """
    with run_lock(cfg.output_dir, "maskrl demo"):
        prepare_run_dir(cfg.output_dir, overwrite=overwrite, other="--set output_dir=DIR", resume_flag=None,
                        command="maskrl demo")
        return _run_demo(cfg, force_sft)


def _sft_warm_start(cfg: RunConfig, out: Path, task, train: list, test: list, source: str,
                    force_sft: bool) -> tuple:
    """``(policy, cached, seconds)``: the SFT model from ``out/sft-cache/<key>`` when there is one (and
    ``force_sft`` is off), else SFT from the run's config, saved to that cache."""
    cache = out / "sft-cache" / sft_cache_key(cfg)
    t0 = time.time()
    if (cache / "maskrl_sft.json").is_file() and not force_sft:
        policy = load_tiny(cache)
        check_run_samplers(cfg, policy)
        print(f"[demo] SFT model from cache {cache}")
        return policy, True, time.time() - t0
    policy = load_policy(cfg)
    check_run_lengths(cfg, policy, train, test, source)
    check_run_samplers(cfg, policy)  # before the SFT, not at the base evaluation after it
    print(f"[demo] SFT on {len(train)} generated {task.name} rows ({cfg.sft.steps} steps)")
    hist = sft_from_config(cfg, policy, task, train)
    save_model(policy, cache)
    write_json(cache / "maskrl_sft.json", {"history": hist, "seconds": time.time() - t0})
    return policy, False, time.time() - t0


def _run_demo(cfg: RunConfig, force_sft: bool) -> dict:
    t_start = time.time()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    task, test, source, train = task_and_data(cfg)
    overlap = {task.instance_key(e) for e in train} & {task.instance_key(e) for e in test}
    if overlap:  # generate() guarantees this; checked again because the claim is in the README
        raise RuntimeError(f"{len(overlap)} training rows are evaluation rows")

    # 1. SFT warm start (cached)
    policy, sft_cached, sft_seconds = _sft_warm_start(cfg, out, task, train, test, source, force_sft)

    # 2. base evaluation
    fmt = prompt_formatter(policy, cfg.model.chat_template)
    ev_sampler = cfg.eval

    def evaluate(adapter) -> EvalResult:
        return evaluate_examples(adapter, task, test, ev_sampler, batch_size=250, prompt_fn=fmt)

    base_res = evaluate(policy)
    base = base_res.metrics
    note = eval_source_note(task, source, len(test))
    print(f"[demo] base accuracy {base['accuracy']:.3f} on {len(test)} rows ({source})")

    # 3. RL
    t1 = time.time()
    trainer = RLTrainer(cfg, policy, task, train, prompt_fn=fmt,
                        eval_fn=lambda step: _pick(evaluate(trainer.policy_eval).metrics))
    history = trainer.train(catch_signals=False)  # the demo does not resume: Ctrl-C stops at once
    trainer.close()
    rl_seconds = time.time() - t1

    # 4. final evaluation (the last step's model; no selection on the evaluation rows)
    final_res = evaluate(trainer.policy_eval)
    final = final_res.metrics
    # the family's layout + prompt card (maskrl eval / generate read it) + model card with the test table
    export_model(out / "model", trainer.policy_eval, cfg, task, steps=f"SFT {cfg.sft.steps} steps, then RL "
                 f"{trainer.step_count} steps", data=f"{len(train)} generated training rows; evaluation {source} "
                 f"({len(test)} rows)" + (f"; {note}" if note else ""), evaluation=[("SFT base", _pick(base)), ("after RL", _pick(final))])
    write_per_item(out / "eval_base.jsonl", task, test, base_res)
    write_per_item(out / "eval_final.jsonl", task, test, final_res)
    paired = paired_comparison([task.is_correct(r) for r in base_res.rewards],
                               [task.is_correct(r) for r in final_res.rewards], resamples=PAIRED_RESAMPLES,
                               seed=cfg.train.seed)
    summary = {
        "task": task.name,
        "method": OBJECTIVES.name_of(cfg.objective),
        "likelihood": LIKELIHOODS.name_of(cfg.likelihood),
        "credit": [CREDITS.name_of(c) for c in cfg.credit],
        "n_eval": len(test),
        "eval_source": source,
        "eval_note": note,
        "base": _pick(base),
        "final": _pick(final),
        "improvement": {"accuracy": final["accuracy"] - base["accuracy"]},
        # base = "first", final = "second": first_only = rows only the base solved
        "paired": paired,
        "per_item": {"base": "eval_base.jsonl", "final": "eval_final.jsonl"},
        "train_steps": trainer.step_count,
        "train_rows": len(train),
        "sft_cached": sft_cached,
        "sft_seconds": sft_seconds,
        "rl_seconds": rl_seconds,
        "wall_seconds": time.time() - t_start,
        "config": to_dict(cfg),
    }
    if "cell_accuracy" in final:
        summary["improvement"]["cell_accuracy"] = final["cell_accuracy"] - base["cell_accuracy"]
    write_json(out / "summary.json", summary)
    with open(out / "history.jsonl", "w", encoding="utf-8") as fh:
        for h in history:
            fh.write(json.dumps(h) + "\n")
    plot_curves(history, _pick(base), out / "curves.png")
    _print_table(summary)
    return summary


def _print_table(s: dict) -> None:
    def row(name: str, m: dict) -> str:
        lo, hi = m["accuracy_ci95"]
        cell = f"{m['cell_accuracy']:.3f}" if "cell_accuracy" in m else "-"
        return f"| {name:<5} | {m['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] | {cell:>13} |"

    print()
    print(f"{s['task']} - {s['method']} ({s['likelihood']} likelihood) - {s['n_eval']} eval rows ({s['eval_source']})")
    print("| model | accuracy [95% CI]      | cell_accuracy |")
    print("|-------|------------------------|---------------|")
    print(row("base", s["base"]))
    print(row("final", s["final"]))
    p = s.get("paired")
    if p:
        lo, hi = p["gain_ci95"]
        print(f"paired on the same {p['n']} rows: accuracy gain {p['gain']:+.3f} [{lo:+.3f}, {hi:+.3f}] "
              f"(paired bootstrap 95% CI, {p['bootstrap']['resamples']} resamples); exact McNemar p = "
              f"{p['mcnemar_p']:.3g} (solved only by base {p['first_only']}, only by final {p['second_only']})")
    print(f"RL steps {s['train_steps']}, wall time {s['wall_seconds']:.0f} s "
          f"(SFT {s['sft_seconds']:.0f} s{' cached' if s['sft_cached'] else ''}, RL {s['rl_seconds']:.0f} s)")
    if s.get("eval_note"):
        print(f"NOTE: {s['eval_note']}")
