"""Countdown with 3 numbers (docs/spec.md §5): d1's ``countdown_cd3_test.jsonl`` for evaluation,
solver-generated problems for training.

Reward: 1.0 for an equation that uses each given number exactly once and evaluates to the target;
0.1 for a well-formed arithmetic expression that does not; 0 otherwise. The expression is parsed
with :mod:`ast` and evaluated by walking a whitelist of nodes (integer literals, ``+ - * /`` and
parentheses) with exact fractions -- model output is never passed to ``eval``.
"""
from __future__ import annotations

import ast
import itertools
import random
import re
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable, Sequence

from maskrl.tasks.base import TASKS, DataError, Example, Task, iter_jsonl, require
from maskrl.tasks.extract import final_part, last_boxed

MAX_EXPR_CHARS = 200
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b}
_NORMALISE = str.maketrans({"×": "*", "÷": "/", "−": "-", "–": "-", "x": "*", "X": "*"})


class _Malformed(ValueError):
    pass


def _walk(node: ast.AST, numbers: list[int]) -> Fraction | None:
    """Evaluate a whitelisted arithmetic AST; ``None`` on division by zero; collects literals."""
    if isinstance(node, ast.Expression):
        return _walk(node.body, numbers)
    if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
        numbers.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _walk(node.left, numbers), _walk(node.right, numbers)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Div) and right == 0:
            return None
        return _OPS[type(node.op)](left, right)
    raise _Malformed(type(node).__name__)


_LATEX_OPS = (("\\times", "*"), ("\\cdot", "*"), ("\\ast", "*"), ("\\div", "/"), ("\\left", ""),
              ("\\right", ""), ("\\,", " "), ("\\!", ""), ("\\ ", " "), ("\\(", ""), ("\\)", ""),
              ("\\[", ""), ("\\]", ""), ("$", ""))
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_OPERATOR_RE = re.compile(r"[-+*/]")


def equation_text(completion: str, prompt: str | None = None, require_final_answer: bool = False) -> str | None:
    """The equation a completion states, as plain arithmetic text (``None``: cut off, see below).

    Reads the answer span (else the text after ``</reasoning>``, else the whole text; rules shared
    by all tasks in :mod:`maskrl.tasks.extract`, minus-like characters read as ``-``), unwraps a
    ``\\boxed{}`` (also one left unclosed by a truncated completion), turns LaTeX into arithmetic
    (``\\times``/``\\cdot`` -> ``*``, ``\\div`` -> ``/``, ``\\frac{a}{b}`` -> ``(a)/(b)``, ``\\left``/
    ``\\right``/``$`` dropped, braces and brackets read as parentheses), keeps the first non-empty
    line (up to any ``<``, without a trailing ``>`` left by a mangled closer) and, of ``a = b`` sides,
    the first that holds an operator (``55 - 53 = 2`` and ``2 = 55 - 53`` both give ``55 - 53``).

    With ``require_final_answer``, a completion cut off before any final answer gives ``None``.
    """
    part = final_part(completion, prompt)
    if part.is_cut_off and require_final_answer:
        return None
    text = part.span if part.span is not None else part.text
    boxed = last_boxed(text, allow_unclosed=True)
    if boxed is not None:
        text = boxed
    for latex, plain in _LATEX_OPS:
        text = text.replace(latex, plain)
    for _ in range(8):
        new = _FRAC_RE.sub(r"(\1)/(\2)", text)
        if new == text:
            break
        text = new
    text = text.replace("{", "(").replace("}", ")").replace("[", "(").replace("]", ")")
    lines = [ln.strip() for ln in text.strip().split("\n") if ln.strip()]
    # a tag or a mangled closer glued to the end (``16>``, ``16</answer``) is not part of the equation
    expr = lines[0].split("<", 1)[0].rstrip(" >").translate(_NORMALISE) if lines else ""
    if "=" in expr:
        sides = [side.strip() for side in expr.split("=")]
        expr = next((side for side in sides if _OPERATOR_RE.search(side)), sides[0])
    return expr.strip().rstrip(".").strip()


def parse_equation(text: str, prompt: str | None = None,
                   require_final_answer: bool = False) -> tuple[Fraction | None, list[int]] | None:
    """Parse the equation in a completion (read by :func:`equation_text`).

    Returns:
        ``(value, literals)`` for a well-formed expression (``value`` is ``None`` after a division
        by zero), or ``None`` when the text is not arithmetic over integers with ``+ - * /``.
    """
    expr = equation_text(text, prompt, require_final_answer) if isinstance(text, str) else None
    if not expr or len(expr) > MAX_EXPR_CHARS or not re.fullmatch(r"[0-9+\-*/() .]+", expr):
        return None
    try:
        tree = ast.parse(expr, mode="eval")
        numbers: list[int] = []
        value = _walk(tree, numbers)
    except (SyntaxError, _Malformed, RecursionError, ValueError):
        return None
    return value, numbers


def countdown_reward(numbers: Sequence[int], target: int, completion: str, prompt: str | None = None,
                     require_final_answer: bool = False) -> float:
    """1.0 correct, 0.1 well-formed but wrong, 0.0 otherwise (docs/spec.md §5; docs/benchmarks.md)."""
    parsed = parse_equation(completion, prompt, require_final_answer)
    if parsed is None:
        return 0.0
    value, used = parsed
    if sorted(used) == sorted(numbers) and value is not None and value == target:
        return 1.0
    return 0.1


def _expressions(nums: Sequence[int]) -> Iterable[tuple[str, Fraction]]:
    """Every expression using all of ``nums`` once (any order, any bracketing), with its value."""
    if len(nums) == 1:
        yield str(nums[0]), Fraction(nums[0])
        return
    for i in range(1, len(nums)):
        for left_idx in itertools.combinations(range(len(nums)), i):
            left = [nums[j] for j in left_idx]
            right = [nums[j] for j in range(len(nums)) if j not in left_idx]
            for ls, lv in _expressions(left):
                for rs, rv in _expressions(right):
                    lw = ls if len(left) == 1 else f"({ls})"
                    rw = rs if len(right) == 1 else f"({rs})"
                    yield f"{lw}+{rw}", lv + rv
                    yield f"{lw}-{rw}", lv - rv
                    yield f"{lw}*{rw}", lv * rv
                    if rv != 0:
                        yield f"{lw}/{rw}", lv / rv


def solve(numbers: Sequence[int], target: int) -> str | None:
    """The shortest expression over ``numbers`` (each once) equal to ``target``, or ``None``."""
    best = None
    for s, v in _expressions(list(numbers)):
        if v == target and (best is None or len(s) < len(best)):
            best = s
    return best


@TASKS.register("countdown")
class Countdown(Task):
    """Countdown, 3 numbers (d1 ``dataset/countdown_cd3_test.jsonl``: ``{"input": "a,b,c", "output": "t"}``)."""

    name = "countdown"
    data_file = "countdown/countdown_cd3_test.jsonl"
    hub_id = "github:dllm-reasoning/d1 dataset/countdown_cd3_test.jsonl"
    prompt_template = ("Using the numbers {numbers}, each exactly once, and only + - * / and parentheses, "
                       "write an equation that equals {target}. Put the equation inside <answer></answer>.")
    template_fields = ("numbers", "target")

    def make_example(self, idx: int, numbers: list[int], target: int, equation: str | None = None) -> Example:
        fields: dict[str, Any] = {"numbers": numbers, "target": target}
        if equation is not None:
            fields["equation"] = equation
        prompt = self.prompt_template.format(target=target, numbers=",".join(map(str, numbers)))
        return Example(id=idx, prompt=prompt, fields=fields)

    def parse(self, path: Path) -> list[Example]:
        out = []
        for lineno, obj in iter_jsonl(path):
            where = f"{path}:{lineno}"
            raw_in, raw_out = require(obj, "input", where), require(obj, "output", where, (str, int))
            try:
                numbers = [int(x) for x in raw_in.split(",")]
                target = int(raw_out)
            except ValueError:
                raise DataError(f"{where}: input {raw_in!r} / output {raw_out!r} must be integers") from None
            if len(numbers) < 2:
                raise DataError(f"{where}: input {raw_in!r} needs at least 2 numbers")
            out.append(self.make_example(len(out), numbers, target))
        return out

    def reward(self, prompts: Sequence[str], completions: Sequence[str], *, numbers: Sequence[Sequence[int]],
               target: Sequence[int], **_: Any) -> list[float]:
        ps = list(prompts) if prompts is not None and len(prompts) == len(completions) else [None] * len(completions)
        return [countdown_reward(n, t, c, p, self.require_final_answer)
                for n, t, c, p in zip(numbers, target, completions, ps)]

    @staticmethod
    def target(ex: Example) -> str:
        """The SFT target completion: the solver's equation."""
        eq = ex.fields.get("equation")
        if eq is None:
            eq = solve(ex.fields["numbers"], ex.fields["target"])
        if eq is None:
            raise ValueError(f"countdown row {ex.id}: no equation reaches {ex.fields['target']}")
        return eq

    def generate(self, n: int, seed: int, exclude: Iterable[tuple[tuple[int, ...], int]] = (),
                 low: int = 1, high: int = 99) -> list[Example]:
        """``n`` solvable 3-number problems with a solver-made equation, none in ``exclude``.

        ``exclude`` holds ``(sorted numbers, target)`` keys (see :meth:`instance_key`); pass the test
        file's rows. Randomness comes from ``random.Random(seed)`` only.
        """
        rng = random.Random(seed)
        banned = set(exclude)
        out: list[Example] = []
        while len(out) < n:
            numbers = [rng.randint(low, high) for _ in range(3)]
            values = [(s, v) for s, v in _expressions(numbers) if v.denominator == 1 and 1 <= v <= high]
            if not values:
                continue
            _, v = rng.choice(values)
            target = int(v)
            if (tuple(sorted(numbers)), target) in banned:
                continue
            out.append(self.make_example(len(out), numbers, target, solve(numbers, target)))
        return out

    @staticmethod
    def instance_key(ex: Example) -> tuple[tuple[int, ...], int]:
        return tuple(sorted(ex.fields["numbers"])), int(ex.fields["target"])
