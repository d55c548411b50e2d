"""gsm8k / math500 (SPEC §5): answer extraction, math-verify reward in worker processes, golden runs
on the real data files, and the timeout / crash paths of the verification pool."""
from __future__ import annotations

import os
import threading
import time

import pytest

from maskrl.mathverify import VerifyPool, math_equal, verify_many
from maskrl.tasks import TASKS, default_data_dir, get_task
from maskrl.tasks.math import GSM8K, MATH500, extract_answer, last_boxed


# --- helpers run inside worker processes (module level, so they pickle by reference) -------------

def _hang(gold: str, answer: str) -> bool:
    time.sleep(120)
    return True


def _crash(gold: str, answer: str) -> bool:
    os._exit(3)


def _raise(gold: str, answer: str) -> bool:
    raise RuntimeError("boom")


def _hang_on_marker(gold: str, answer: str) -> bool:
    if answer == "HANG":
        time.sleep(120)
    return gold == answer


def _data(rel: str):
    root = default_data_dir()
    if root is None or not (root / rel).is_file():
        pytest.skip(f"shared data file {rel} not found (set MASKRL_DATA_DIR)")
    return root / rel


# --- extraction ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("so the answer is \\boxed{72}.", "72"),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),
    ("first \\boxed{1} then \\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\boxed{\\boxed{5}}", "5"),
    ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
    ("\\fbox{3}", "3"),
    ("$\\boxed 7$", "7"),
    ("\\boxed{12} and a truncated \\boxed{\\frac{1}{", "12"),
    ("only a truncated \\boxed{\\frac{1}{2 with 9 later", "9"),
    ("Janet sells 9 eggs.\n#### 18", "18"),
    ("#### 1,450,000", "1,450,000"),
    ("#### $18.", "18"),
    ("#### -3.5 degrees", "-3.5"),
    ("#### \\frac{1}{2}", "\\frac{1}{2}"),
    ("#### 5\nmore text 99", "5"),
    ("It costs 1,234.50 dollars, then 12 more, total 1,246.5", "1246.5"),
    ("x is -4", "-4"),
    ("version v2 and x3 but .5 remains", ".5"),
    ("<answer>\\boxed{x^2+1}</answer> and 42", "x^2+1"),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text", ["", "   \n", "no digits here", "\\boxed{}", "#### ", None, 17])
def test_extract_answer_none(text):
    assert extract_answer(text) is None


def test_extract_answer_too_long():
    assert extract_answer("\\boxed{" + "1" * 2000 + "}") is None


def test_last_boxed_unbalanced_is_ignored():
    assert last_boxed("\\boxed{1") is None


# --- reward --------------------------------------------------------------------------------------

def test_tasks_registered():
    assert {"gsm8k", "math500"} <= set(TASKS.names())
    assert get_task("gsm8k").hub_id.startswith("openai/gsm8k")
    assert get_task("math500").hub_id == "HuggingFaceH4/MATH-500"
    with pytest.raises(ValueError, match="split"):
        GSM8K(split="dev")


def test_reward_cases():
    task = MATH500()
    golds = ["\\frac{1}{2}", "\\frac{1}{2}", "72", "72", "72", "72", "1000", "(1,2)", "\\text{Evelyn}", "3"]
    comps = [
        "\\boxed{0.5}",                # equivalent form
        "\\boxed{\\frac{2}{4}}",       # equivalent form
        "#### 72",                     # GSM8K style
        "The total is 72 apples",      # last-number fallback
        "\\boxed{73}",                 # wrong
        "",                            # empty
        "\\boxed{1,000}",              # thousands separator
        "\\boxed{(2,1)}",              # wrong order
        "\\boxed{\\text{Evelyn}}",     # text answer
        "\x00\x01 }}}{{{ \\boxed{",    # garbage
    ]
    assert task.reward([""] * len(comps), comps, answer=golds) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]


def test_reward_length_mismatch():
    with pytest.raises(ValueError, match="2 completions but 1"):
        GSM8K().reward(["", ""], ["1", "2"], answer=["1"])


def test_reward_from_a_thread():
    """math-verify's signal.alarm never runs in the caller's thread, so threaded callers work."""
    out = {}
    t = threading.Thread(target=lambda: out.update(r=GSM8K().reward(["q"], ["\\boxed{4}"], answer=["4"])))
    t.start()
    t.join(60)
    assert out.get("r") == [1.0]


def test_training_reward_equals_metric():
    task = GSM8K()
    ex = task.load(_data("gsm8k/test.jsonl"), limit=4)
    comps = [f"\\boxed{{{ex[0].fields['answer']}}}", "#### 0.123456", "", "junk"]
    rewards = task.score_examples(ex, comps)
    assert rewards == [1.0, 0.0, 0.0, 0.0]
    m = task.metrics(ex, comps, rewards)
    assert m["accuracy"] == 0.25 and m["mean_reward"] == 0.25


# --- pool failure paths --------------------------------------------------------------------------

@pytest.fixture
def small_pool():
    pool = VerifyPool(workers=1)
    yield pool
    pool.close()


def test_hang_scores_zero_and_pool_recovers(small_pool):
    task = GSM8K(timeout_s=1.0, pool=small_pool, equal_fn=_hang)
    t0 = time.monotonic()
    assert task.reward(["q"], ["\\boxed{1}"], answer=["1"]) == [0.0]
    assert time.monotonic() - t0 < 60
    # the same pool still verifies normally afterwards
    assert verify_many(["2", "2"], ["2", "3"], timeout_s=30, pool=small_pool) == [1.0, 0.0]
    assert small_pool.starts == 2


def test_only_the_hung_item_is_lost(small_pool):
    # 3 s, not less: the items that should succeed share the limit and the machine may be loaded
    out = verify_many(["a", "b", "c", "d"], ["a", "HANG", "c", "x"], timeout_s=3.0,
                      equal_fn=_hang_on_marker, pool=small_pool)
    assert out == [1.0, 0.0, 1.0, 0.0]


def test_crash_and_exception_score_zero(small_pool):
    assert verify_many(["1"], ["1"], timeout_s=1.0, equal_fn=_crash, pool=small_pool) == [0.0]
    assert verify_many(["1", "1"], ["1", "1"], timeout_s=30, equal_fn=_raise, pool=small_pool) == [0.0, 0.0]
    assert small_pool.map(_raise, [("1", "1")], 30)[0] == ("error", "RuntimeError: boom")
    assert verify_many(["1"], ["1"], timeout_s=30, pool=small_pool) == [1.0]


def test_empty_answers_skip_the_pool():
    pool = VerifyPool(workers=1)
    assert verify_many(["1", "2"], [None, "  "], pool=pool) == [0.0, 0.0]
    assert pool.starts == 0


def test_math_equal_direct():
    assert math_equal("\\frac{1}{2}", "0.5")
    assert not math_equal("2", "3")


# --- golden runs on the real files ---------------------------------------------------------------

def test_gsm8k_golden():
    task = GSM8K()
    ex = task.load(_data("gsm8k/test.jsonl"))
    assert len(ex) == 1319
    raw = [e.fields["solution"] + "\n#### " + e.fields["answer"] for e in ex]
    assert task.score_examples(ex, raw) == [1.0] * 1319, "reasoning + '#### gold'"
    boxed = [f"The answer is \\boxed{{{e.fields['answer']}}}." for e in ex]
    assert task.score_examples(ex, boxed) == [1.0] * 1319, "\\boxed{gold}"
    wrong = []
    for e in ex:
        value = float(e.fields["answer"].replace(",", "")) + 1
        wrong.append(e.fields["solution"] + f"\n#### {value:g}")
    assert task.score_examples(ex, wrong) == [0.0] * 1319, "gold + 1 must score 0 on every row"


def test_math500_golden():
    task = MATH500()
    ex = task.load(_data("math500/test.jsonl"))
    assert len(ex) == 500
    boxed = [f"Therefore the answer is $\\boxed{{{e.fields['answer']}}}$." for e in ex]
    assert task.score_examples(ex, boxed) == [1.0] * 500, "\\boxed{gold}"
    # the reference solutions themselves (real LaTeX prose, answer boxed somewhere near the end)
    assert task.score_examples(ex, [e.fields["solution"] for e in ex]) == [1.0] * 500
    # perturbed: each row gets the answer of the next row whose answer differs as a string
    answers = [e.fields["answer"] for e in ex]
    norm = lambda s: "".join(s.split())  # noqa: E731
    wrong = []
    for i, a in enumerate(answers):
        j = (i + 1) % 500
        while norm(answers[j]) == norm(a):
            j = (j + 1) % 500
        wrong.append(f"\\boxed{{{answers[j]}}}")
    rewards = task.score_examples(ex, wrong)
    # the only pair of different strings with the same value: row 22 '5' vs row 23 'x=5'
    # (math-verify reads the assignment x=5 as its value, by design)
    assert [i for i, r in enumerate(rewards) if r != 0.0] == [22]
    assert (answers[22], answers[23]) == ("5", "x=5")


# --- issue 20 item 4: one box per value, LaTeX spacing inside numbers ---------------------------

def test_value_count_of_gold_answers():
    from maskrl.tasks.math import value_count

    assert [value_count(g) for g in ["2, 5", "(1, 2)", "\\frac{1}{2}, -3, 4", "10,\\!080", "1,000", "\\{1, 2\\}",
                                     "x=2, y=3", "7"]] == [2, 1, 3, 1, 1, 1, 2, 1]


def test_one_box_per_value_is_read_as_the_tuple():
    assert extract_answer("The roots are \\boxed{2} and \\boxed{5}.", n_values=2) == "2, 5"
    assert extract_answer("so $x=\\boxed{-1}$,\n$y=\\boxed{3}$", n_values=2) == "-1, 3"
    # a single-value gold keeps the last box; a box that already lists the values is kept
    assert extract_answer("The roots are \\boxed{2} and \\boxed{5}.") == "5"
    assert extract_answer("\\boxed{1} so \\boxed{2, 5}", n_values=2) == "2, 5"
    # boxes far apart are a draft and a final answer, not one answer
    far = "First \\boxed{2}." + " and so on" * 10 + " The answer is \\boxed{5}."
    assert extract_answer(far, n_values=2) == "5"


def test_reward_one_box_per_value_and_digit_spacing():
    task = MATH500()
    golds = ["2, 5", "2, 5", "12,\\!345", "12,\\!345", "1234567", "12345", "12,\\!345", "3"]
    comps = [
        "The roots are \\boxed{2} and \\boxed{5}.",   # one box per value
        "The roots are \\boxed{2} and \\boxed{6}.",   # one of them wrong
        "\\boxed{12\\,345}",                          # thin space grouping
        "\\boxed{12~345}",                            # tie grouping
        "\\boxed{1\\;234\\:567}",                     # medium / thick spaces
        "\\boxed{12\\ 345}",                          # control space
        "\\boxed{12\\,346}",                          # wrong digits
        "\\boxed{3\\,000}",                           # 3000 is not 3
    ]
    assert task.reward([""] * len(comps), comps, answer=golds) == [1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    # a gold answer written with spacing reads the same
    assert task.reward([""], ["\\boxed{12345}"], answer=["12\\,345"]) == [1.0]
