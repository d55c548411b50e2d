"""The prompt card of a saved model folder: how the model was prompted and evaluated in training, so
that ``maskrl eval`` / ``generate`` use the same prompt and sampler unless a flag says otherwise."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

from maskrl.files import write_json

if TYPE_CHECKING:
    from maskrl.tasks.base import Task


#: the file in a saved model folder that records how the model was trained to be prompted and evaluated
PROMPT_CARD = "maskrl_prompt.json"


def save_prompt_card(folder: str | Path, task: Task, chat_template: bool, eval_sampler) -> Path:
    """Write ``folder/maskrl_prompt.json``: the task, its prompt template as used in training, whether the
    chat template was applied, and the evaluation sampler (a :class:`~maskrl.sampling.SamplerConfig`).

    ``maskrl eval`` and ``maskrl generate`` read it (:func:`read_prompt_card`) and use it unless a flag
    says otherwise, so a saved model is evaluated the way it was trained (issue 13 item 8).
    """
    path = Path(folder) / PROMPT_CARD
    card = {"task": task.name, "prompt_template": task.prompt_template, "chat_template": bool(chat_template),
            "eval_sampler": dataclasses.asdict(eval_sampler)}
    options = getattr(task, "card_options", None)  # a task built from user options (the file task)
    if options is not None:
        card["task_options"] = options()
    write_json(path, card)
    return path


def read_prompt_card(model) -> dict | None:
    """The :data:`PROMPT_CARD` of a model folder, or ``None`` (no such file, a Hub id, an in-memory model).

    Raises:
        ValueError: the file exists but is not a JSON object with the keys :func:`save_prompt_card` writes.
    """
    if not isinstance(model, (str, Path)):
        return None
    path = Path(model) / PROMPT_CARD
    if not path.is_file():
        return None
    try:
        card = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable ({e})") from None
    need = ("task", "prompt_template", "chat_template", "eval_sampler")
    if not isinstance(card, dict) or any(k not in card for k in need) or not isinstance(card["eval_sampler"], dict):
        raise ValueError(f"{path}: expected an object with keys {', '.join(need)}")
    return card
