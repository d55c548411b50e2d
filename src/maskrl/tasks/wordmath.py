"""``wordmath``: generated arithmetic word problems, a CPU-scale natural-language task (issue 10 item 2)
on which parts of speech mean something at tiny scale (DTCA, docs/spec.md §3).

A problem names a person, an object, a verb and one or two operations (``+``, ``-``, ``×``); the
answer is one short English reasoning sentence and a final number, e.g.::

    Q: Mia has 4 apples. She buys 3 more apples. How many apples does Mia have now?
    A: Mia has 4 + 3 = 7 apples. The answer is 7.

Reward: 1.0 when the completion's final number (``The answer is N``, else its last integer) equals the
answer, else 0. Splits are disjoint by question text: the test split is generated from the fixed
:data:`TEST_SEED` (its content is pinned by a SHA-256 test, and :meth:`WordMath.save_test` writes it
as JSONL), validation from :data:`VALIDATION_SEED` excluding test questions, training from
``task.train_seed`` excluding both. :func:`build_wordmath_tokenizer` trains a small byte-level BPE
tokenizer with ``tokenizers`` on generated text (with the tiny model's special tokens).
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

from maskrl.tasks.base import TASKS, DataError, Example, Task, iter_jsonl, require

TEST_SEED = 20261030
VALIDATION_SEED = 20261031
TEST_SIZE = 500
VALIDATION_SIZE = 500

NAMES = [("Mia", "She", "her"), ("Tom", "He", "his"), ("Ava", "She", "her"), ("Leo", "He", "his"),
         ("Zoe", "She", "her"), ("Sam", "He", "his"), ("Ivy", "She", "her"), ("Max", "He", "his"),
         ("Lily", "She", "her"), ("Ben", "He", "his"), ("Nora", "She", "her"), ("Omar", "He", "his")]
OBJECTS = ["apples", "books", "coins", "cards", "pens", "shells", "stamps", "marbles", "cookies", "stickers"]
GAIN_VERBS = ["buys", "finds", "gets", "picks up", "wins"]
LOSS_VERBS = ["gives away", "loses", "sells", "eats", "drops"]
CONTAINERS = ["bags", "boxes", "jars", "packs", "baskets"]
_ANSWER_RE = re.compile(r"answer is\s*(-?\d+)", re.IGNORECASE)
_INT_RE = re.compile(r"-?\d+")


def make_problem(rng: random.Random) -> dict[str, Any]:
    """One problem from ``rng``: ``{"question", "solution", "answer" (int), "ops" (1 or 2)}``."""
    name, pron, poss = rng.choice(NAMES)
    obj = rng.choice(OBJECTS)
    kind = rng.choice(["add", "sub", "mul", "add_sub", "mul_add", "sub_add"])
    if kind == "add":
        a, b = rng.randint(2, 20), rng.randint(2, 20)
        verb = rng.choice(GAIN_VERBS)
        q = f"{name} has {a} {obj}. {pron} {verb} {b} more {obj}. How many {obj} does {name} have now?"
        c = a + b
        s = f"{name} has {a} + {b} = {c} {obj}."
    elif kind == "sub":
        a = rng.randint(5, 30)
        b = rng.randint(1, a - 1)
        verb = rng.choice(LOSS_VERBS)
        q = f"{name} has {a} {obj}. {pron} {verb} {b} {obj}. How many {obj} does {name} have left?"
        c = a - b
        s = f"{name} has {a} - {b} = {c} {obj} left."
    elif kind == "mul":
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        box = rng.choice(CONTAINERS)
        q = f"{name} has {a} {box} with {b} {obj} in each. How many {obj} does {name} have?"
        c = a * b
        s = f"{name} has {a} * {b} = {c} {obj}."
    elif kind == "add_sub":
        a, b = rng.randint(2, 20), rng.randint(2, 20)
        d = rng.randint(1, a + b - 1)
        q = (f"{name} has {a} {obj}. {pron} {rng.choice(GAIN_VERBS)} {b} more and then {rng.choice(LOSS_VERBS)} "
             f"{d}. How many {obj} does {name} have now?")
        c = a + b - d
        s = f"{name} has {a} + {b} - {d} = {c} {obj}."
    elif kind == "mul_add":
        a, b, d = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 20)
        box = rng.choice(CONTAINERS)
        q = (f"{name} has {a} {box} with {b} {obj} in each and {d} loose {obj}. "
             f"How many {obj} does {name} have in all?")
        c = a * b + d
        s = f"{name} has {a} * {b} + {d} = {c} {obj}."
    else:  # sub_add
        a = rng.randint(5, 30)
        b = rng.randint(1, a - 1)
        d = rng.randint(1, 20)
        q = (f"{name} has {a} {obj}. {pron} {rng.choice(LOSS_VERBS)} {b} and then {rng.choice(GAIN_VERBS)} "
             f"{d} more. How many {obj} are in {poss} collection now?")
        c = a - b + d
        s = f"{name} has {a} - {b} + {d} = {c} {obj}."
    return {"question": q, "solution": f"{s} The answer is {c}.", "answer": c, "ops": 1 if "_" not in kind else 2}


def final_number(completion: str) -> int | None:
    """The completion's final answer: the last ``answer is N``, else the last integer, else ``None``."""
    m = _ANSWER_RE.findall(completion)
    if m:
        return int(m[-1])
    ints = _INT_RE.findall(completion)
    return int(ints[-1]) if ints else None


@TASKS.register("wordmath")
class WordMath(Task):
    """Generated arithmetic word problems (see the module docstring). Fields: ``answer`` (int),
    ``solution`` (the reference completion)."""

    name = "wordmath"
    data_file = "wordmath/test.jsonl"
    hub_id = "generated (maskrl.tasks.wordmath, TEST_SEED)"
    prompt_template = "{question}\n"
    template_fields = ("question",)

    def make_example(self, idx: int, question: str, answer: int, solution: str | None = None) -> Example:
        fields: dict[str, Any] = {"question": question, "answer": int(answer)}
        if solution is not None:
            fields["solution"] = solution
        return Example(id=idx, prompt=self.prompt_template.format(question=question), fields=fields)

    def generate(self, n: int, seed: int, exclude: Iterable[str] = ()) -> list[Example]:
        """``n`` distinct problems from ``random.Random(seed)``, none whose question is in ``exclude``
        (:meth:`instance_key` values). The training split: always excludes the test and
        validation questions as well."""
        banned = set(exclude)
        if seed not in (TEST_SEED, VALIDATION_SEED):
            banned |= {self.instance_key(ex) for ex in self.test_split() + self.validation_split()}
        return self._generate(n, seed, banned)

    def _generate(self, n: int, seed: int, banned: set[str]) -> list[Example]:
        rng = random.Random(seed)
        out: list[Example] = []
        seen = set(banned)
        tries = 0
        while len(out) < n:
            tries += 1
            if tries > 100 * n + 1000:
                raise ValueError(f"wordmath: cannot generate {n} distinct problems (got {len(out)})")
            p = make_problem(rng)
            if p["question"] in seen:
                continue
            seen.add(p["question"])
            out.append(self.make_example(len(out), p["question"], p["answer"], p["solution"]))
        return out

    def test_split(self) -> list[Example]:
        """The fixed test split (:data:`TEST_SIZE` rows from :data:`TEST_SEED`)."""
        return self._generate(TEST_SIZE, TEST_SEED, set())

    def validation_split(self) -> list[Example]:
        """The validation split, disjoint from the test split."""
        return self._generate(VALIDATION_SIZE, VALIDATION_SEED, {self.instance_key(ex) for ex in self.test_split()})

    def save_test(self, path: str | Path) -> Path:
        """Write the test split as JSONL (``{"question", "answer", "solution"}`` per line)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            for ex in self.test_split():
                fh.write(json.dumps({"question": ex.fields["question"], "answer": ex.fields["answer"],
                                     "solution": ex.fields["solution"]}) + "\n")
        return path

    def resolve_path(self, path=None) -> Path:
        """As :meth:`Task.resolve_path`; without a saved file in the data dir, the test split is
        written once under ``~/.cache/maskrl/wordmath/test.jsonl`` (same rows: fixed seed)."""
        try:
            return super().resolve_path(path)
        except FileNotFoundError:
            if path is not None:
                raise
            cache = Path.home() / ".cache" / "maskrl" / self.data_file
            return cache if cache.is_file() else self.save_test(cache)

    def parse(self, path: Path) -> list[Example]:
        out = []
        for lineno, obj in iter_jsonl(path):
            where = f"{path}:{lineno}"
            q = require(obj, "question", where)
            a = require(obj, "answer", where, (int, str))
            try:
                a = int(a)
            except ValueError:
                raise DataError(f"{where}: answer {a!r} must be an integer") from None
            out.append(self.make_example(len(out), q, a, obj.get("solution")))
        return out

    def reward(self, prompts: Sequence[str], completions: Sequence[str], *, answer: Sequence[int],
               **_: Any) -> list[float]:
        return [1.0 if final_number(c) == int(a) else 0.0 for c, a in zip(completions, answer)]

    @staticmethod
    def target(ex: Example) -> str:
        """The SFT target completion: the reference sentence and final number."""
        return ex.fields["solution"]

    @staticmethod
    def instance_key(ex: Example) -> str:
        return ex.fields["question"]


def build_wordmath_tokenizer(vocab_size: int = 384, samples: int = 4000, seed: int = 0):
    """A byte-level BPE tokenizer trained with ``tokenizers`` on ``samples`` generated problems and
    solutions, with the tiny model's special tokens (ids 0 pad, 1 bos, 2 eos, 3 mask, 4 unk), wrapped
    in ``PreTrainedTokenizerFast`` (pass it to :func:`maskrl.models.build_tiny`).

    Raises:
        ValueError: ``vocab_size`` below the 256 bytes + 5 specials.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from maskrl.models.tokenizer import SPECIAL_TOKENS

    if vocab_size < 261:
        raise ValueError(f"vocab_size (={vocab_size}) must be >= 261 (256 bytes + 5 special tokens)")
    specials = [SPECIAL_TOKENS[k] for k in ("pad_token", "bos_token", "eos_token", "mask_token", "unk_token")]
    rng = random.Random(seed)
    texts = []
    for _ in range(samples):
        p = make_problem(rng)
        texts += [p["question"], p["solution"]]
    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL_TOKENS)
