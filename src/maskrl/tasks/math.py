"""GSM8K and MATH-500 (docs/spec.md §5): a final answer checked for equivalence with math-verify.

Reward (training reward = evaluation metric): 1.0 when the answer extracted from the completion is
equivalent to the gold answer according to math-verify, with numbers compared relatively at every
magnitude (:func:`maskrl.mathverify.math_equal`: ``0.0000673`` is not ``.0000672``), else 0.0. Extraction (:func:`extract_answer`)
reads the completion's final part (the ``<answer>`` span, else the text after ``</reasoning>``, else
the whole text; rules shared by all tasks in :mod:`maskrl.tasks.extract`) and takes, in order: the
last ``\\boxed{...}`` (nested braces handled), the text after the last ``####``, then for GSM8K the
last number and for MATH-500 the whole stated answer (:func:`answer_span`: never its last number,
so ``\\sqrt{2}`` is not ``2``); words around a value and a closing period are dropped
(:func:`clean_answer`). Empty or unreadable completions score 0.0
and never raise. ``answer_form="strict"`` adds the MATH-style form check (:func:`form_matches`).
math-verify runs in worker processes with a hard per-item timeout (:mod:`maskrl.mathverify`); a
hung or crashed comparison scores 0.0.

Departures from common practice, on purpose: GSM8K is also graded on the ``\\boxed{}`` answer the
prompt asks for (``####`` and the last number are fallbacks), and MATH-500 also accepts an unboxed
stated answer (``####``, the ``<answer>`` span, the last line), so both tasks share one extractor.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from maskrl.mathverify import DEFAULT_TIMEOUT_S, VerifyPool, math_equal, verify_many
from maskrl.tasks.base import TASKS, DataError, Example, Task, iter_jsonl, require
from maskrl.tasks.extract import FinalPart, final_boxes, final_part, join_digit_groups, last_boxed, normalize_minus

#: answers longer than this (characters) are not sent to math-verify; they score 0.0
MAX_ANSWER_CHARS = 1000

PROMPT_TEMPLATE = (
    "{problem}\n\n"
    "Solve the problem step by step. Write your reasoning between <reasoning> and </reasoning>, "
    "then give only the final answer in \\boxed{{}} between <answer> and </answer>."
)
TARGET_TEMPLATE = "<reasoning>\n{reasoning}\n</reasoning>\n<answer>\n\\boxed{{{answer}}}\n</answer>"

# a number: thousands-grouped or plain digits, optional decimals, optional sign
_NUMBER_RE = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<![\w.])-?\.\d+")
_LEADING_NUMBER_RE = re.compile(r"\s*\$?\s*(-?\s*\$?\s*(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)")
_WORD_RE = re.compile(r"[A-Za-z]{2,}")
_DECIMAL_RE = re.compile(r"\d\.\d|(?<!\d)\.\d")
_MIXED_NUMBER_RE = re.compile(r"\d\s*\\[dt]?frac|\d\s+\d+\s*/\s*\d+")
_INT_FRACTION_RE = re.compile(r"\\[dt]?frac\{(\d+)\}\{(\d+)\}|(?<![\d.])(\d+)/(\d+)(?![\d.])")
_CALC_RE = re.compile(r"<<[^<>]*>>")
# a sentence's closing period (one, not an ellipsis), possibly followed by LaTeX spacing
_TRAILING_PERIOD_RE = re.compile(r"(?<![.\\])\.(?:\s|\\[,;:! ]|~)*$")
# a phrase announcing the answer ("The final answer is", "Answer:")
_ANSWER_PHRASE_RE = re.compile(r"\b(?:final\s+)?answer\s*(?:is|:|=)\s*(?::\s*)?", re.I)
# the whole text in one pair of math delimiters ($...$, $$...$$, \(...\), \[...\]), a period after it allowed
_DELIMITED_RE = re.compile(r"^\s*(?:\$\$?([^$]+)\$\$?|\\\((.+?)\\\)|\\\[(.+?)\\\])\s*\.?\s*$", re.S)

#: the ways :class:`MathTask` can compare answers (``answer_form``)
ANSWER_FORMS = ("value", "strict")


def last_number(text: str) -> str | None:
    """The last number in ``text`` with thousands separators removed (``"1,000.5"`` -> ``"1000.5"``);
    minus-like characters count as a minus sign (``"−10"`` -> ``"-10"``)."""
    found = _NUMBER_RE.findall(normalize_minus(text))
    return found[-1].replace(",", "") if found else None


def after_hashes(text: str, whole: bool = False) -> str | None:
    """The answer after the last ``####`` (GSM8K style), or ``None``.

    Takes the rest of that line; plain text gives its first number (``"#### $1,000 total"`` ->
    ``"1,000"``, ``"#### −10"`` -> ``"-10"``), text holding LaTeX (a backslash) is returned whole,
    trailing ``.`` and ``$`` dropped. With ``whole`` (MATH-500's rule) the rest of the line is the
    answer whatever it holds (``"#### 3/4"`` -> ``"3/4"``, not ``"3"``).
    """
    text = normalize_minus(text)
    pos = text.rfind("####")
    if pos < 0:
        return None
    seg = text[pos + 4:].strip().split("\n", 1)[0].strip()
    if "\\" in seg or whole:
        return seg.strip(" .$") or None
    found = _NUMBER_RE.search(seg)
    if found:
        return found.group(0)
    return seg.strip(" .$") or None


def clean_answer(answer: str) -> str:
    """An extracted answer without the words around its value.

    * Plain text (no LaTeX command) holding words: the number it starts with
      (``"240 sheets per month"`` -> ``"240"``, ``"2:00 pm"`` -> ``"2"``, ``"$18 dollars"`` -> ``"18"``),
      else its only number (``"She needs 6"`` -> ``"6"``); otherwise unchanged (``"x = 5 or x = -3"``).
    * LaTeX is left to math-verify, which reads units in ``\\text{}`` itself.
    Minus-like characters become ``-`` first, LaTeX spacing between digit groups is dropped
    (``12\\,345`` -> ``12345``; :func:`maskrl.tasks.extract.join_digit_groups`), and a sentence's
    closing period is not part of the answer (``18.`` -> ``18``, ``\\frac{1}{2}.`` -> ``\\frac{1}{2}``;
    ``\\ldots`` and ``...`` are kept).
    """
    ans = _TRAILING_PERIOD_RE.sub("", join_digit_groups(normalize_minus(answer).strip()))
    if "\\" not in ans:
        if not _WORD_RE.search(ans):
            return ans
        lead = _LEADING_NUMBER_RE.match(ans)
        if lead:
            return re.sub(r"[\s$]", "", lead.group(1))
        nums = _NUMBER_RE.findall(ans)
        return nums[0] if len(nums) == 1 else ans
    return ans


def _plain(s: str) -> str:
    """``s`` without what MATH's answer check ignores (dollar signs, percent and degree signs, thin
    spaces, a trailing ``\\text{ unit}``), spaces and thousands commas (for :func:`form_matches`)."""
    s = re.sub(r"\\(?:text|mbox|mathrm)\s*\{[^{}]*\}(?:\^\{?\d\}?)?\s*$", "", s.strip())
    for junk in ("\\$", "$", "\\%", "%", "^{\\circ}", "^\\circ", "\\!", "\\,", " "):
        s = s.replace(junk, "")
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)


def form_matches(gold: str, answer: str, question: str = "") -> bool:
    """The stricter MATH-style reading (``answer_form="strict"``): an answer equal in value must
    also be in the form the problem asks for.

    False when
    * the answer writes a decimal (``15.975``, ``36.00``) and the gold answer has none
      (``\\frac{639}{40}``, ``\\$36``): an approximation or a decimal where an exact form is given;
    * the gold answer is an integer and the answer is not a bare integer (``\\frac{6}{3}``,
      ``7! \\times 2!`` for ``10,\\!080``): left unevaluated;
    * the answer holds a fraction of integers not in lowest terms (``\\frac{3}{24}``, ``8/18``);
    * the question asks for a common fraction and the answer is a mixed number (``2\\frac{1}{2}``).
    """
    answer = normalize_minus(answer)
    if _DECIMAL_RE.search(answer) and not _DECIMAL_RE.search(gold):
        return False
    if re.fullmatch(r"-?\d+", _plain(gold)) and not re.fullmatch(r"-?\d+", _plain(answer)):
        return False
    for m in _INT_FRACTION_RE.finditer(answer.replace(" ", "")):
        a, b = int(m.group(1) or m.group(3)), int(m.group(2) or m.group(4))
        if b and math.gcd(a, b) > 1:
            return False
    if "common fraction" in question.lower() and _MIXED_NUMBER_RE.search(answer):
        return False
    return True


_THOUSANDS_COMMA_RE = re.compile(r"(?<=\d),(?:\\!)?(?=\d{3}(?!\d))")


def value_count(gold: str) -> int:
    """How many values a gold answer lists: its top-level comma-separated parts (commas inside
    ``()``, ``[]``, ``{}`` and thousands separators such as ``12,\\!345`` or ``1,000`` do not count).
    ``"2, 5"`` -> 2, ``"(1, 2)"`` -> 1, ``"\\frac{1}{2}, -3, 4"`` -> 3, ``"10,\\!080"`` -> 1."""
    text = _THOUSANDS_COMMA_RE.sub("", gold if isinstance(gold, str) else "")
    depth, parts = 0, 1
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts += 1
    return parts


def _undelimited(text: str) -> str | None:
    """The inside of ``text`` when all of it is one formula in math delimiters (a period after it allowed)."""
    m = _DELIMITED_RE.match(text)
    return None if m is None else next(g for g in m.groups() if g is not None).strip()


def answer_span(part: FinalPart) -> str:
    """The stated final answer of a completion's final part, whole (MATH-500's rule when it has no
    ``\\boxed{}`` and no ``####``), never its last number.

    The ``<answer>`` span (else the text after ``</reasoning>``, else the whole text) when it is one
    formula in math delimiters (``$...$``, ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``); else its last
    non-blank line, after its last "answer is" / "Answer:" phrase, out of one pair of delimiters.
    ``<answer>1/3</answer>`` -> ``1/3``, ``So the answer is $2\\pi$.`` -> ``2\\pi``, ``\\sqrt{2}`` ->
    ``\\sqrt{2}``."""
    text = part.span if part.span is not None and part.span.strip() else part.text
    whole = _undelimited(text)
    if whole is not None:
        return whole
    lines = [line for line in text.splitlines() if line.strip()]
    text = lines[-1] if lines else ""
    phrases = list(_ANSWER_PHRASE_RE.finditer(text))
    if phrases and text[phrases[-1].end():].strip():
        text = text[phrases[-1].end():]
    inner = _undelimited(text)
    return (text if inner is None else inner).strip()


def extract_answer(completion: str | None, prompt: str | None = None,
                   require_final_answer: bool = False, n_values: int = 1, whole_span: bool = False) -> str | None:
    """The final answer of a completion.

    Reads the completion's final part (:func:`maskrl.tasks.extract.final_part`: the ``<answer>``
    span and what follows it, else the text after ``</reasoning>``, else the whole text; cut at the
    end-of-text token; minus-like characters read as ``-``), and in it: the last ``\\boxed{}``,
    else the text after ``####``, else the last number (of the answer span when it holds one). A
    ``\\boxed{}`` in the reasoning before a stated answer is a draft and is not read. When the gold
    answer lists ``n_values`` > 1 values (:func:`value_count`) and the last box holds fewer, the
    last ``n_values`` boxes written one per value (``\\boxed{2} and \\boxed{5}``,
    :func:`maskrl.tasks.extract.final_boxes`) are read as ``2, 5``. The result goes through
    :func:`clean_answer`.

    With ``require_final_answer``, a completion cut off before any final answer gives ``None``, and
    one without tags must state its answer in a box or after ``####`` (no last-number fallback).

    With ``whole_span`` (MATH-500: answers are expressions, not numbers) the answer is never reduced
    to its last number: without a box it is the whole rest of the ``####`` line, else the whole
    stated answer (:func:`answer_span`), so ``<answer>1/3</answer>``, ``\\sqrt{2}``, ``(1, 2)`` and
    ``2\\pi`` are graded as written (and ``\\sqrt{2}`` is not the answer 2). Plain text with words
    around one number still gives that number (:func:`clean_answer`).

    Returns ``None`` for empty text, text with none of these, or an answer longer than
    :data:`MAX_ANSWER_CHARS`. Never raises (non-string input gives ``None``).
    """
    if not isinstance(completion, str) or not completion.strip():
        return None
    part = final_part(completion, prompt)
    if part.is_cut_off and require_final_answer:
        return None
    region = part.text
    ans = last_boxed(region)
    if ans is not None and n_values > 1 and value_count(ans) < n_values:
        boxes = final_boxes(region, n_values)
        if boxes and all(b and value_count(b) == 1 for b in boxes):
            ans = ", ".join(boxes)
    if ans is None or not ans.strip():
        ans = after_hashes(region, whole=whole_span)
    unstated = part.kind in ("untagged", "no_final_text", "cut_off")
    if (ans is None or not ans.strip()) and not (require_final_answer and unstated):
        if whole_span:
            ans = answer_span(part)
        else:
            ans = (last_number(part.span) if part.span else None) or last_number(region)
    if ans is None or not ans.strip():
        return None
    ans = clean_answer(ans)
    return ans if ans and len(ans) <= MAX_ANSWER_CHARS else None


class MathTask(Task):
    """Shared reward of the math tasks (docs/spec.md §5). Subclasses implement :meth:`parse`.

    Args:
        timeout_s: hard wall-clock limit per verification (seconds); a hung item scores 0.0.
        pool: the :class:`~maskrl.mathverify.VerifyPool` to use (default: the shared pool).
        equal_fn: module-level ``(gold, answer) -> bool`` run in the workers (default math-verify);
            an injection point for tests and custom graders.
        answer_form: ``"value"`` (default): equal in value is right (``15.975`` for
            ``\\frac{639}{40}``); ``"strict"``: the MATH-style reading, the answer must also have the
            form the problem asks for (:func:`form_matches`).
        require_final_answer: see :class:`~maskrl.tasks.base.Task`.

    Raises:
        ValueError: for an unknown ``answer_form``.
    """

    prompt_template = PROMPT_TEMPLATE

    template_fields = ("problem",)
    #: grade the whole stated answer, never its last number (:func:`extract_answer`'s ``whole_span``):
    #: MATH-500's answers are expressions; GSM8K's are numbers, read by the numeric rule
    whole_span: bool = False

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, pool: VerifyPool | None = None,
                 equal_fn: Callable[[str, str], bool] = math_equal, prompt_template: str | None = None,
                 answer_form: str = "value", require_final_answer: bool = False) -> None:
        super().__init__(prompt_template, require_final_answer=require_final_answer)
        if answer_form not in ANSWER_FORMS:
            raise ValueError(f"answer_form must be one of {', '.join(ANSWER_FORMS)}; got {answer_form!r}")
        self.timeout_s = timeout_s
        self.pool = pool
        self.equal_fn = equal_fn
        self.answer_form = answer_form

    def make_example(self, idx: int, problem: str, answer: str, **fields: Any) -> Example:
        return Example(id=idx, prompt=self.prompt_template.format(problem=problem),
                       fields={"answer": answer, **fields})

    def extract(self, prompts: Sequence[str] | None, completions: Sequence[str],
                answer: Sequence[str] | None = None) -> list[str | None]:
        """The answer each completion is graded on (:func:`extract_answer` with this task's options;
        ``answer``, the gold answers, tells how many values each answer lists)."""
        n = len(completions)
        prompts = list(prompts) if prompts is not None and len(prompts) == n else [None] * n
        counts = [value_count(a) for a in answer] if answer is not None and len(answer) == n else [1] * n
        return [extract_answer(c, p, self.require_final_answer, k, self.whole_span)
                for p, c, k in zip(prompts, completions, counts)]

    def reward(self, prompts: Sequence[str], completions: Sequence[str], *, answer: Sequence[str],
               **_: Any) -> list[float]:
        """1.0 where the completion's extracted answer is math-verify-equivalent to ``answer`` (and,
        with ``answer_form="strict"``, in the asked form), else 0.0.

        Raises:
            ValueError: if ``completions`` and ``answer`` differ in length.
        """
        if len(completions) != len(answer):
            raise ValueError(f"{len(completions)} completions but {len(answer)} gold answers")
        extracted = self.extract(prompts, completions, answer)
        rewards = verify_many([join_digit_groups(a) for a in answer], extracted, timeout_s=self.timeout_s, equal_fn=self.equal_fn,
                              pool=self.pool)
        if self.answer_form == "strict":
            qs = list(prompts) if prompts is not None and len(prompts) == len(completions) else [""] * len(completions)
            rewards = [r if r and form_matches(g, a or "", q or "") else 0.0
                       for r, g, a, q in zip(rewards, answer, extracted, qs)]
        return rewards

    @staticmethod
    def target(ex: Example) -> str:
        """The SFT target completion: the reference reasoning, then the boxed answer."""
        return TARGET_TEMPLATE.format(reasoning=ex.fields["solution"], answer=ex.fields["answer"])


@TASKS.register("gsm8k")
class GSM8K(MathTask):
    """GSM8K, openai/grade-school-math JSONL (``{"question", "answer"}``, final answer after ``####``).

    Args:
        split: ``"test"`` (1319 rows, the default) or ``"train"`` (7473 rows).
        **kwargs: see :class:`MathTask`.
    """

    name = "gsm8k"
    data_file = "gsm8k/test.jsonl"
    hub_id = "openai/gsm8k (config main)"

    def __init__(self, split: str = "test", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if split not in ("test", "train"):
            raise ValueError(f"gsm8k split must be 'test' or 'train', got {split!r}")
        self.data_file = f"gsm8k/{split}.jsonl"

    def train_split(self, path: str | Path | None = None) -> list[Example]:
        """The train split (``gsm8k/train.jsonl``, 7473 rows): RL / SFT prompts, never test rows.

        Args:
            path: a data folder holding ``gsm8k/train.jsonl``, the train file itself, the test file
                (its sibling ``train.jsonl`` is read), or ``None`` for the default data dir.

        Raises:
            FileNotFoundError: when the train file does not exist.
            DataError: on a malformed row.
        """
        p = Path(path) if path else None
        if p is not None and p.is_file() and p.name == "test.jsonl":
            p = p.with_name("train.jsonl")
        return GSM8K(split="train", timeout_s=self.timeout_s, pool=self.pool, equal_fn=self.equal_fn,
                     answer_form=self.answer_form, require_final_answer=self.require_final_answer).load(p)

    def parse(self, path: Path) -> list[Example]:
        out = []
        for lineno, obj in iter_jsonl(path):
            where = f"{path}:{lineno}"
            question = require(obj, "question", where)
            full = require(obj, "answer", where)
            if "####" not in full:
                raise DataError(f"{where}: field 'answer' has no '####' final answer")
            reasoning, final = full.rsplit("####", 1)
            final = final.strip()
            if not re.fullmatch(r"-?[\d,]*\.?\d+", final):
                raise DataError(f"{where}: final answer {final!r} after '####' is not a number")
            reasoning = _CALC_RE.sub("", reasoning).strip()
            out.append(self.make_example(len(out), question, final, solution=reasoning))
        return out


@TASKS.register("math500")
class MATH500(MathTask):
    """MATH-500 (PRM800K test split of MATH): JSONL with ``problem``, ``solution``, ``answer``,
    ``subject``, ``level``. Its training rows (:meth:`train_split`) are MATH's train split, which
    MATH-500 does not ship: ``math500/train.jsonl`` beside the test file, in the same format or in
    MATH's own (``problem``, ``solution``, ``level``, ``type``; the answer is the solution's last
    ``\\boxed{}``)."""

    name = "math500"
    whole_span = True
    data_file = "math500/test.jsonl"
    train_file = "math500/train.jsonl"
    hub_id = "HuggingFaceH4/MATH-500"

    def train_split(self, path: str | Path | None = None) -> list[Example]:
        """MATH's train split for RL / SFT prompts (docs/spec.md §4: the DTCA / RLDF MATH recipes train on its
        7,500 problems): ``math500/train.jsonl`` in the data folder. Rows whose problem is one of the
        MATH-500 test problems (when the test file is there) are dropped, with a warning.

        Args:
            path: a data folder holding ``math500/train.jsonl``, the train file itself, the test file
                (its sibling ``train.jsonl`` is read), or ``None`` for the default data dir.

        Raises:
            FileNotFoundError: no train file; the message says where it looked and what to put there.
            DataError: on a malformed row (file and line named).
        """
        p = Path(path) if path else None
        if p is not None and p.is_file() and p.name == "test.jsonl":
            p = p.with_name("train.jsonl")
        train = copy.copy(self)
        train.data_file = self.train_file
        try:
            rows = train.load(p)
        except FileNotFoundError as e:
            raise FileNotFoundError(
                f"{e}. MATH-500 has no training rows of its own: put MATH's train split there as JSONL "
                "(hendrycks/competition_math 'train', 7,500 problems with problem / solution, or PRM800K's "
                "math_splits/train.jsonl with problem / answer), or train on another task's rows") from None
        try:
            test = {ex.prompt for ex in self.load(p.with_name("test.jsonl") if p and p.is_file() else p)}
        except FileNotFoundError:
            return rows
        kept = [ex for ex in rows if ex.prompt not in test]  # one template: the same problem, the same prompt
        if len(kept) < len(rows):
            warnings.warn(f"task 'math500': dropped {len(rows) - len(kept)} training rows whose problem is a "
                          "MATH-500 test problem", stacklevel=2)
        return [dataclasses.replace(ex, id=i) for i, ex in enumerate(kept)]

    def parse(self, path: Path) -> list[Example]:
        out = []
        for lineno, obj in iter_jsonl(path):
            where = f"{path}:{lineno}"
            problem = require(obj, "problem", where)
            if "answer" in obj or "solution" not in obj:
                answer = str(require(obj, "answer", where)).strip()
            else:  # MATH's own format: the answer is the solution's last \boxed{}
                answer = (last_boxed(obj["solution"]) or "").strip()
                if not answer:
                    raise DataError(f"{where}: no field 'answer' and no \\boxed{{}} answer in field 'solution'")
                obj = {**obj, "subject": obj.get("subject", obj.get("type"))}
            if not answer:
                raise DataError(f"{where}: field 'answer' is empty")
            solution = require(obj, "solution", where)
            fields = {"solution": solution, "subject": obj.get("subject"), "level": obj.get("level")}
            if "unique_id" in obj:
                fields["unique_id"] = obj["unique_id"]
            out.append(self.make_example(len(out), problem, answer, **fields))
        return out
