"""The wordmath task (issue 10 item 2): generation, disjoint splits, the pinned test split, reward,
and the BPE tokenizer."""
from __future__ import annotations

import hashlib
import json
import random

import pytest
import torch

from maskrl.models import build_tiny
from maskrl.tasks import get_task
from maskrl.tasks.wordmath import (TEST_SIZE, WordMath, build_wordmath_tokenizer, final_number, make_problem)


def test_problems_are_consistent_and_varied():
    rng = random.Random(0)
    probs = [make_problem(rng) for _ in range(400)]
    assert {p["ops"] for p in probs} == {1, 2}
    for p in probs:
        # the solution's equation evaluates to the answer (the reference is correct)
        eq = p["solution"].split(" has ", 1)[1].split(" = ")
        lhs, rhs = eq[0], int(eq[1].split()[0])
        assert eval(lhs, {"__builtins__": {}}) == rhs == p["answer"] >= 0  # noqa: S307 (test-only, own text)
        assert p["solution"].endswith(f"The answer is {p['answer']}.")
    assert len({p["question"] for p in probs}) > 350


def test_reward_reads_the_final_number():
    t = WordMath()
    comps = ["Mia has 4 + 3 = 7 apples. The answer is 7.", "The answer is 8.", "so 7", "no number",
             "The answer is 7. Wait, the answer is 6."]
    assert t.reward(None, comps, answer=[7] * 5) == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert final_number("x 3 y 12") == 12 and final_number("") is None


def test_splits_are_disjoint_and_the_test_split_is_pinned(tmp_path):
    t = get_task("wordmath")
    test, val = t.test_split(), t.validation_split()
    train = t.generate(300, seed=0)
    kt, kv, kr = ({t.instance_key(e) for e in s} for s in (test, val, train))
    assert len(kt) == TEST_SIZE and len(kv) == len(val) and len(kr) == 300
    assert not (kt & kv) and not (kt & kr) and not (kv & kr)
    path = t.save_test(tmp_path / "test.jsonl")
    text = path.read_text()
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == PINNED  # changing the generator changes this
    rows = t.load(path)
    assert [r.fields["question"] for r in rows] == [r.fields["question"] for r in test]
    assert t.reward(None, [r.fields["solution"] for r in rows[:20]], answer=[r.fields["answer"] for r in rows[:20]]) \
        == [1.0] * 20
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "seven"}) + "\n")
    with pytest.raises(Exception, match="answer"):
        t.load(bad)


PINNED = "041df28cf15f582f"  # sha256 prefix of the saved test split (500 rows, TEST_SEED)


def test_bpe_tokenizer_round_trips_and_drives_the_tiny_model():
    tok = build_wordmath_tokenizer(vocab_size=320, samples=500)
    assert len(tok) <= 320 and tok.mask_token_id == 3 and tok.eos_token_id == 2 and tok.pad_token_id == 0
    text = "Mia has 4 + 3 = 7 apples. The answer is 7."
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text and len(ids) < 0.6 * len(text)  # merges learned: fewer tokens than chars
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, tokenizer=tok)
    with torch.no_grad():
        out = a.logits(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.bool))
    assert out.shape == (1, len(ids), len(tok))
    with pytest.raises(ValueError, match="vocab_size"):
        build_wordmath_tokenizer(vocab_size=100)


def test_tiny_model_tokenizer_is_a_config_field(tmp_path):
    from maskrl.config import ConfigError, load_config
    from maskrl.pipeline import load_policy

    small = "model.tiny={hidden_size: 32, num_layers: 2, num_heads: 2, intermediate_size: 64, tokenizer: %s}"
    char = load_policy(load_config([], [small % "char"]))
    assert len(char.tokenizer) < 110 and char.tokenizer.tokenize("Mia 4") == list("Mia 4")
    bpe = load_policy(load_config([], [small % "wordmath_bpe"]))
    assert len(bpe.tokenizer) == 384 and bpe.mask_id == 3 and bpe.model.config.vocab_size >= 384
    assert len(bpe.tokenizer("Mia has 4 apples.")["input_ids"]) < len("Mia has 4 apples.") // 2
    bpe.tokenizer.save_pretrained(tmp_path / "tok")  # a folder with tokenizer.json
    folder = load_policy(load_config([], [small % (tmp_path / "tok")]))
    assert folder.tokenizer.get_vocab() == bpe.tokenizer.get_vocab()
    with pytest.raises(ConfigError, match="model.tiny.tokenizer"):
        load_config([], [small % "wordpiece"])
