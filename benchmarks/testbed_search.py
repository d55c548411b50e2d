"""The testbed search of issue 22 (part 1): which base recipe learns on validation, by measurement.

Every pilot is one base cell of ``benchmarks/controlled_table.py`` (``diffu_grpo_state`` unless it names
another) over a task's
table recipe with a few ``--set`` overrides, on the generated **validation** split only (300 rows;
the test file is never read), seed 0 unless ``--seeds`` says otherwise, the validation curve every 10
RL steps. Each pilot's records go to ``results/testbed_search/<name>.json`` as it finishes (the
controlled table's record format: curve, rewards, RL CPU seconds), so the search is resumable and
its numbers are on disk.

    python benchmarks/testbed_search.py --list
    python benchmarks/testbed_search.py --run sud_lr1e-4_pm0_b0_p8          # one pilot (minutes)
    python benchmarks/testbed_search.py --summary                          # markdown table of all

The summary gives, per pilot, the SFT model's validation solved rate (step 0 of the curve), the
final and best solved rate on the curve, the change final − SFT, the mean rollout reward of the
first and last ten RL steps, and the RL CPU seconds (one thread; evaluation excluded).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "results" / "testbed_search"

#: name -> (task, --set overrides over configs/table/<task>.yaml[, controlled-table cell; default diffu_grpo_state])
_SUD = ["sft.steps=250"]
_B0 = ["objective.beta=0"]
_PM0 = ["likelihood.p_mask_prompt=0"]
PILOTS: dict[str, tuple] = {
    "sud_lr1e-3_b0_p8": ("sudoku", _SUD + ["train.lr=1e-3"] + _B0 + ["train.prompts_per_step=8", "train.steps=80"]),
    "sud_lr3e-4_b0_p8": ("sudoku", _SUD + ["train.lr=3e-4"] + _B0 + ["train.prompts_per_step=8", "train.steps=80"]),
    "sud_lr3e-4_w10_b0_p8": ("sudoku", _SUD + ["train.lr=3e-4", "train.warmup_steps=10"] + _B0
                             + ["train.prompts_per_step=8", "train.steps=80"]),
    "sud_lr1e-4_w10_b0_p8": ("sudoku", _SUD + ["train.lr=1e-4", "train.warmup_steps=10"] + _B0
                             + ["train.prompts_per_step=8", "train.steps=80"]),
    "sud_lr1e-4_pm0_b0_p8": ("sudoku", _SUD + ["train.lr=1e-4"] + _PM0 + _B0 + ["train.prompts_per_step=8", "train.steps=80"]),
    "sud_lr3e-4_pm0_b0_p8": ("sudoku", _SUD + ["train.lr=3e-4"] + _PM0 + _B0 + ["train.prompts_per_step=8", "train.steps=80"]),
    "sud_lr3e-5c_pm0_b0_p16": ("sudoku", _SUD + ["train.lr=3e-5", "train.lr_scheduler=constant"] + _PM0 + _B0
                               + ["train.steps=40"]),
    "sud_T8_lr1e-4_pm0_b0_p16": ("sudoku", _SUD + ["train.lr=1e-4", "rollout.steps=8", "eval.steps=8"] + _PM0 + _B0
                                 + ["train.steps=40"]),
    "sud_sft200_lr1e-4_pm0_b0_p8": ("sudoku", ["sft.steps=200", "train.lr=1e-4"] + _PM0 + _B0
                                    + ["train.prompts_per_step=8", "train.steps=80"]),
    "sud_lr3e-4_pm0_b0_p32": ("sudoku", _SUD + ["train.lr=3e-4"] + _PM0 + _B0
                              + ["train.prompts_per_step=32", "train.steps=20", "train.micro_batch_size=48"]),
    "sud_wd1_lr3e-4_p16": ("sudoku", _SUD + ["train.lr=3e-4"] + ["train.steps=60"], "wd1"),
    "sud_lr3e-4_beta0.2_p16": ("sudoku", _SUD + ["train.lr=3e-4", "objective.beta=0.2", "train.steps=40"]),
    "cd_sft1000_lr1e-4_pm0_b0_p16": ("countdown", ["sft.steps=1000", "train.lr=1e-4"] + _PM0 + _B0 + ["train.steps=40"]),
    "cd_sft1000_lr3e-4_pm0_b0_p16": ("countdown", ["sft.steps=1000", "train.lr=3e-4"] + _PM0 + _B0 + ["train.steps=40"]),
    # third round (session 2026-12-01b): more updates within the 4-minute budget on Countdown's 26-point headroom
    "cd_lr1e-3_pm0_b0_p16_s60": ("countdown", ["sft.steps=1000", "train.lr=1e-3"] + _PM0 + _B0 + ["train.steps=60"]),
    "cd_lr3e-4_pm0_b0_p8_s120": ("countdown", ["sft.steps=1000", "train.lr=3e-4"] + _PM0 + _B0
                                 + ["train.prompts_per_step=8", "train.steps=120"]),
    "cd_lr1e-4_pm0_b0_p8_s120": ("countdown", ["sft.steps=1000", "train.lr=1e-4"] + _PM0 + _B0
                                 + ["train.prompts_per_step=8", "train.steps=120"]),
    "cd_lr3e-4_w20_pm0_p8_s100": ("countdown", ["sft.steps=1000", "train.lr=3e-4", "train.warmup_steps=20"] + _PM0
                                  + ["train.prompts_per_step=8", "train.steps=100"]),
    # the cheaper bases spend the same 4 minutes on ~3x the steps of diffu_grpo_state (table: ~2 s vs ~6.4 s per step)
    "cd_rldf_s100": ("countdown", ["sft.steps=1000", "train.steps=100"], "rldf"),
    "sud_rldf_s100": ("sudoku", _SUD + ["train.steps=100"], "rldf"),
    "sud_lr2e-4_w10_pm0_p8_s70": ("sudoku", _SUD + ["train.lr=2e-4", "train.warmup_steps=10"] + _PM0
                                  + ["train.prompts_per_step=8", "train.steps=70"]),
    # the best Sudoku pilot, trimmed to the 4-minute budget, over 5 seeds
    "sud_lr2e-4_w10_pm0_p8_s65": ("sudoku", _SUD + ["train.lr=2e-4", "train.warmup_steps=10"] + _PM0
                                  + ["train.prompts_per_step=8", "train.steps=65"]),
    "sud_lr3e-4_w10_pm0_p8_s65": ("sudoku", _SUD + ["train.lr=3e-4", "train.warmup_steps=10"] + _PM0
                                  + ["train.prompts_per_step=8", "train.steps=65"]),
    "cd_lr2e-4_w10_pm0_p8_s65": ("countdown", ["sft.steps=1000", "train.lr=2e-4", "train.warmup_steps=10"] + _PM0
                                 + ["train.prompts_per_step=8", "train.steps=65"]),
    # wordmath (configs/table/wordmath.yaml): the best Sudoku recipe's shape, steps cut to the budget (L 32)
    "wm_lr2e-4_w10_pm0_p8_s30": ("wordmath", ["train.lr=2e-4", "train.warmup_steps=10"] + _PM0
                                 + ["train.prompts_per_step=8", "train.steps=30"]),
    "sud_spg_lr3e-4_w10_s100": ("sudoku", _SUD + ["train.lr=3e-4", "train.warmup_steps=10", "train.steps=100"], "spg"),
    # train.reward=correct: advantages from the solved indicator (the validation metric) instead of the cell fraction
    "sud_correct_lr1e-4_pm0_b0_p8": ("sudoku", _SUD + ["train.lr=1e-4", "train.reward=correct"] + _PM0 + _B0
                                     + ["train.prompts_per_step=8", "train.steps=80"]),
    "sud_correct_lr3e-4_pm0_b0_p8": ("sudoku", _SUD + ["train.lr=3e-4", "train.reward=correct"] + _PM0 + _B0
                                     + ["train.prompts_per_step=8", "train.steps=80"]),
    # fourth round (session 2026-12-01c): the best Sudoku recipe held at its peak lr after warm-up (its curves
    # were still rising when the linear schedule ran the lr down), and more, smaller steps in the same budget
    "sud_lr2e-4_w10c_pm0_p8_s65": ("sudoku", _SUD + ["train.lr=2e-4", "train.warmup_steps=10",
                                                    "train.lr_scheduler=constant_with_warmup"] + _PM0
                                   + ["train.prompts_per_step=8", "train.steps=65"]),
    "sud_lr2e-4_w10_pm0_p6_s85": ("sudoku", _SUD + ["train.lr=2e-4", "train.warmup_steps=10"] + _PM0
                                  + ["train.prompts_per_step=6", "train.steps=85"]),
    "sud_lr2e-4_w10_beta0.1_pm0_p8_s65": ("sudoku", _SUD + ["train.lr=2e-4", "train.warmup_steps=10", "objective.beta=0.1"]
                                          + _PM0 + ["train.prompts_per_step=8", "train.steps=65"]),
    "sud_lr2e-4_w10_pm0_p12g4_s65": ("sudoku", _SUD + ["train.lr=2e-4", "train.warmup_steps=10"] + _PM0
                                     + ["train.prompts_per_step=12", "train.group_size=4", "train.steps=65"]),
    # DiSPO steadied the recipe's spread over seeds (controlled_table_r3): does it hold the lr the base swings at?
    "sud_dispo_lr3e-4_w10_pm0_p8_s65": ("sudoku", _SUD + ["train.lr=3e-4", "train.warmup_steps=10"] + _PM0
                                        + ["train.prompts_per_step=8", "train.steps=65"], "dispo@diffu_grpo_state"),
    # the model's size (issue 22's unmeasured lever): Countdown on a 256-wide model, its own SFT-1000 checkpoint
    "cd_w256_lr2e-4_w10_pm0_p8_s65": ("countdown", ["sft.steps=1000", "model.tiny.hidden_size=256",
                                                    "model.tiny.intermediate_size=768", "train.lr=2e-4",
                                                    "train.warmup_steps=10"] + _PM0
                                      + ["train.prompts_per_step=8", "train.steps=65"]),
}


def table_argv(name: str, seeds: str, every: int) -> list[str]:
    """The controlled-table command line of pilot ``name`` (after the interpreter and the script): its
    records land in ``OUT_DIR/<name>.json``.

    Raises:
        SystemExit: an unknown pilot (lists the known ones).
    """
    if name not in PILOTS:
        raise SystemExit(f"error: unknown pilot {name!r}; known: {', '.join(PILOTS)}")
    task, overrides, *cell = PILOTS[name]
    argv = ["--tasks", task, "--cells", cell[0] if cell else "diffu_grpo_state", "--seeds", seeds, "--eval-every", str(every),
            "--out", str(OUT_DIR / f"{name}.json"), "--doc", str(Path(tempfile.gettempdir()) / f"testbed_search_{name}.md"),
            "--runs-dir", str(ROOT / "runs" / "testbed_search" / name)]  # its own run folders: pilots may run side by side
    for o in overrides:
        argv += ["--set", o]
    return argv


def run(name: str, seeds: str, every: int) -> None:
    """Run pilot ``name`` (a subprocess of the controlled table; its records land in OUT_DIR)."""
    argv = table_argv(name, seeds, every)
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "controlled_table.py"), *argv], check=True)


def rows() -> list[dict]:
    """One summary row per recorded (pilot, seed), in PILOTS order, then any unlisted record file."""
    names = list(PILOTS) + sorted(p.stem for p in OUT_DIR.glob("*.json") if p.stem not in PILOTS)
    out = []
    for name in names:
        path = OUT_DIR / f"{name}.json"
        if not path.is_file():
            continue
        for key, r in json.loads(path.read_text())["runs"].items():
            curve = [(s, m["accuracy"]) for s, m in r["val_curve"]]
            rw = r["rewards"]
            out.append({"pilot": name, "seed": r["seed"], "task": r["task"], "cell": r["cell"], "overrides": r["overrides"],
                        "sft": curve[0][1], "final": curve[-1][1], "best": max(a for _, a in curve[1:]),
                        "change": curve[-1][1] - curve[0][1], "curve": curve,
                        "reward_first10": sum(rw[:10]) / len(rw[:10]), "reward_last10": sum(rw[-10:]) / len(rw[-10:]),
                        "steps": r["steps"], "completions": r["completions"], "rl_cpu_seconds": r["rl_cpu_seconds"]})
    return out


def markdown(table: list[dict]) -> str:
    head = ("| pilot | cell | seed | SFT solved | final | best on curve | final − SFT | rollout reward first → last 10 "
            "| steps × completions | RL CPU s |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
    return head + "\n".join(
        f"| `{r['pilot']}` | {r['cell']} | {r['seed']} | {r['sft']:.3f} | {r['final']:.3f} | {r['best']:.3f} | {r['change']:+.3f} "
        f"| {r['reward_first10']:.3f} → {r['reward_last10']:.3f} | {r['steps']} × {r['completions'] // r['steps']} "
        f"| {r['rl_cpu_seconds']:.0f} |" for r in table)


def seed_summary(table: list[dict]) -> str:
    """Markdown: per pilot run with several seeds, the final − SFT change as a mean with its 95 %
    t-interval over seeds, the seeds above / below zero, and the mean RL CPU seconds ('' if none)."""
    from ablation_runs import differences, format_differences

    by: dict[str, list[dict]] = {}
    for r in table:
        by.setdefault(r["pilot"], []).append(r)
    lines = []
    for name, rows in by.items():
        if len(rows) < 2:
            continue
        change = format_differences(differences([r["change"] for r in rows]))
        cpu = sum(r["rl_cpu_seconds"] for r in rows) / len(rows)
        lines.append(f"| `{name}` | {len(rows)} | {change} | {cpu:.0f} |")
    if not lines:
        return ""
    return ("| pilot | seeds | final − SFT, 95 % t-interval (seeds +/−) | mean RL CPU s |\n| --- | --- | --- | --- |\n"
            + "\n".join(lines) + "\n")


def parser() -> argparse.ArgumentParser:
    """The command line of :func:`main` (also what the documented commands are checked against)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="", help="comma-separated pilots to run")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--summary", action="store_true", help="print the markdown table of every record")
    ap.add_argument("--list", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.list:
        for name, (task, ov, *cell) in PILOTS.items():
            print(f"{name:32s} {task:10s} {cell[0] if cell else 'diffu_grpo_state':18s} {' '.join(ov)}")
        return
    for name in [n for n in args.run.split(",") if n]:
        run(name, args.seeds, args.eval_every)
    if args.summary or not args.run:
        table = rows()
        print(markdown(table))
        several = seed_summary(table)
        if several:
            print("\n" + several)


if __name__ == "__main__":
    main()
