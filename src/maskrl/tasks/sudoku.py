"""4x4 Sudoku (docs/spec.md §5): the d1 test CSV for evaluation, generated puzzles for training.

Reward = fraction of blank cells filled correctly (1.0 = solved): the cell accuracy papers report
(d1, DiSPO). The grid is the one the completion gives as its answer (:func:`extract_grid_digits`:
the answer span's digits, or the last grid-shaped run of 16 digits in prose), so spacing,
separators and chat formatting do not matter and digits of prose never count; fewer than 16
digits leave the remaining cells wrong. Training puzzles are drawn from the 288 valid 4x4 grids with
random blanks, kept only when their solution is unique and the puzzle string is not in the test file.
"""
from __future__ import annotations

import csv
import itertools
import random
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

from maskrl.tasks.base import TASKS, DataError, Example, Task
from maskrl.tasks.extract import final_part

GRID = 16
_DIGIT_RE = re.compile(r"[0-9]")
_WORD_RE = re.compile(r"[^\W\d_]{2,}")  # prose: a word of two letters or more
# digits separated only by layout characters
_GRID_RUN_RE = re.compile(r"[0-9](?:[\s,;|&.'\"\-/\\\[\](){}]*[0-9])*")
_ROW_LABEL_RE = re.compile(r"\b(?:row|line|r)\s*\d+\s*[:.)=\-]", re.I)
_TAG_RE = re.compile(r"<[<>/]*[A-Za-z_]*>?|\b[A-Za-z_]+>")
_LIST_MARKER_RE = re.compile(r"^[ \t]*\d{1,2}[.)][ \t]+", re.M)


def is_valid_grid(grid: str) -> bool:
    """True when ``grid`` (16 chars '1'-'4', row-major) satisfies every row, column and 2x2 box."""
    if len(grid) != GRID or any(c not in "1234" for c in grid):
        return False
    cells = [[grid[r * 4 + c] for c in range(4)] for r in range(4)]
    units = [cells[r] for r in range(4)]
    units += [[cells[r][c] for r in range(4)] for c in range(4)]
    units += [[cells[br + r][bc + c] for r in range(2) for c in range(2)] for br in (0, 2) for bc in (0, 2)]
    return all(sorted(u) == ["1", "2", "3", "4"] for u in units)


@lru_cache(maxsize=1)
def all_grids() -> tuple[str, ...]:
    """The 288 valid 4x4 Sudoku grids, as 16-char strings."""
    rows = ["".join(p) for p in itertools.permutations("1234")]
    out = []
    for r in itertools.product(rows, repeat=4):
        g = "".join(r)
        if is_valid_grid(g):
            out.append(g)
    return tuple(out)


def solutions_of(puzzle: str) -> list[str]:
    """All valid grids consistent with ``puzzle`` ('0' = blank)."""
    return [g for g in all_grids() if all(p == "0" or p == c for p, c in zip(puzzle, g))]


def extract_grid_digits(completion: str, prompt: str | None = None, require_final_answer: bool = False) -> str:
    """The grid a completion gives as its answer, as up to 16 digits (row-major).

    The completion's final part is read (:func:`maskrl.tasks.extract.final_part`: the ``<answer>``
    span, else the text after ``</reasoning>``, else the whole text; cut at the end-of-text token).
    Tag remnants (``</answer``) are dropped. When that part holds no prose (no word of two letters
    or more; a stray letter is not prose), its digits are the grid as written, whatever the layout (rows
    on lines, spaces, commas, ``|``, LaTeX ``\\``); the first 16 count (a short grid leaves cells
    empty). When it holds prose, the grid is the **last grid-shaped run**: at least 16 digits
    separated only by layout characters (whitespace ``, ; | & . ' " - / \\`` and brackets), after
    dropping row labels (``Row 1:``) and list markers (``1.`` at a line start) -- so digits of prose
    ("a 4x4 grid", "numbers 1-4") never count, and "the solved 4x4 Sudoku is: <grid>" reads
    the grid. Prose without such a run gives ``""``.

    With ``require_final_answer``, a completion cut off before any final answer gives ``""``.
    """
    part = final_part(completion, prompt)
    if part.is_cut_off and require_final_answer:
        return ""
    text = part.span if part.span is not None and _DIGIT_RE.search(part.span) else part.text
    text = _TAG_RE.sub(" # ", text)  # tag remnants (``</answer``, ``<>answer>``): not prose, and end a run
    if not _WORD_RE.search(text):
        return "".join(_DIGIT_RE.findall(text))[:GRID]
    text = _LIST_MARKER_RE.sub(" ", _ROW_LABEL_RE.sub(" ", text))
    runs = ["".join(_DIGIT_RE.findall(m.group())) for m in _GRID_RUN_RE.finditer(text)]
    full = [r for r in runs if len(r) >= GRID]
    return full[-1][:GRID] if full else ""


def cell_reward(puzzle: str, solution: str, completion: str, prompt: str | None = None,
                require_final_answer: bool = False) -> float:
    """Fraction of ``puzzle``'s blanks whose digit in the completion's grid (:func:`extract_grid_digits`)
    equals ``solution`` (docs/spec.md §5; docs/benchmarks.md). 1.0 for a puzzle without blanks."""
    digits = extract_grid_digits(completion, prompt, require_final_answer)
    blanks = [i for i, ch in enumerate(puzzle) if ch == "0"]
    if not blanks:
        return 1.0
    right = sum(1 for i in blanks if i < len(digits) and digits[i] == solution[i])
    return right / len(blanks)


@TASKS.register("sudoku4x4")
class Sudoku4x4(Task):
    """4x4 Sudoku from d1 (``dataset/4x4_test_sudoku.csv``; columns Puzzle,Solution; 0 = blank)."""

    name = "sudoku4x4"
    data_file = "sudoku4x4/4x4_test_sudoku.csv"
    hub_id = "github:dllm-reasoning/d1 dataset/4x4_test_sudoku.csv"
    prompt_template = ("Solve this 4x4 Sudoku. Each row, column and 2x2 box must contain 1, 2, 3 and 4. "
                       "The grid is given row by row as 16 digits, 0 marks an empty cell: {puzzle}\n"
                       "Answer with the 16 digits of the solved grid inside <answer></answer>.")
    template_fields = ("puzzle",)

    def make_example(self, idx: int, puzzle: str, solution: str) -> Example:
        return Example(id=idx, prompt=self.prompt_template.format(puzzle=puzzle),
                       fields={"puzzle": puzzle, "solution": solution})

    def parse(self, path: Path) -> list[Example]:
        out = []
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames is None or not {"Puzzle", "Solution"} <= set(reader.fieldnames):
                raise DataError(f"{path}:1: header must contain Puzzle,Solution; got {reader.fieldnames}")
            for lineno, row in enumerate(reader, start=2):
                puzzle, solution = (row.get("Puzzle") or "").strip(), (row.get("Solution") or "").strip()
                where = f"{path}:{lineno}"
                if None in row:  # cells beyond the header, which DictReader would keep aside unread
                    raise DataError(f"{where}: {len(reader.fieldnames) + len(row[None])} cells but the header has "
                                    f"{len(reader.fieldnames)} columns ({','.join(reader.fieldnames)})")
                if len(puzzle) != GRID or any(c not in "01234" for c in puzzle):
                    raise DataError(f"{where}: Puzzle {puzzle!r} must be 16 digits 0-4")
                if not is_valid_grid(solution):
                    raise DataError(f"{where}: Solution {solution!r} is not a valid 4x4 grid")
                if any(p != "0" and p != s for p, s in zip(puzzle, solution)):
                    raise DataError(f"{where}: Solution contradicts the Puzzle's givens")
                out.append(self.make_example(len(out), puzzle, solution))
        return out

    def reward(self, prompts: Sequence[str], completions: Sequence[str], *, puzzle: Sequence[str],
               solution: Sequence[str], **_: Any) -> list[float]:
        ps = list(prompts) if prompts is not None and len(prompts) == len(completions) else [None] * len(completions)
        return [cell_reward(p, s, c, q, self.require_final_answer)
                for p, s, c, q in zip(puzzle, solution, completions, ps)]

    def metrics(self, examples, completions, rewards) -> dict:
        out = super().metrics(examples, completions, rewards)
        out["cell_accuracy"] = out["mean_reward"]
        out["cell_accuracy_ci95"] = out["mean_reward_ci95"]
        return out

    @staticmethod
    def instance_key(ex: Example) -> str:
        """What makes two puzzles the same (used to keep training puzzles out of the test set)."""
        return ex.fields["puzzle"]

    @staticmethod
    def target(ex: Example) -> str:
        """The SFT target completion: the solved grid."""
        return ex.fields["solution"]

    def generate(self, n: int, seed: int, exclude: Iterable[str] = (), blanks: tuple[int, int] = (6, 10),
                 unique: bool = True) -> list[Example]:
        """``n`` training puzzles, none of whose puzzle strings is in ``exclude``.

        Args:
            n: number of puzzles.
            seed: seed of the explicit ``random.Random`` used (never the global RNG).
            exclude: puzzle strings never to emit (pass the test file's puzzles).
            blanks: inclusive range of the number of blank cells.
            unique: keep only puzzles with exactly one solution.
        """
        rng = random.Random(seed)
        banned = set(exclude)
        grids = all_grids()
        out: list[Example] = []
        seen: set[str] = set()
        while len(out) < n:
            grid = rng.choice(grids)
            k = rng.randint(*blanks)
            holes = set(rng.sample(range(GRID), k))
            puzzle = "".join("0" if i in holes else ch for i, ch in enumerate(grid))
            if puzzle in banned or puzzle in seen:
                continue
            if unique and len(solutions_of(puzzle)) != 1:
                continue
            seen.add(puzzle)
            out.append(self.make_example(len(out), puzzle, grid))
        return out
