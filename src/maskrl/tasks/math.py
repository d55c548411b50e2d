"""GSM8K and MATH-500 (SPEC §5): a final answer checked for equivalence with math-verify.

Reward (training reward = evaluation metric): 1.0 when the answer extracted from the completion is
equivalent to the gold answer according to math-verify, else 0.0. Extraction (:func:`extract_answer`)
takes, in order: the last ``\\boxed{...}`` (nested braces handled), the text after the last ``####``,
the last number in the completion. Empty or unreadable completions score 0.0 and never raise.
math-verify runs in worker processes with a hard per-item timeout (:mod:`maskrl.mathverify`); a
hung or crashed comparison scores 0.0.

Departures from common practice, on purpose: GSM8K is also graded on the ``\\boxed{}`` answer the
prompt asks for (``####`` and the last number are fallbacks), and MATH-500 also accepts the
``####``/last-number fallbacks, so both tasks share one extractor.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Sequence

from maskrl.mathverify import DEFAULT_TIMEOUT_S, VerifyPool, math_equal, verify_many
from maskrl.tasks.base import TASKS, DataError, Example, Task, iter_jsonl, require

#: answers longer than this (characters) are not sent to math-verify; they score 0.0
MAX_ANSWER_CHARS = 1000

PROMPT_TEMPLATE = (
    "{problem}\n\n"
    "Solve the problem step by step. Write your reasoning between <reasoning> and </reasoning>, "
    "then give only the final answer in \\boxed{{}} between <answer> and </answer>."
)
TARGET_TEMPLATE = "<reasoning>\n{reasoning}\n</reasoning>\n<answer>\n\\boxed{{{answer}}}\n</answer>"

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOX_NOBRACE_RE = re.compile(r"\\boxed\s+([^\s${}]+)")
# a number: thousands-grouped or plain digits, optional decimals, optional sign
_NUMBER_RE = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<![\w.])-?\.\d+")
_CALC_RE = re.compile(r"<<[^<>]*>>")


def _balanced(text: str, open_idx: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_idx`` (``\\{``/``\\}`` escapes ignored), or None."""
    depth = 0
    i = open_idx
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``.

    Braces are matched, so ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``; a box whose only content
    is another box is unwrapped. An unclosed box (a truncated completion) is ignored. Also reads
    ``\\boxed 5`` (no braces). Returns ``None`` when there is no box.
    """
    best: tuple[int, str] | None = None
    for m in _BOX_RE.finditer(text):
        end = _balanced(text, m.end() - 1)
        if end is not None:
            best = (m.start(), text[m.end():end])
    m2 = None
    for m2 in _BOX_NOBRACE_RE.finditer(text):
        pass
    if m2 is not None and (best is None or m2.start() > best[0]):
        best = (m2.start(), m2.group(1))
    if best is None:
        return None
    content = best[1].strip()
    inner = _BOX_RE.match(content)
    while inner is not None and _balanced(content, inner.end() - 1) == len(content) - 1:
        content = content[inner.end():-1].strip()
        inner = _BOX_RE.match(content)
    return content


def last_number(text: str) -> str | None:
    """The last number in ``text`` with thousands separators removed (``"1,000.5"`` -> ``"1000.5"``)."""
    found = _NUMBER_RE.findall(text)
    return found[-1].replace(",", "") if found else None


def after_hashes(text: str) -> str | None:
    """The answer after the last ``####`` (GSM8K style), or ``None``.

    Takes the rest of that line; plain text gives its first number (``"#### $1,000 total"`` ->
    ``"1,000"``), text holding LaTeX (a backslash) is returned whole, trailing ``.`` and ``$`` dropped.
    """
    pos = text.rfind("####")
    if pos < 0:
        return None
    seg = text[pos + 4:].strip().split("\n", 1)[0].strip()
    if "\\" in seg:
        return seg.strip(" .$") or None
    found = _NUMBER_RE.search(seg)
    if found:
        return found.group(0)
    return seg.strip(" .$") or None


def extract_answer(completion: str | None) -> str | None:
    """The final answer of a completion: last ``\\boxed{}``, else after ``####``, else the last number.

    Returns ``None`` for empty text, text with none of these, or an answer longer than
    :data:`MAX_ANSWER_CHARS`. Never raises (non-string input gives ``None``).
    """
    if not isinstance(completion, str) or not completion.strip():
        return None
    for fn in (last_boxed, after_hashes, last_number):
        ans = fn(completion)
        if ans is not None and ans.strip():
            ans = ans.strip()
            return ans if len(ans) <= MAX_ANSWER_CHARS else None
    return None


class MathTask(Task):
    """Shared reward of the math tasks (SPEC §5). Subclasses implement :meth:`parse`.

    Args:
        timeout_s: hard wall-clock limit per verification (seconds); a hung item scores 0.0.
        pool: the :class:`~maskrl.mathverify.VerifyPool` to use (default: the shared pool).
        equal_fn: module-level ``(gold, answer) -> bool`` run in the workers (default math-verify);
            an injection point for tests and custom graders.
    """

    prompt_template = PROMPT_TEMPLATE

    template_fields = ("problem",)

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, pool: VerifyPool | None = None,
                 equal_fn: Callable[[str, str], bool] = math_equal, prompt_template: str | None = None) -> None:
        super().__init__(prompt_template)
        self.timeout_s = timeout_s
        self.pool = pool
        self.equal_fn = equal_fn

    def make_example(self, idx: int, problem: str, answer: str, **fields: Any) -> Example:
        return Example(id=idx, prompt=self.prompt_template.format(problem=problem),
                       fields={"answer": answer, **fields})

    def reward(self, prompts: Sequence[str], completions: Sequence[str], *, answer: Sequence[str],
               **_: Any) -> list[float]:
        """1.0 where the completion's extracted answer is math-verify-equivalent to ``answer``, else 0.0.

        Raises:
            ValueError: if ``completions`` and ``answer`` differ in length.
        """
        if len(completions) != len(answer):
            raise ValueError(f"{len(completions)} completions but {len(answer)} gold answers")
        extracted = [extract_answer(c) for c in completions]
        return verify_many(list(answer), extracted, timeout_s=self.timeout_s, equal_fn=self.equal_fn,
                           pool=self.pool)

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
        return GSM8K(split="train", timeout_s=self.timeout_s, pool=self.pool, equal_fn=self.equal_fn).load(p)

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
    ``subject``, ``level``."""

    name = "math500"
    data_file = "math500/test.jsonl"
    hub_id = "HuggingFaceH4/MATH-500"

    def parse(self, path: Path) -> list[Example]:
        out = []
        for lineno, obj in iter_jsonl(path):
            where = f"{path}:{lineno}"
            problem = require(obj, "problem", where)
            answer = require(obj, "answer", where).strip()
            if not answer:
                raise DataError(f"{where}: field 'answer' is empty")
            solution = require(obj, "solution", where)
            fields = {"solution": solution, "subject": obj.get("subject"), "level": obj.get("level")}
            if "unique_id" in obj:
                fields["unique_id"] = obj["unique_id"]
            out.append(self.make_example(len(out), problem, answer, **fields))
        return out
