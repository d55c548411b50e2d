"""DTCA ablation (issue 10, item 5) on the tiny model, CPU.

Cells: ``rldf`` (the base: k = 4 sampled states), ``dtca`` (step selection + POS credit +
entropy-flow calibration), ``dtca_nocal`` (DTCA − calibration) and ``dtca_nopos`` (DTCA − in-step
POS credit) from the shipped recipes ``configs/dtca_<task>_<cell>.yaml`` on ``wordmath`` and
``countdown``. Every cell of a task starts from the task's SFT checkpoint (cached), runs the same
number of RL steps (rollout batches, μ = 1: one optimizer step each) per seed, and is scored
greedily with the threshold sampler on a generated **validation** split (disjoint from the training
rows and the test file); the test file is read only with ``--test``.

The DTCA recipes read the POS table ``configs/pos_weights/<task>_tiny.json``; ``--pos-tables``
(re)writes it from the task's SFT model with ``maskrl estimate-pos-weights`` before any run (the
tables are committed, so this is needed only after the SFT recipe changes).

Long generation (the paper: POS credit without calibration can hurt at long lengths):
``--long L`` adds the cells again with the completion length (rollout and evaluation) set to L,
named ``<cell>@L<L>``. They start from the task's SFT checkpoint trained ``--long-sft-steps`` more
SFT steps at length L (a model trained at 32 tokens does not survive 64: wordmath greedy accuracy
0.10 → 0.04); the extra positions are end-of-text padding, so every trajectory has more denoising
steps and more tokens to give credit to.

Curves per run: rollout reward, commit NLL (mean −log p of the committed tokens: a Monte-Carlo
estimate of the sampling entropy at the committed positions, in nats) and the KL term's estimate.
Resumable: each finished run is written to ``--out`` at once.

    python benchmarks/dtca_ablation.py --steps 30 --seeds 0,1,2 --tasks wordmath --out benchmarks/results/dtca_wordmath.json
    python benchmarks/dtca_ablation.py --summary --merge A.json,B.json --out benchmarks/results/dtca_ablation.json
    python benchmarks/dtca_ablation.py --steps 1 --seeds 0 --val-size 16 --tasks wordmath --cells rldf,dtca \
        --out /tmp/dtca_smoke.json   # smoke
"""
from __future__ import annotations

import json

from ablation_runs import (ROOT, TaskSetup, ablation_parser, plot_curves, require_runs, run_cell, save_results, start,
                           summary_rows)


def length_overrides(L: int) -> list[str]:
    """One block of ``L`` with up to ``L`` steps, for rollouts and evaluation."""
    return [f"{s}.{k}={L}" for s in ("rollout", "eval") for k in ("gen_length", "block_length", "steps")]


def curves(hist: list[dict]) -> dict:
    kl = next((k for k in hist[0] if k.endswith("/kl") and not k.startswith("credit/")), None) if hist else None
    return {"commit_nll": [h["commit_nll"] for h in hist], "kl": [h.get(kl, 0.0) for h in hist] if kl else [],
            "kl_key": kl}


def main() -> None:
    ap = ablation_parser(__doc__, "wordmath,countdown", "dtca_ablation.json")
    ap.add_argument("--cells", default="rldf,dtca,dtca_nocal,dtca_nopos")
    ap.add_argument("--steps", type=int, default=0, help="RL steps per run (equal for every cell)")
    ap.add_argument("--long", type=int, default=0, help="also run the cells at this completion length (0 = no)")
    ap.add_argument("--long-sft-steps", type=int, default=300, help="SFT steps at the long length")
    ap.add_argument("--long-cells", default="rldf,dtca,dtca_nocal", help="cells of the long-generation rows")
    ap.add_argument("--pos-tables", action="store_true", help="(re)write configs/pos_weights/<task>_tiny.json first")
    ap.add_argument("--pos-samples", type=int, default=128)
    args = ap.parse_args()
    if not args.summary and args.steps < 1 and not args.pos_tables:
        ap.error(f"--steps must be >= 1, got {args.steps}")
    out, data, seeds, tasks = start(args, ("pos_tables",))
    if not args.summary:
        for task in tasks:
            rldf = ROOT / "configs" / f"dtca_{task}_rldf.yaml"
            setup = TaskSetup(task, rldf, args.overrides, "dtca", args.val_size)
            table = ROOT / "configs" / "pos_weights" / f"{task}_tiny.json"
            if args.pos_tables:
                from maskrl.pos import run_estimate

                res = run_estimate(str(setup.ensure_sft()), task, args.pos_samples, str(table), device="cpu", progress=False)
                res["model"] = f"runs/dtca/{task}_sft/{setup.sft_dir.name} (SFT of configs/dtca_{task}_rldf.yaml)"
                table.write_text(json.dumps(res, indent=2) + "\n")  # the model as a repository path
                data.setdefault("pos_tables", {})[task] = {k: res[k] for k in ("w_c", "m_c", "count", "seconds", "samples")}
                save_results(out, data)
                print(f"[dtca] POS table {task}: {res['w_c']} ({res['seconds']:.0f} s)", flush=True)
            if args.steps < 1:
                continue
            for cell in [c for c in args.cells.split(",") if c]:
                for seed in seeds:
                    run_cell(setup, data, out, task, cell, ROOT / "configs" / f"dtca_{task}_{cell}.yaml", args.overrides,
                             args.steps, seed, args.test, curves=curves, group="dtca")
            if args.long:
                over = args.overrides + length_overrides(args.long)
                long_setup = TaskSetup(task, rldf, over + [f"model.path={setup.ensure_sft()}", f"sft.steps={args.long_sft_steps}"],
                                       "dtca", args.val_size)
                for cell in [c for c in args.long_cells.split(",") if c]:
                    for seed in seeds:
                        run_cell(long_setup, data, out, task, f"{cell}@L{args.long}",
                                 ROOT / "configs" / f"dtca_{task}_{cell}.yaml", over, args.steps, seed, args.test,
                                 curves=curves, group="dtca")
    if args.pos_tables and args.steps < 1 and not args.summary and not data["runs"]:
        return  # only the POS tables were asked for: no runs to summarise
    require_runs(data, out)
    data["summary"] = summary_rows(data)
    save_results(out, data)
    plot_curves(data, out.with_suffix(".png"), {"rewards": "mean rollout reward",
                                                "commit_nll": "commit NLL (nats; entropy estimate)", "kl": "KL to reference"})


if __name__ == "__main__":
    main()
