"""The task protocol: a data loader, a prompt template and a reward (docs/architecture.md, docs/spec.md §5).

A task turns rows of a data file into :class:`Example` records and scores completions with
``reward(prompts, completions, **columns) -> list[float]`` -- the call shape TRL reward functions
use, so user rewards plug in unchanged. Training reward and evaluation metric are the same function.
"""
from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterator, Mapping, Sequence

from maskrl.files import not_utf8
from maskrl.registry import Registry

TASKS: Registry[type["Task"]] = Registry("task")


class DataError(ValueError):
    """A malformed data row; the message names the file and the 1-based line (or row) number."""


@dataclass(frozen=True)
class Example:
    """One task row.

    Attributes:
        id: 0-based row index in the task's data file (what ``maskrl score`` predictions refer to).
        prompt: the user-facing prompt text (no chat template applied).
        fields: task-specific columns passed to :meth:`Task.reward` as keywords (e.g. ``solution``).
    """

    id: int
    prompt: str
    fields: Mapping[str, Any] = field(default_factory=dict)


def default_data_dir() -> Path | None:
    """Where the shared data lives: ``$MASKRL_DATA_DIR``, else a ``shared/data`` folder beside the
    checkout (``<repo>/../shared/data``) or beside the working directory; ``None`` when absent."""
    env = os.environ.get("MASKRL_DATA_DIR")
    if env:
        return Path(env)
    repo_root = Path(__file__).resolve().parents[3]
    for cand in (repo_root.parent / "shared" / "data", Path.cwd().parent / "shared" / "data", Path.cwd() / "shared" / "data"):
        if cand.is_dir():
            return cand
    return None


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSONL file (gzip-compressed when
    the name ends in ``.gz``).

    Raises:
        DataError: naming file and line for a line that is not a JSON object, or the file when it
            is not readable UTF-8 / gzip.
        FileNotFoundError: when the file does not exist.
    """
    opener = gzip.open if Path(path).suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
                if not isinstance(obj, dict):
                    raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
                yield lineno, obj
    except UnicodeDecodeError as e:
        raise DataError(not_utf8(path, e)) from None
    except (OSError, EOFError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise DataError(f"{path}: cannot read ({e})") from None


def require(obj: Mapping[str, Any], key: str, where: str, kind: type | tuple[type, ...] = str) -> Any:
    """``obj[key]`` checked for presence and type; ``where`` is ``"file:line"`` for the error.

    Raises:
        DataError: naming ``where`` and the missing or mistyped field.
    """
    if key not in obj:
        raise DataError(f"{where}: missing field {key!r}")
    val = obj[key]
    if not isinstance(val, kind):
        raise DataError(f"{where}: field {key!r} should be {kind}, got {type(val).__name__}")
    return val



def format_fields(template: str) -> list[str]:
    """Every replacement field of a ``str.format`` template as written (``"{a.b}{}"`` -> ``a.b``, ``""``).

    Raises:
        ValueError: unbalanced braces.
    """
    import string

    return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]


def field_root(field: str) -> str:
    """The top-level name of a replacement field (``"row.x"`` / ``"row[0]"`` -> ``row``)."""
    return field.split(".")[0].split("[")[0]

class Task:
    """Base class of every task. Subclasses set ``name``, ``data_file`` (relative to the data dir),
    ``hub_id`` (public dataset id for users with hub access) and implement :meth:`parse` and
    :meth:`reward`.
    """

    name: ClassVar[str] = ""
    data_file: ClassVar[str] = ""
    hub_id: ClassVar[str] = ""
    #: a completion counts as correct (accuracy) when its reward reaches this value
    correct_threshold: ClassVar[float] = 1.0
    #: ``str.format`` template of the prompt; subclasses name their placeholders in ``template_fields``
    prompt_template: str = ""
    template_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, prompt_template: str | None = None, require_final_answer: bool = False) -> None:
        """Args:
            prompt_template: replaces the task's default template (e.g. a compact one for a
                character-level model). Must contain every placeholder in ``template_fields``.
            require_final_answer: score 0 for a completion cut off before any final answer (its
                reasoning was opened and never closed and it has no ``<answer>`` span; see
                :func:`maskrl.tasks.extract.final_part`), and read only an explicit final answer
                (no last-number fallback in the math tasks). Off by default: evaluation grades
                whatever the text holds. A training option (``task.require_final_answer``) so a
                policy is not rewarded for an answer it never stated.

        Raises:
            ValueError: naming a missing placeholder.
        """
        if prompt_template:
            missing = [f for f in self.template_fields if "{" + f + "}" not in prompt_template]
            if missing:
                raise ValueError(f"task {self.name!r}: prompt_template lacks placeholder(s) "
                                 f"{', '.join('{' + m + '}' for m in missing)}")
            if self.template_fields:  # a fixed set of fields: any other placeholder could never be filled
                try:
                    used = format_fields(prompt_template)
                except ValueError as e:  # unbalanced braces
                    raise ValueError(f"task {self.name!r}: prompt_template {prompt_template!r} is not a valid "
                                     f"str.format template ({e}); write a literal brace as {{{{ or }}}}") from None
                unknown = [f for f in used if field_root(f) not in self.template_fields]
                if unknown:
                    raise ValueError(f"task {self.name!r}: prompt_template has unknown placeholder(s) "
                                     f"{', '.join('{' + u + '}' for u in unknown)}; available: "
                                     f"{', '.join('{' + f + '}' for f in self.template_fields)}")
            self.prompt_template = prompt_template
        self.require_final_answer = bool(require_final_answer)

    def resolve_path(self, path: str | os.PathLike | None = None) -> Path:
        """The data file: ``path`` when given (a file, or a data dir holding ``data_file``), else the
        default data dir.

        Raises:
            FileNotFoundError: when no file can be found; the message says where it looked.
        """
        if path is not None:
            p = Path(path)
            if p.is_dir():
                p = p / self.data_file
        else:
            root = default_data_dir()
            if root is None:
                raise FileNotFoundError(
                    f"task {self.name!r}: no data path given, $MASKRL_DATA_DIR unset and no ../shared/data "
                    f"found; put {self.data_file} in a data folder and set $MASKRL_DATA_DIR to it, or pass the "
                    f"file (where to get it: docs/data.md; {self.hub_id!r})"
                )
            p = root / self.data_file
        if not p.is_file():
            raise FileNotFoundError(f"task {self.name!r}: data file {p} does not exist")
        return p

    def load(self, path: str | os.PathLike | None = None, limit: int | None = None) -> list[Example]:
        """Read and validate the data file into examples (ids are 0-based row indices).

        Raises:
            DataError: on a malformed row, naming file and line; on a file that is not UTF-8 text,
                naming the file and the first bad byte (whichever task's :meth:`parse` read it).
        """
        p = self.resolve_path(path)
        try:
            rows = self.parse(p)
        except UnicodeDecodeError as e:
            raise DataError(not_utf8(p, e)) from None
        return rows[:limit] if limit is not None else rows

    def parse(self, path: Path) -> list[Example]:  # pragma: no cover - abstract
        raise NotImplementedError

    def reward(self, prompts: Sequence[str], completions: Sequence[str], **columns: Sequence[Any]) -> list[float]:
        """Score each completion in ``[0, 1]``; ``columns`` hold one list per row field."""
        raise NotImplementedError  # pragma: no cover - abstract

    def score_examples(self, examples: Sequence[Example], completions: Sequence[str]) -> list[float]:
        """:meth:`reward` on examples: gathers their fields into per-column lists."""
        if len(examples) != len(completions):
            raise ValueError(f"{len(examples)} examples but {len(completions)} completions")
        keys = sorted({k for ex in examples for k in ex.fields})
        columns = {k: [ex.fields.get(k) for ex in examples] for k in keys}
        return self.reward([ex.prompt for ex in examples], list(completions), **columns)

    def is_correct(self, reward):
        """Whether ``reward`` reaches :attr:`correct_threshold` (1e-9 tolerance): a float gives a
        bool, a ``[N]`` float tensor a ``[N]`` bool tensor (the same rule, elementwise)."""
        return reward >= self.correct_threshold - 1e-9

    def metrics(self, examples: Sequence[Example], completions: Sequence[str], rewards: Sequence[float]) -> dict:
        """Summary metrics; tasks add their own (e.g. Sudoku's ``cell_accuracy``)."""
        from maskrl.stats import accuracy_summary

        return accuracy_summary(list(rewards), [self.is_correct(r) for r in rewards])


def get_task(name: str, prompt_template: str | None = None, **options: Any) -> Task:
    """Instantiate the registered task ``name`` (optionally with another prompt template).

    Args:
        options: keyword options of the task's constructor (e.g. ``require_final_answer=True``).

    Raises:
        KeyError: listing the valid task names.
    """
    import maskrl.tasks  # noqa: F401  (registers the built-in tasks)

    cls = TASKS.get(name)
    if prompt_template:
        options["prompt_template"] = prompt_template
    return cls(**options)
