"""Reading the final answer out of a completion: one set of rules shared by every task (docs/spec.md §5).

Every task that extracts something from a completion (math answers, Countdown equations, Sudoku
grids, JSON values, code) goes through these helpers, so the rules are the same everywhere:

1. **End of text.** Anything after the model's end-of-text token (``<|eot_id|>``, ``<|endoftext|>``,
   ``<|im_end|>``, ``</s>``, ...; :data:`EOS_MARKERS`) is not part of the completion
   (:func:`cut_at_eos`). This matters when a raw, undecoded completion is scored.
2. **The final part.** When the completion marks its answer, only that is graded, never a draft in
   the reasoning (:func:`final_part`): the last ``<answer>`` span (closed or left open by a
   truncated completion) and anything after its ``</answer>``; else the text after the last
   ``</reasoning>``; else (or when that part is blank: the model stopped after its reasoning)
   the whole text. A completion whose reasoning was opened (in the completion,
   or by a prompt that ends inside ``<reasoning>``) and never closed, with no answer span, was cut
   off before any final answer: its kind is ``"cut_off"`` and tasks built with
   ``require_final_answer=True`` score it 0 (the default grades the whole text).
3. **Minus signs.** Minus-like characters (U+2212 minus, en/em dashes, figure dash, small and
   full-width hyphen-minus; :data:`MINUS_CHARS`) are read as ``-`` (:func:`normalize_minus`); in
   JSON only outside strings (:func:`normalize_minus_outside_strings`), whose contents stay as
   written. Code is left as written.
4. **Fences.** A fenced block opens with a line starting with three backticks (optionally a
   language tag) and closes only at a line holding nothing but three backticks (CommonMark); a
   block left open runs to the end of the text. So backticks inside a JSON string or a Python
   string do not end the block (:func:`fenced_blocks`). Tasks try the whole final part as the
   answer before looking for a fence.
5. **Boxes.** ``\\boxed{...}`` content is read with matched braces (:func:`last_boxed`); an answer
   of several values may come one box per value (:func:`final_boxes`).
6. **Spacing inside numbers.** LaTeX spacing commands that group digits (``12\\,345``, ``12\\!345``,
   ``12\\;345``, ``12\\:345``, ``12~345``, ``12\\ 345``) are dropped (:func:`join_digit_groups`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

#: end-of-text markers of the model families maskrl handles (LLaDA / Llama-3, Qwen/Dream, GPT-2, T5)
EOS_MARKERS = ("<|eot_id|>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "<|eos|>", "</s>", "<eos>")
#: characters read as an ASCII minus: minus sign, hyphen, non-breaking hyphen, figure dash, en dash,
#: em dash, small hyphen-minus, full-width hyphen-minus
MINUS_CHARS = "\u2212\u2010\u2011\u2012\u2013\u2014\ufe63\uff0d"
_MINUS_TABLE = str.maketrans({c: "-" for c in MINUS_CHARS})

_ANSWER_OPEN = re.compile(r"<answer>", re.I)
_ANSWER_CLOSE = re.compile(r"</answer>", re.I)
_REASON_OPEN = re.compile(r"<reasoning>", re.I)
_REASON_CLOSE = re.compile(r"</reasoning>", re.I)
# an opening fence: start of a line, optional indentation, ``` and an optional info string
_FENCE_OPEN = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.#-]*)[^\n`]*$", re.M)
_FENCE_CLOSE = re.compile(r"^[ \t]*```[ \t]*$", re.M)
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOX_NOBRACE_RE = re.compile(r"\\boxed\s+([^\s${}]+)")


def normalize_minus(text: str) -> str:
    """``text`` with every character of :data:`MINUS_CHARS` replaced by ``-``."""
    return text.translate(_MINUS_TABLE)


def normalize_minus_outside_strings(text: str) -> str:
    """:func:`normalize_minus` applied outside double-quoted strings only (JSON: ``{"n": −5}`` reads
    as ``{"n": -5}``, while ``"a – b"`` inside a string stays as written). Backslash escapes inside
    strings are honoured."""
    out = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            out.append(ch)
        else:
            if ch == '"':
                in_string = True
            out.append("-" if ch in MINUS_CHARS else ch)
    return "".join(out)


def cut_at_eos(text: str) -> str:
    """``text`` up to its first end-of-text marker (:data:`EOS_MARKERS`); unchanged when it has none."""
    cut = len(text)
    for marker in EOS_MARKERS:
        pos = text.find(marker)
        if 0 <= pos < cut:
            cut = pos
    return text[:cut]


@dataclass(frozen=True)
class FinalPart:
    """What a completion gives as its final answer.

    Attributes:
        kind: ``"answer"`` (a closed ``<answer>`` span), ``"open_answer"`` (an ``<answer>`` span cut
            off before ``</answer>``), ``"after_reasoning"`` (no span; text after ``</reasoning>``),
            ``"untagged"`` (no tags: the whole text), ``"no_final_text"`` (the answer span, or the
            text after ``</reasoning>``, is blank -- the model stopped after its reasoning: the
            whole text is graded, as there is no stated answer to prefer) or ``"cut_off"``
            (reasoning opened and never closed, no span: no final answer; ``text`` is then the
            whole completion).
        text: the final part: span content plus anything after ``</answer>`` (kinds ``answer`` and
            ``open_answer``), the text after ``</reasoning>``, or the whole text.
        span: the content of the answer span alone (``None`` without a span).
    """

    kind: str
    text: str
    span: str | None = None

    @property
    def is_cut_off(self) -> bool:
        return self.kind == "cut_off"


def _prompt_opens_reasoning(prompt: str | None) -> bool:
    """True when ``prompt`` ends with an open ``<reasoning>`` tag (the model continues inside it)."""
    return isinstance(prompt, str) and prompt.rstrip().lower().endswith("<reasoning>")


def final_part(completion: str, prompt: str | None = None, minus: bool = True) -> FinalPart:
    """The final part of a completion (rule 2 of the module docstring), after :func:`cut_at_eos`
    and :func:`normalize_minus`.

    Args:
        completion: the completion text (a non-string is treated as ``""``).
        prompt: the prompt it continues; when it ends with an open ``<reasoning>`` tag, a completion
            without ``</reasoning>`` or an answer span counts as cut off.
        minus: apply :func:`normalize_minus` (off for JSON and code, whose string literals must
            stay as written).
    """
    text = cut_at_eos(completion if isinstance(completion, str) else "")
    if minus:
        text = normalize_minus(text)
    opens = list(_ANSWER_OPEN.finditer(text))
    if opens:
        start = opens[-1].end()
        close = _ANSWER_CLOSE.search(text, start)
        if close is None:
            span = text[start:]
            if span.strip():
                return FinalPart("open_answer", span, span)
        else:
            span, tail = text[start:close.start()], text[close.end():]
            if span.strip() or tail.strip():
                return FinalPart("answer", span + "\n" + tail, span)
        return FinalPart("no_final_text", text)
    closes = list(_REASON_CLOSE.finditer(text))
    if closes:
        after = text[closes[-1].end():]
        return FinalPart("after_reasoning", after) if after.strip() else FinalPart("no_final_text", text)
    if _REASON_OPEN.search(text) or _prompt_opens_reasoning(prompt):
        return FinalPart("cut_off", text)
    return FinalPart("untagged", text)


@dataclass(frozen=True)
class Fence:
    """A fenced block: ``lang`` is the lower-cased info word (``""`` when none), ``body`` its content,
    ``closed`` whether a closing fence line was found."""

    lang: str
    body: str
    closed: bool


def fenced_blocks(text: str) -> list[Fence]:
    """Every fenced block of ``text`` in order (rule 4 of the module docstring).

    A block opens at a line that starts with three backticks and closes at the next line holding
    only three backticks; an unclosed block runs to the end of the text.
    """
    out: list[Fence] = []
    pos = 0
    while True:
        m = _FENCE_OPEN.search(text, pos)
        if m is None:
            return out
        body_start = m.end() + 1 if m.end() < len(text) else m.end()
        close = _FENCE_CLOSE.search(text, body_start)
        if close is None:
            out.append(Fence(m.group(1).lower(), text[body_start:], False))
            return out
        out.append(Fence(m.group(1).lower(), text[body_start:close.start()], True))
        pos = close.end()


def _balanced(text: str, open_idx: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_idx`` (``\\{``/``\\}`` escapes skipped), or None."""
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


def final_boxes(text: str, n: int, max_gap: int = 40) -> list[str] | None:
    """The contents of the last ``n`` closed top-level ``\\boxed{}`` of ``text`` when they read as one
    answer given one box per value (``the roots are \\boxed{2} and \\boxed{5}``): each two
    consecutive boxes are separated by at most ``max_gap`` characters holding at most one line break.
    ``None`` when ``n < 2``, when ``text`` has fewer than ``n`` boxes, or when a gap is longer.
    """
    if n < 2:
        return None
    boxes: list[tuple[int, int, str]] = []  # (start, end after "}", content), top level only
    pos = 0
    for m in _BOX_RE.finditer(text):
        if m.start() < pos:
            continue  # inside an earlier box
        end = _balanced(text, m.end() - 1)
        if end is None:
            continue
        boxes.append((m.start(), end + 1, text[m.end():end].strip()))
        pos = end + 1
    if len(boxes) < n:
        return None
    last = boxes[-n:]
    for (_, end, _), (start, _, _) in zip(last, last[1:]):
        gap = text[end:start]
        if len(gap) > max_gap or gap.count("\n") > 1:
            return None
    return [c for _, _, c in last]


_DIGIT_SPACE_RE = re.compile(r"(?<=\d)\s*(?:\\[,!;: ]|~)\s*(?=\d{3}(?!\d))")


def join_digit_groups(text: str) -> str:
    """``text`` without LaTeX spacing commands between digit groups (rule 6): ``\\,`` ``\\!`` ``\\;``
    ``\\:`` ``~`` and ``\\`` + space followed by exactly three digits (``12\\,345`` -> ``12345``,
    ``1\\,234\\,567`` -> ``1234567``); ``3\\,x`` or ``1\\,23`` are left as written."""
    return _DIGIT_SPACE_RE.sub("", text)


def last_boxed(text: str, allow_unclosed: bool = False) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``.

    Braces are matched, so ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``; a box whose only content
    is another box is unwrapped. Also reads ``\\boxed 5`` (no braces). An unclosed box (a truncated
    completion) is ignored unless ``allow_unclosed``, when it yields the text after it up to the
    end of its line. Returns ``None`` when there is no box.
    """
    best: tuple[int, str] | None = None
    for m in _BOX_RE.finditer(text):
        end = _balanced(text, m.end() - 1)
        if end is not None:
            best = (m.start(), text[m.end():end])
        elif allow_unclosed:
            best = (m.start(), text[m.end():].split("\n", 1)[0])
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
