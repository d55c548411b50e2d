"""Bring your own data and reward (issue 23): the ``file`` task over any JSONL / CSV file or local
``datasets`` folder, from YAML alone.

Rows are read as written (:mod:`maskrl.tasks.rows`: every CSV cell is its text, a JSON number keeps
the text it was written with) or, for a folder, through Hugging Face ``datasets.load_from_disk``; the prompt is ``task.prompt_template`` formatted over the row's columns; every
column is passed to the reward; the reward is a function named ``module:function`` (a dotted module
or a ``.py`` file) in TRL's call shape::

    def reward(prompts: list[str], completions: list[str], **columns) -> list[float]: ...

``columns`` holds one list per column of the rows (``answer=[...]``, ...), as TRL's ``GRPOTrainer``
passes dataset columns to its reward functions. Without a reward function the reward is exact match:
1.0 when the completion, stripped, equals the answer column's text, else 0.0. Accuracy counts rewards
>= 1 (:attr:`Task.correct_threshold`).
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from maskrl.tasks.base import TASKS, DataError, Example, Task, field_root, format_fields

#: suffixes read as JSON lines / CSV; anything else must be a ``save_to_disk`` folder
JSON_SUFFIXES, CSV_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz"), (".csv", ".csv.gz")


def load_reward(spec: str, key: str = "task.file.reward") -> Callable[..., Sequence[float]]:
    """The function ``spec`` names: ``"package.module:function"`` or ``"path/to/file.py:function"``.

    Raises:
        ValueError: naming ``key`` when ``spec`` has no ``:``, the module cannot be imported, it has no
            such attribute, or the attribute is not callable.
    """
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{key}: {spec!r} is not of the form 'module:function' or 'file.py:function'")
    try:
        if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
            path = Path(module_name).expanduser().resolve()
            name = f"maskrl_user_reward_{abs(hash(str(path)))}"
            if name not in sys.modules:
                if not path.is_file():
                    raise FileNotFoundError(f"no file {path}")
                if path.suffix != ".py":  # importlib finds no loader for it
                    raise ImportError(f"{path} is not a Python file (.py)")
                mod_spec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(mod_spec)
                mod_spec.loader.exec_module(module)
                sys.modules[name] = module
            module = sys.modules[name]
        else:
            module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's module's, named here
        raise ValueError(f"{key}: cannot import {module_name!r} ({type(e).__name__}: {e})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{key}: {module_name!r} has no function {attr!r}")
    return fn


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Every row of a JSONL / JSON / CSV file or a ``datasets`` ``save_to_disk`` folder (one split), as dicts.

    CSV cells are their text and JSON numbers keep their written text (:mod:`maskrl.tasks.rows`: ``007``,
    ``0.50``, ``NA``, ``None``, ``null``, empty cells are read as written); a ``datasets`` folder's
    columns keep the types they were saved with.

    Raises:
        FileNotFoundError: no such file or folder.
        DataError: an unreadable file (file and line named), or a folder holding a ``DatasetDict``
            (the message lists its splits) or no dataset.
    """
    from maskrl.tasks.rows import read_csv_rows, read_json_rows

    p = Path(path)
    name = p.name.lower()
    if p.is_dir():
        return _read_folder(p)
    if not p.is_file():
        raise FileNotFoundError(f"no data file or folder {p}")
    if name.endswith(JSON_SUFFIXES):
        rows = read_json_rows(p)
    elif name.endswith(CSV_SUFFIXES):
        rows = read_csv_rows(p)
    else:
        raise DataError(f"{p}: unknown format (expected {', '.join(JSON_SUFFIXES + CSV_SUFFIXES)} or a "
                        "datasets save_to_disk folder)")
    if not rows:
        raise DataError(f"{p}: no rows")
    return rows


def _read_folder(p: Path) -> list[dict[str, Any]]:
    """The rows of a ``datasets`` ``save_to_disk`` folder holding one ``Dataset``.

    Raises:
        DataError: a ``DatasetDict`` (its splits listed), a folder ``datasets`` cannot read, no rows.
    """
    try:
        import datasets
    except ImportError:
        raise ImportError("the file task reads datasets folders through `datasets`: pip install 'maskrl[data]'") from None
    try:
        ds = datasets.load_from_disk(str(p))
    except Exception as e:  # noqa: BLE001 - datasets' own errors, one line naming the folder
        from maskrl.files import first_line

        raise DataError(f"{p}: not a datasets save_to_disk folder ({first_line(e)})") from None
    if isinstance(ds, datasets.DatasetDict):
        raise DataError(f"{p}: a DatasetDict with splits {', '.join(ds)}; give one split's folder, "
                        f"e.g. {p / next(iter(ds))}")
    rows = ds.to_list()
    if not rows:
        raise DataError(f"{p}: no rows")
    return rows


def template_fields(template: str) -> list[str]:
    """The top-level field names of a ``str.format`` template (``"{question} [{id}]"`` -> question, id)."""
    return [field_root(f) for f in format_fields(template) if f]


@TASKS.register("file")
class FileTask(Task):
    """Any JSONL / CSV file or ``datasets`` folder with a prompt template, an answer column and a reward.

    Args:
        prompt_template: ``str.format`` template over the row's columns (required), e.g.
            ``"Question: {question}\\nAnswer:"``.
        require_final_answer: kept for the :class:`Task` interface; the reward function decides.
        train: the training rows (file or folder); ``maskrl train`` / ``sft`` read them.
        answer: the answer column (required in every row; the SFT target and a reward column).
        reward: ``module:function`` or ``file.py:function`` in TRL's shape; empty = exact match with
            the answer column.
        target: ``str.format`` template of the SFT target over the columns; empty = the answer column.

    Raises:
        ValueError: a reward that cannot be imported (named); reading rows without a prompt template.
    """

    name = "file"

    def __init__(self, prompt_template: str | None = None, require_final_answer: bool = False, *, train: str = "",
                 answer: str = "answer", reward: str = "", target: str = "") -> None:
        super().__init__(prompt_template, require_final_answer)
        self.train_path, self.answer, self.target_template = train, answer, target or "{" + answer + "}"
        self.reward_spec = reward
        self.reward_fn = load_reward(reward) if reward else None
        self._target_option = target

    def card_options(self) -> dict[str, str]:
        """The constructor options a saved model's prompt card keeps (``task.file``: train rows, answer
        column, reward, target), so ``maskrl eval --task file`` scores it as it was trained."""
        return {"train": str(self.train_path), "answer": self.answer, "reward": self.reward_spec,
                "target": self._target_option}

    def resolve_path(self, path=None) -> Path:
        """``path`` itself (a file or a ``datasets`` folder); there is no default data file.

        Raises:
            FileNotFoundError: ``path`` is empty or does not exist.
        """
        if path is None or str(path) == "":
            raise FileNotFoundError("task file: no evaluation file; set task.data_path to a JSONL / CSV file or "
                                    "datasets folder (and task.file.train to the training rows)")
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"task file: {p} does not exist")
        return p

    def parse(self, path: Path) -> list[Example]:
        """Rows -> examples: prompt from the template, every column in ``fields``.

        Raises:
            DataError: a row lacking the answer column or a template column, or one the template cannot
                format (file and 1-based row named).
        """
        if not self.prompt_template:
            raise ValueError("task.prompt_template: the file task needs a template over the data's columns, "
                             "e.g. 'Question: {question}\\nAnswer:'")
        rows = read_rows(path)
        need = list(dict.fromkeys(template_fields(self.prompt_template) + template_fields(self.target_template)
                                  + [self.answer]))
        out = []
        for i, row in enumerate(rows):
            missing = [c for c in need if row.get(c) is None]
            if missing:
                raise DataError(f"{path}: row {i + 1}: no value in column(s) {', '.join(missing)} "
                                f"(columns: {', '.join(row)})")
            try:
                prompt = self.prompt_template.format_map(row)
            except (ValueError, KeyError, IndexError, AttributeError, TypeError) as e:
                raise DataError(f"{path}: row {i + 1}: task.prompt_template {self.prompt_template!r} cannot be "
                                f"filled from this row ({type(e).__name__}: {e}); cells are text, as written "
                                "in the file") from None
            out.append(Example(id=i, prompt=prompt, fields=dict(row)))
        return out

    def train_split(self, path=None) -> list[Example]:
        """The rows of ``task.file.train`` (``path``, the evaluation data path, is not used here).

        Raises:
            FileNotFoundError: ``task.file.train`` is empty or missing.
        """
        if not self.train_path:
            raise FileNotFoundError("task file: set task.file.train to the training rows (JSONL / CSV / datasets folder)")
        return self.load(self.train_path)

    def target(self, ex: Example) -> str:
        """The SFT target completion: ``task.file.target`` over the row (default: the answer column)."""
        return self.target_template.format_map(ex.fields)

    def reward(self, prompts: Sequence[str], completions: Sequence[str], **columns: Sequence[Any]) -> list[float]:
        """The user's reward in TRL's call shape, or exact match with the answer column."""
        if self.reward_fn is None:
            return [float(c.strip() == str(a).strip()) for c, a in zip(completions, columns[self.answer])]
        try:
            out = self.reward_fn(prompts=list(prompts), completions=list(completions), **columns)
        except Exception as e:  # noqa: BLE001 - the user's code: one line naming it, the columns and the error
            kinds = ", ".join(f"{k}: {type(v[0]).__name__}" for k, v in columns.items() if len(v))
            raise ValueError(f"task.file.reward {self.reward_spec!r} raised {type(e).__name__}: {e} (called with "
                             f"{len(completions)} completions; columns {kinds})") from e
        if out is None or isinstance(out, (str, bytes)) or not hasattr(out, "__len__"):
            raise ValueError(f"task.file.reward {self.reward_spec!r} returned {type(out).__name__}, not a list of floats")
        return list(out)
