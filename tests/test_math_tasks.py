"""gsm8k / math500 (docs/spec.md §5): answer extraction, math-verify reward in worker processes, golden runs
on the real data files, and the timeout / crash paths of the verification pool."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from conftest import WAIT_CAP_S, wait_for
from maskrl.mathverify import VerifyPool, math_equal, verify_many
from maskrl.tasks import TASKS, default_data_dir, get_task
from maskrl.tasks.base import DataError
from maskrl.tasks.math import GSM8K, MATH500, extract_answer, last_boxed


# --- helpers run inside worker processes (module level, so they pickle by reference) -------------

#: how long a hung item sleeps: the cap of every wait (conftest.WAIT_CAP_S), so that a result that
#: arrives at all was cut off by the pool's timeout, however slow the machine
HANG_S = WAIT_CAP_S


def _hang(gold: str, answer: str) -> bool:
    time.sleep(HANG_S)
    return True


def _crash(gold: str, answer: str) -> bool:
    os._exit(3)


def _raise(gold: str, answer: str) -> bool:
    raise RuntimeError("boom")


def _hang_on_marker(gold: str, answer: str) -> bool:
    if answer == "HANG":
        time.sleep(HANG_S)
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
    wait_for("the reward thread", t)
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
    assert time.monotonic() - t0 < HANG_S  # cut off, not waited out
    # the same pool still verifies normally afterwards (the limit is no test of speed: it covers the restart)
    assert verify_many(["2", "2"], ["2", "3"], timeout_s=WAIT_CAP_S, pool=small_pool) == [1.0, 0.0]
    assert small_pool.starts == 2


def test_only_the_hung_item_is_lost(small_pool):
    """Only the hung item scores 0; the others are scored. The worker is started first (a start is
    charged to the item that waits for it: under load it may take longer than any short limit), so
    the 5 s limit is only asked of string comparisons in a running worker; the items after the
    restart are test_hang_scores_zero_and_pool_recovers's."""
    assert verify_many(["w"], ["w"], timeout_s=WAIT_CAP_S, equal_fn=_hang_on_marker, pool=small_pool) == [1.0]
    out = verify_many(["a", "c", "d", "b"], ["a", "c", "x", "HANG"], timeout_s=5.0,
                      equal_fn=_hang_on_marker, pool=small_pool)
    assert out == [1.0, 1.0, 0.0, 0.0]


def test_crash_and_exception_score_zero(small_pool):
    assert verify_many(["1"], ["1"], timeout_s=1.0, equal_fn=_crash, pool=small_pool) == [0.0]
    assert verify_many(["1", "1"], ["1", "1"], timeout_s=WAIT_CAP_S, equal_fn=_raise, pool=small_pool) == [0.0, 0.0]
    assert small_pool.map(_raise, [("1", "1")], WAIT_CAP_S)[0] == ("error", "RuntimeError: boom")
    assert verify_many(["1"], ["1"], timeout_s=WAIT_CAP_S, pool=small_pool) == [1.0]


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


# --- numbers are compared relatively: a wrong number never scores 1 ------------------------------

WRONG_NUMBERS = [
    (".0000672", "0.0000673"), (".0000672", "0.0000670"), (".0000672", "6.73\\times10^{-5}"),  # tiny decimals
    ("-0.0000672", "-0.0000673"), ("2.5 \\cdot 10^{-8}", "0.000000026"),
    ("\\frac{1}{2^{99}}", "\\frac{1}{2^{98}}"), ("\\frac{1}{2^{300}}", "\\frac{1}{2^{299}}"),    # tiny exact values
    ("10^{-20}", "10^{-21}"), ("\\frac{1}{10^{20}}", "\\frac{1}{10^{21}}"), ("e^{-40}", "e^{-41}"),
    ("\\sqrt{2}\\cdot 10^{-30}", "\\sqrt{3}\\cdot 10^{-30}"),
    ("2^{99}", "2^{98}"), ("2^{99}", "633825300114114700748351602689"),                      # huge values
    ("6.02\\times10^{23}", "6.03\\times10^{23}"),
    ("3.14159265358979", "3.14159265358978"), ("1.2345678901234567891", "1.2345678901234567899"),  # many digits
    ("\\pi", "3.14159"), ("\\frac{2}{3}", "0.666666"), ("0", "0.0000001"),
    ("0.0672\\%", "0.0673\\%"),                                                              # percentages
    ("x=0.0000672", "0.0000673"), ("x<10^{-20}", "x<10^{-21}"), ("x+10^{-20}", "x+10^{-21}"),   # in structures
    ("(0.0000672, 1)", "(0.0000673, 1)"), ("\\{0.0000672, 1\\}", "\\{1, 0.0000673\\}"), ("[0.0000672, 1]", "[0.0000673, 1]"),
    ("\\begin{pmatrix}0.0000672\\\\1\\end{pmatrix}", "\\begin{pmatrix}0.0000673\\\\1\\end{pmatrix}"),
]
RIGHT_NUMBERS = [
    (".0000672", "0.0000672"), (".0000672", "6.72\\times10^{-5}"), (".0000672", "\\frac{21}{312500}"),
    ("-0.0000672", "-.0000672"), ("2.5 \\cdot 10^{-8}", "0.000000025"),
    ("\\frac{1}{2^{99}}", "2^{-99}"), ("\\frac{1}{10^{20}}", "10^{-20}"), ("e^{-40}", "e^{-40}"),
    ("\\sqrt{2}\\cdot 10^{-30}", "\\sqrt{8}\\cdot 10^{-30}/2"),
    ("2^{99}", "633825300114114700748351602688"), ("6.02\\times10^{23}", "6.02\\times10^{23}"),
    ("3.14159265358979", "\\pi"), ("\\pi", "3.141593"), ("\\frac{1}{3}", "0.333333"), ("\\frac{2}{3}", "0.666667"),
    ("\\frac{\\sqrt{2}}{2}", "0.707107"), ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"), ("15.975", "\\frac{639}{40}"),
    ("0.5", "50\\%"), ("50\\%", "50"), ("50\\%", "0.5"), ("10\\%", "0.1"), ("0.0672\\%", "0.0672\\%"),
    ("x=0.0000672", "0.0000672"), ("x<10^{-20}", "10^{-20}>x"), ("x+10^{-20}", "10^{-20}+x"),
    ("(0.0000672, 1)", "(0.0000672, 1)"), ("\\{0.0000672, 1\\}", "\\{1, 0.0000672\\}"),
    ("\\sin^2 x+\\cos^2 x", "1"), ("5", "x=5"), ("1000", "1,000"),
]


@pytest.mark.parametrize("gold,answer", WRONG_NUMBERS)
def test_a_wrong_number_never_equals_the_gold(gold, answer):
    assert not math_equal(gold, answer)


@pytest.mark.parametrize("gold,answer", RIGHT_NUMBERS)
def test_equal_numbers_stay_equal(gold, answer):
    assert math_equal(gold, answer)


def test_written_digits_of_gold_answers():
    from maskrl.mathverify import written_digits

    assert [written_digits(s) for s in [".0000672", "0.0000672", "36.00", "3.14159265358979", "\\frac{1}{2}",
                                         "100.5, 0.25", "0.000", "12"]] == [3, 3, 4, 15, 0, 4, 0, 0]


@pytest.mark.numerics
def test_numbers_close_is_relative_at_every_magnitude():
    """A decimal must agree to 6 significant digits: |g − p| ≤ ½·10^(⌊log10|g|⌋ + 1 − 6), by hand at
    three magnitudes (tolerances 5e-7, 5e-11 and 5e23 -- the same 1.5 ppm of 1/3)."""
    from sympy import Float, Integer, Rational

    from maskrl.mathverify import numbers_close

    for scale in (Integer(1), Rational(1, 10 ** 4), Integer(10) ** 30):
        g = Rational(1, 3) * scale
        inside = Float("0.3333329", 30) * scale   # |g − p| = 0.43e-6 · scale
        outside = Float("0.3333328", 30) * scale  # |g − p| = 0.53e-6 · scale
        assert numbers_close(g, inside) and not numbers_close(g, outside), scale
    # more digits when the gold writes more: 7 digits written, half a unit of the 7th is 5e-8
    assert numbers_close(Float("0.1234567", 30), Float("0.12345674", 30), digits=7)
    assert not numbers_close(Float("0.1234567", 30), Float("0.12345676", 30), digits=7)
    # exact values are equal only when they are the same number, however close
    assert not numbers_close(Integer(2) ** 200, Integer(2) ** 200 + 1)
    assert not numbers_close(Rational(1, 2 ** 99), Rational(1, 2 ** 98))
    assert numbers_close(Integer(2) ** 200, Integer(2) ** 200)


def test_math500_row_with_a_tiny_gold_value_scores_only_the_right_answer():
    """MATH-500 row 176 (gold '.0000672', 21/(2^2·5^7) as a decimal): neighbours of the right value
    score 0 in both answer forms, the value itself (as a decimal or a fraction) 1."""
    rows = MATH500().load(_data("math500/test.jsonl"))
    row = rows[176]
    assert row.fields["answer"] == ".0000672"
    comps = ["\\boxed{0.0000673}", "\\boxed{0.0000670}", "\\boxed{0.0000672}", "\\boxed{\\frac{21}{312500}}",
             "\\boxed{6.72 \\times 10^{-5}}"]
    for form in ("value", "strict"):
        task = MATH500(answer_form=form)
        got = task.score_examples([row] * len(comps), comps)
        assert got == [0.0, 0.0, 1.0, 1.0, 1.0], form


def _jsonl(path, rows):
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_math500_trains_on_maths_train_split_in_either_format_never_on_test_problems(tmp_path):
    """MATH-500 has no training rows: ``math500/train.jsonl`` holds MATH's train split, in MATH-500's
    format (answer field) or MATH's own (the solution's last \\boxed{}); test problems are dropped."""
    test = [{"problem": "What is 1+1?", "solution": "\\boxed{2}", "answer": "2", "subject": "A", "level": 1}]
    _jsonl(tmp_path / "math500" / "test.jsonl", test)
    _jsonl(tmp_path / "math500" / "train.jsonl", [
        {"problem": "Halve 1.", "solution": "It is $\\boxed{\\frac{1}{2}}$.", "level": "Level 2", "type": "Algebra"},
        {"problem": "What is 2+2?", "solution": "4", "answer": "4", "subject": "B", "level": 1},
        test[0],  # a MATH-500 test problem among the training rows
    ])
    with pytest.warns(UserWarning, match="dropped 1 training rows"):
        rows = MATH500().train_split(tmp_path)
    assert [r.fields["answer"] for r in rows] == ["\\frac{1}{2}", "4"] and [r.id for r in rows] == [0, 1]
    assert rows[0].fields["subject"] == "Algebra"
    assert all("1+1" not in r.prompt for r in rows)
    with pytest.warns(UserWarning, match="dropped 1"):
        same = MATH500().train_split(tmp_path / "math500" / "test.jsonl")  # the test file's sibling is read
    assert [r.prompt for r in same] == [r.prompt for r in rows]


def test_math500_without_a_train_file_says_what_to_put_where(tmp_path):
    _jsonl(tmp_path / "math500" / "test.jsonl", [{"problem": "p", "solution": "s", "answer": "1"}])
    with pytest.raises(FileNotFoundError, match=r"math500/train.jsonl does not exist.*MATH's train split"):
        MATH500().train_split(tmp_path)
    _jsonl(tmp_path / "math500" / "train.jsonl", [{"problem": "p", "solution": "no box here"}])
    with pytest.raises(DataError, match=r"train.jsonl:1: no field 'answer' and no \\boxed"):
        MATH500().train_split(tmp_path)


def test_the_math500_recipes_find_their_training_rows(tmp_path, monkeypatch):
    """The shipped LLaDA-8B MATH recipes start ``maskrl train``'s data step when the train file is there."""
    from maskrl.config import load_config
    from maskrl.pipeline import task_and_data

    root = Path(__file__).resolve().parents[1]
    _jsonl(tmp_path / "math500" / "test.jsonl", [{"problem": f"t{i}", "solution": "s", "answer": "1"} for i in range(3)])
    _jsonl(tmp_path / "math500" / "train.jsonl", [{"problem": f"q{i}", "solution": f"\\boxed{{{i}}}"} for i in range(5)])
    monkeypatch.setenv("MASKRL_DATA_DIR", str(tmp_path))
    for name in ("llada8b_math500_rldf", "llada8b_math500_dtca"):
        cfg = load_config([str(root / "configs" / f"{name}.yaml")], [])
        _, held, _, train = task_and_data(cfg)
        assert len(train) == 5 and len(held) == 3, name
