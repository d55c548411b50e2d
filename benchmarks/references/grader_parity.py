"""Grader parity: maskrl's rewards on d1's published LLaDA-8B-Instruct generations vs d1's table.

d1 (dllm-reasoning/d1, ``eval/eval_baselines/``) published the raw generations behind its baseline
table: greedy LLaDA-8B-Instruct, block 32, steps = L/2, d1's prompts, 128- and 256-token files; each
item holds the question, the raw generation (with its end-of-text tokens) and the ground truth. This
script:

1. reads every ``{task}_instruct_{L}_{L/2}_{shard}_generations.json`` in the folder;
2. maps each item to a row of maskrl's own data file -- GSM8K and MATH-500 by question text,
   Countdown by (numbers, target), Sudoku by puzzle string -- and scores the raw generation with
   maskrl's task reward through the public ``Task.score_examples`` (the row's gold answer, not the
   one in the generation file);
3. scores the same generations with a re-implementation of d1's grader (``eval/parse_and_get_acc.py``
   rules, written here from their description), which gives d1's published numbers exactly;
4. writes the table (d1 paper, d1 rules, maskrl, maskrl with ``answer_form="strict"`` for the math
   tasks) to ``--out`` (JSON) and every row where maskrl and d1's rules disagree to ``--disagreements``
   (JSONL: task, length, file, item, question, gold, both extracted answers and scores, and the
   generation), for reading.

Metrics are the papers': accuracy for GSM8K, MATH-500 and Countdown; cell accuracy for Sudoku (the
fraction of blank cells filled correctly, maskrl's ``mean_reward``; d1 pools cells over puzzles,
which is the same number when every puzzle has 8 blanks, as here). Targets (issue 15): Countdown
within 1.5 points of d1, Sudoku cell accuracy within 0.6, GSM8K and MATH-500 not below d1.

    PYTHONPATH=src python benchmarks/references/grader_parity.py
    -> benchmarks/results/grader_parity.json, benchmarks/results/grader_parity_disagreements.jsonl
"""
from __future__ import annotations

import argparse
import glob
import json
import re
import time
from pathlib import Path

from maskrl.tasks import get_task
from maskrl.tasks.base import default_data_dir
from maskrl.tasks.countdown import equation_text
from maskrl.tasks.sudoku import extract_grid_digits

ROOT = Path(__file__).resolve().parents[2]
LENGTHS = (128, 256)
#: d1 paper, LLaDA-8B-Instruct baseline (percent), as given in issue 15
D1_PAPER = {
    "countdown": {128: 20.7, 256: 19.5},
    "sudoku": {128: 11.7, 256: 6.7},
    "gsm8k": {128: 69.3, 256: 76.4},
    "math500": {128: 26.0, 256: 32.4},
}
TASK_NAMES = {"countdown": "countdown", "sudoku": "sudoku4x4", "gsm8k": "gsm8k", "math500": "math500"}


# --------------------------------------------------------------------------- d1's grader, re-implemented
# The rules of d1's eval/parse_and_get_acc.py and parser_helper.py (the MATH normalisation of
# Hendrycks et al.), re-written from their description to score each row the way d1 did.

def _d1_last_box(text: str) -> str | None:
    """d1's last-box rule: ``None`` for an unclosed last box, the whole text when there is no box."""
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    idx = text.rfind("\\boxed")
    if idx < 0:
        idx = text.rfind("\\fbox")
        if idx < 0:
            return text
    depth = 0
    for i in range(idx, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[idx:i + 1]
    return None


def _d1_unbox(s: str) -> str:
    if "\\boxed " in s:
        return s[len("\\boxed "):]
    if s.startswith("\\boxed{") and s.endswith("}"):
        return s[len("\\boxed{"):-1]
    return s


def _frac_braces(s: str) -> str:
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part.startswith("{"):
            out += part
        elif len(part) < 2:
            return s
        elif part[1] != "{":
            out += "{" + part[0] + "}{" + part[1] + "}" + part[2:]
        else:
            out += "{" + part[0] + "}" + part[1:]
    return out


def _sqrt_braces(s: str) -> str:
    parts = s.split("\\sqrt")
    out = parts[0]
    for part in parts[1:]:
        out += "\\sqrt" + (part if part.startswith("{") else "{" + part[:1] + "}" + part[1:])
    return out


def _math_normal_form(s: str) -> str:
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in s:
        pieces = s.split("\\text{ ")
        if len(pieces) != 2:
            raise ValueError("units")
        s = pieces[0]
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = _sqrt_braces(s).replace(" ", "")
    s = _frac_braces(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    m = re.fullmatch(r"(\d+)/(\d+)", s)
    if m and s == f"{int(m.group(1))}/{int(m.group(2))}":
        s = "\\frac{" + m.group(1) + "}{" + m.group(2) + "}"
    return s


def _math_string_equal(a: str | None, b: str) -> bool:
    if a is None:
        return False
    try:
        return _math_normal_form(a) == _math_normal_form(b)
    except Exception:  # noqa: BLE001 - d1 falls back to raw equality on any error
        return a == b


def d1_grade(task: str, item: dict) -> tuple[float, str | None]:
    """``(score, extracted)`` of one generation under d1's rules (Sudoku score = correct cells)."""
    gen, gt, question = item["generations"], item["ground_truth"], item["question"]
    if task == "gsm8k":
        parsed = None
        for content in re.findall(r"\\boxed{(.*?)}", gen):
            content = content.strip()
            if not content or re.fullmatch(r"\.+", content):
                continue
            try:
                parsed = float(content)
                break
            except ValueError:
                nums = re.findall(r"-?\d+\.?\d*", content)
                if nums:
                    parsed = float(nums[0])
                    break
        if parsed is None:
            m = re.search(r"<answer>(.*?)</answer>", gen, re.S)
            if m and m.group(1).strip():
                text = m.group(1).strip()
                try:
                    parsed = float(text)
                except ValueError:
                    nums = re.findall(r"-?\d+\.?\d*", text)
                    if nums:
                        parsed = float(nums[-1])
        return float(parsed is not None and parsed == gt), None if parsed is None else str(parsed)
    if task == "math500":
        box = _d1_last_box(gen)
        parsed = _d1_unbox(box) if box is not None else None
        if not parsed:
            m = re.search(r"<answer>(.*?)</answer>", gen, re.S)
            parsed = m.group(1).strip() if m else parsed
        return float(_math_string_equal(parsed, gt)), parsed
    if task == "countdown":
        numbers, target = gt
        box = _d1_last_box(gen)
        if box is not None:
            eq = _d1_unbox(box)
        else:
            m = re.search(r"<answer>(.*?)</answer>", gen, re.S)
            eq = m.group(1).strip() if m else gen
        eq = eq.replace("\\div", "/").replace("\\times", "*").replace("\\cdot", "*")
        m = re.search(r"([0-9+\-*/() ]+)=[0-9. ]+", eq)
        if m:
            eq = m.group(1).strip()
        ok = sorted(int(n) for n in re.findall(r"\d+", eq)) == sorted(numbers)
        if ok and re.match(r"^[\d+\-*/().\s]+$", eq):
            try:  # arithmetic over digits and + - * / ( ) only (checked above), as d1 does
                value = eval(eq.strip(), {"__builtins__": None}, {})  # noqa: S307
            except Exception:  # noqa: BLE001
                value = float("inf")
            return float(abs(value - target) < 1e-5), eq
        return 0.0, eq
    if task == "sudoku":
        puzzle = re.search(r"([0-9]{16})", question).group(1)
        sol = ""
        for pat in (r"<answer>.*?```\s*([\d\s]+)```", r"<answer>(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|</answer>)",
                    r"</answer>\s*(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|$)", r".*?(\d{16})\s*</answer>",
                    r"\b(\d{16})\b"):
            m = re.search(pat, gen, re.S)
            if m and m.group(1).strip():
                sol = m.group(1).strip()
                break
        sol = re.sub(r"\s", "", sol)
        if not sol:
            return 0.0, sol
        sol = (sol + "0" * 16)[:16]
        return float(sum(1 for i in range(16) if puzzle[i] == "0" and sol[i] == gt[i])), sol
    raise ValueError(task)


# --------------------------------------------------------------------------- mapping to maskrl rows

def _row_index(task_key: str, task, data_root: Path):
    examples = task.load(task.resolve_path(data_root))
    if task_key in ("gsm8k", "math500"):
        field = "question" if task_key == "gsm8k" else "problem"
        with open(task.resolve_path(data_root), encoding="utf-8") as fh:
            texts = [json.loads(line)[field] for line in fh if line.strip()]
        return examples, {t.strip(): i for i, t in enumerate(texts)}
    if task_key == "countdown":
        return examples, {(tuple(sorted(ex.fields["numbers"])), int(ex.fields["target"])): ex.id for ex in examples}
    return examples, {ex.fields["puzzle"]: ex.id for ex in examples}


def _key(task_key: str, item: dict):
    if task_key in ("gsm8k", "math500"):
        return item["question"].strip()
    if task_key == "countdown":
        numbers, target = item["ground_truth"]
        return tuple(sorted(int(n) for n in numbers)), int(target)
    return re.search(r"([0-9]{16})", item["question"]).group(1)


def _maskrl_extracted(task_key: str, task, ex, completion: str):
    if task_key in ("gsm8k", "math500"):
        return task.extract([ex.prompt], [completion], [ex.fields["answer"]])[0]
    if task_key == "countdown":
        return equation_text(completion, ex.prompt)
    return extract_grid_digits(completion, ex.prompt)


def run(gen_dir: Path, data_root: Path, out: Path, disagreements: Path, tasks: tuple[str, ...] | None = None) -> dict:
    """Score every generation file and write the table and the disagreements (module docstring).

    Args:
        tasks: keys of :data:`TASK_NAMES` to run (default: all).

    Returns:
        ``{"generations_dir", "rows": [one entry per task and length]}`` (also written to ``out``).
    """
    table: dict = {"generations_dir": str(gen_dir), "rows": []}
    disagreement_rows = []
    for task_key, task_name in TASK_NAMES.items():
        if tasks is not None and task_key not in tasks:
            continue
        task = get_task(task_name)
        strict = get_task(task_name, answer_form="strict") if task_key in ("gsm8k", "math500") else None
        examples, index = _row_index(task_key, task, data_root)
        for L in LENGTHS:
            files = sorted(glob.glob(str(gen_dir / f"{task_key}_instruct_{L}_{L // 2}_*_generations.json")))
            items = [(Path(f).name, k, it) for f in files for k, it in enumerate(json.load(open(f))["generations"])]
            matched = [(name, k, it, examples[index[_key(task_key, it)]]) for name, k, it in items
                       if _key(task_key, it) in index]
            t0 = time.time()
            comps = [it["generations"] for _, _, it, _ in matched]
            rows = [ex for _, _, _, ex in matched]
            rewards = task.score_examples(rows, comps)
            strict_rewards = strict.score_examples(rows, comps) if strict is not None else None
            d1 = [d1_grade(task_key, it) for _, _, it, _ in matched]
            if task_key == "sudoku":
                blanks = [ex.fields["puzzle"].count("0") for ex in rows]
                d1_metric = 100 * sum(s for s, _ in d1) / sum(blanks)
                d1_per_row = [s / b for (s, _), b in zip(d1, blanks)]
                maskrl_metric = 100 * sum(rewards) / len(rewards)
                solved = 100 * sum(r >= 1 - 1e-9 for r in rewards) / len(rewards)
            else:
                d1_per_row = [s for s, _ in d1]
                d1_metric = 100 * sum(d1_per_row) / len(d1_per_row)
                maskrl_metric = 100 * sum(task.is_correct(r) for r in rewards) / len(rewards)
                solved = None
            entry = {
                "task": task_name, "length": L, "metric": "cell_accuracy" if task_key == "sudoku" else "accuracy",
                "files": len(files), "items": len(items), "matched": len(matched),
                "d1_paper": D1_PAPER[task_key][L], "d1_rules": round(d1_metric, 2), "maskrl": round(maskrl_metric, 2),
                "maskrl_minus_d1_paper": round(maskrl_metric - D1_PAPER[task_key][L], 2),
            }
            if solved is not None:
                entry["maskrl_solved_rate"] = round(solved, 2)
                entry["blanks_per_puzzle"] = sorted(set(blanks))
            if strict_rewards is not None:
                entry["maskrl_strict"] = round(100 * sum(task.is_correct(r) for r in strict_rewards) / len(rewards), 2)
            if task_key == "countdown":
                entry["maskrl_format_credit_rows"] = sum(abs(r - 0.1) < 1e-9 for r in rewards)
            gap = maskrl_metric - D1_PAPER[task_key][L]
            entry["target"] = {"countdown": "|maskrl - d1| <= 1.5", "sudoku": "|maskrl - d1| <= 0.6"}.get(
                task_key, "maskrl >= d1")
            entry["target_met"] = (abs(gap) <= 1.5 if task_key == "countdown" else abs(gap) <= 0.6
                                   if task_key == "sudoku" else gap >= 0)
            n_dis = 0
            for (name, k, it, ex), r, (ds, dx), dr in zip(matched, rewards, d1, d1_per_row):
                mine = r if task_key == "sudoku" else float(task.is_correct(r))
                if abs(mine - dr) > 1e-9:
                    n_dis += 1
                    disagreement_rows.append({
                        "task": task_name, "length": L, "file": name, "item": k, "row": ex.id,
                        "question": it["question"],
                        "gold": ex.fields.get("answer", ex.fields.get("solution", ex.fields.get("target"))),
                        "maskrl_score": r, "maskrl_extracted": _maskrl_extracted(task_key, task, ex, it["generations"]),
                        "d1_score": dr, "d1_extracted": dx, "generation": it["generations"],
                    })
            entry["disagreements_with_d1_rules"] = n_dis
            entry["seconds"] = round(time.time() - t0, 1)
            table["rows"].append(entry)
            print(json.dumps(entry), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
    with open(disagreements, "w", encoding="utf-8") as fh:
        for row in disagreement_rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = default_data_dir()
    ap.add_argument("--generations", default=str(data / "d1-generations") if data else None,
                    help="folder of d1's *_generations.json files (default: <data>/d1-generations)")
    ap.add_argument("--data", default=str(data) if data else None, help="maskrl data folder")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "grader_parity.json"))
    ap.add_argument("--disagreements",
                    default=str(ROOT / "benchmarks" / "results" / "grader_parity_disagreements.jsonl"))
    ap.add_argument("--tasks", default=",".join(TASK_NAMES), help=f"comma-separated subset of {','.join(TASK_NAMES)}")
    args = ap.parse_args()
    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    unknown = [t for t in tasks if t not in TASK_NAMES]
    if unknown:
        ap.error(f"--tasks: unknown {unknown}; valid: {', '.join(TASK_NAMES)}")
    if not args.generations or not Path(args.generations).is_dir():
        ap.error(f"--generations: no folder {args.generations!r}")
    if not args.data:
        ap.error("--data: no data folder found; pass one")
    run(Path(args.generations), Path(args.data), Path(args.out), Path(args.disagreements), tasks)


if __name__ == "__main__":
    main()
