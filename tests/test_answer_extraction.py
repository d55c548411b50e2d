"""The shared final-answer rules (maskrl.tasks.extract) and each task that extracts from a completion.

Completions are real shapes of LLaDA-8B-Instruct output from d1's published generations
(``shared/data/d1-generations``), shortened; issue 15 (graders on real outputs) and issue 13 item 6
(the grader reads the wrong answer).
"""
from __future__ import annotations

import json

import pytest

from maskrl.config import load_config
from maskrl.tasks import get_task
from maskrl.tasks.code import extract_code
from maskrl.tasks.countdown import countdown_reward, equation_text
from maskrl.tasks.extract import (EOS_MARKERS, MINUS_CHARS, cut_at_eos, fenced_blocks, final_part, last_boxed,
                                  normalize_minus)
from maskrl.tasks.jsonschema_task import NoJSON, extract_json, schema_reward
from maskrl.tasks.math import clean_answer, extract_answer, form_matches
from maskrl.tasks.sudoku import cell_reward, extract_grid_digits

EOT = "<|eot_id|><|endoftext|><|endoftext|>"


# ----------------------------------------------------------------------------- the shared helpers

@pytest.mark.parametrize("ch", list(MINUS_CHARS))
def test_every_minus_like_character_reads_as_minus(ch):
    assert normalize_minus(f"{ch}10") == "-10"
    assert extract_answer(f"#### {ch}10") == "-10"
    assert extract_answer(f"The answer is {ch}10.") == "-10"
    assert extract_answer(f"\\boxed{{{ch}10}}") == "-10"
    assert equation_text(f"<answer>2 = 55 {ch} 53</answer>") == "55 - 53"


@pytest.mark.parametrize("marker", EOS_MARKERS)
def test_text_after_end_of_text_is_not_graded(marker):
    assert cut_at_eos(f"<answer>5</answer>{marker}<answer>7</answer>") == "<answer>5</answer>"
    assert extract_answer(f"\\boxed{{5}}{marker}\\boxed{{7}}") == "5"
    assert extract_grid_digits(f"<answer>1234</answer>{marker}<answer>4321432143214321</answer>") == "1234"


@pytest.mark.parametrize("text,kind,part,span", [
    ("\nreason\n</reasoning>\n<answer>\n20\n</answer>" + EOT, "answer", "\n20\n\n", "\n20\n"),
    ("r</reasoning>\n<answer>\n\\boxed{36>" + EOT, "open_answer", "\n\\boxed{36>", "\n\\boxed{36>"),
    ("reason</reasoning>\n\\boxed{34" + EOT, "after_reasoning", "\n\\boxed{34", None),
    ("x = \\boxed{75}\n</reasoning>" + EOT, "no_final_text", "x = \\boxed{75}\n</reasoning>", None),
    ("r</reasoning>\n<answer>\n</answer>" + EOT, "no_final_text", "r</reasoning>\n<answer>\n</answer>", None),
    ("The answer is 7", "untagged", "The answer is 7", None),
    ("<reasoning>First 3 + 4 = 7 and then", "cut_off", "<reasoning>First 3 + 4 = 7 and then", None),
])
def test_final_part_kinds(text, kind, part, span):
    got = final_part(text)
    assert (got.kind, got.text, got.span) == (kind, part, span)


def test_prompt_that_opens_reasoning_makes_an_unclosed_completion_cut_off():
    assert final_part("First 3 + 4 = 7 and then", prompt="Solve it.\n<reasoning>").kind == "cut_off"
    assert final_part("First 3 + 4 = 7 and then", prompt="Use <reasoning></reasoning> tags.").kind == "untagged"


def test_fences_close_only_on_their_own_line():
    text = 'Here:\n```json\n{"note": "close the block with ```", "n": 1}\n```\nafter\n```\nplain\n'
    blocks = fenced_blocks(text)
    assert [(b.lang, b.body, b.closed) for b in blocks] == [
        ("json", '{"note": "close the block with ```", "n": 1}\n', True), ("", "plain\n", False)]
    assert fenced_blocks("no fences ``` here") == []
    assert [b.body for b in fenced_blocks("  ```python\nx = 1\n  ```")] == ["x = 1\n"]


def test_last_boxed_nested_and_unclosed():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{\\boxed{7}}") == "7"
    assert last_boxed("\\boxed{48 + 29") is None
    assert last_boxed("\\boxed{48 + 29\nmore", allow_unclosed=True) == "48 + 29"


# ----------------------------------------------------------------------------- GSM8K / MATH-500

def test_a_draft_box_in_the_reasoning_loses_to_the_stated_answer():
    text = "Is it \\boxed{18}? No, recheck: 4 * 5 = 20.\n</reasoning>\n<answer>20</answer>"
    assert extract_answer(text) == "20"
    assert extract_answer("Is it \\boxed{18}? No, recheck.\n<answer>20</answer>") == "20"
    # real shape: the reasoning's box says 162000, the stated answer 16200 -> the stated answer counts
    real = ("\\[ \\boxed{162000} \\]\n</reasoning>\n<answer>\n\\boxed{16200}\n</answer>" + EOT)
    assert extract_answer(real) == "16200"


def test_a_model_that_stops_after_its_reasoning_is_graded_on_the_reasoning():
    text = "11 + 22 + 18 + 9 + 15 = \\boxed{75}\n</reasoning><|eot_id|>" + "<|endoftext|>" * 5
    assert extract_answer(text) == "75"


@pytest.mark.parametrize("text,expected", [
    ("<answer>\n\\boxed{240 sheets per month}\n</answer>", "240"),
    ("<answer>\\boxed{2:00 pm}</answer>", "2"),
    ("<answer>\n\\boxed{12 cm}\n</answer>", "12"),
    ("\\boxed{$18 dollars}", "18"),
    ("<answer>\n\\boxed{36>" + EOT, "36"),            # unclosed box: the span's number
    ("</answer>\n120 calls" + EOT, "120"),
    ("<answer>\n\\boxed{43,500}\n</answer>", "43,500"),
    ("\\boxed{x = 5 or x = -3}", "x = 5 or x = -3"),  # not a value with words: left to math-verify
    ("\\boxed{\\frac{2}{3}} dollars.\n</answer>", "\\frac{2}{3}"),
])
def test_answers_with_words_and_real_shapes(text, expected):
    assert extract_answer(text) == expected


def test_clean_answer_leaves_latex_and_plain_values_alone():
    for ans in ("864 \\mbox{ inches}^2", "\\text{(C)}", "-10", "\\frac{1}{2}", "(2, 3)"):
        assert clean_answer(ans) == ans


def test_gsm8k_rewards_on_real_shapes():
    task = get_task("gsm8k")
    comps = ["#### \u221210", "#### \u221210", "<answer>\\boxed{240 sheets per month}</answer>",
             "Is it \\boxed{18}? No.\n</reasoning>\n<answer>20</answer>",
             "Is it \\boxed{18}? No.\n</reasoning>\n<answer>20</answer>",
             "\\boxed{5}<|eot_id|>\\boxed{7}"]
    golds = ["-10", "10", "240", "18", "20", "5"]
    assert task.reward([""] * 6, comps, answer=golds) == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]


def test_strict_answer_form_is_an_option_and_value_is_the_default():
    q = "If the distance is $53.25$ miles, what is it on the map, expressed as a fraction?"
    comps = ["<answer>\n\\boxed{15.975}\n</answer>", "\\boxed{\\frac{639}{40}}"]
    value = get_task("math500")
    strict = get_task("math500", answer_form="strict")
    assert value.answer_form == "value"
    assert value.reward([q, q], comps, answer=["\\frac{639}{40}"] * 2) == [1.0, 1.0]
    assert strict.reward([q, q], comps, answer=["\\frac{639}{40}"] * 2) == [0.0, 1.0]
    with pytest.raises(ValueError, match="answer_form"):
        get_task("math500", answer_form="loose")


@pytest.mark.parametrize("gold,answer,question,ok", [
    ("\\frac{639}{40}", "15.975", "", False),          # decimal approximation of an exact answer
    ("\\$36", "36.00", "", False),
    ("2", "\\frac{6}{3}", "", False),                   # unevaluated
    ("10,\\!080", "7! \\times 2!", "", False),
    ("\\frac18", "\\frac{3}{24}", "Express your answer as a common fraction.", False),  # not lowest terms
    ("\\frac{4}{9}", "8/18", "", False),
    ("\\frac52", "2\\frac{1}{2}", "Express your answer as a common fraction.", False),  # mixed number
    ("10,\\!080", "10080", "", True),
    ("58,500", "58500", "", True),
    ("\\frac{4}{9}", "\\frac{4}{9}", "", True),
    ("-10", "\u221210", "", True),
    ("0.25", "0.25", "", True),
    ("\\text{(C)}", "C", "", True),
    ("60", "60\\%", "", True),                           # signs and units MATH's check ignores
    ("80", "80 \\text{ cm}", "", True),
    ("864 \\mbox{ inches}^2", "864", "", True),
    ("12", "12.00", "", False),
])
def test_form_matches(gold, answer, question, ok):
    assert form_matches(gold, answer, question) is ok


def test_require_final_answer_scores_a_cut_off_completion_zero():
    cut = "<reasoning>\nFirst, 3 + 4 = 7, and then we"
    assert extract_answer(cut) == "7"                   # default: whatever the text holds
    assert extract_answer(cut, require_final_answer=True) is None
    # with a prompt that opens the reasoning, the completion need not repeat the tag
    assert extract_answer("First, 3 + 4 = 7, and then", "Q\n<reasoning>", require_final_answer=True) is None
    # an untagged completion must box its answer (no last-number fallback) ...
    assert extract_answer("so 3 + 4 = 7 and", require_final_answer=True) is None
    assert extract_answer("so \\boxed{7}", require_final_answer=True) == "7"
    # ... a stated answer still counts
    assert extract_answer("r</reasoning>\n<answer>7</answer>", require_final_answer=True) == "7"
    task = get_task("gsm8k", require_final_answer=True)
    assert task.require_final_answer and task.reward([""], [cut], answer=["7"]) == [0.0]
    assert get_task("gsm8k").reward([""], [cut], answer=["7"]) == [1.0]


# ----------------------------------------------------------------------------- Countdown

@pytest.mark.parametrize("text,numbers,target,expected", [
    ("\nTherefore, the expression is 55 - 53 = 51.\n</reasoning>\n<answer>\n\\boxed{55 - 53}\n</answer>" + EOT,
     [49, 55, 53], 51, 0.1),                                              # read, well-formed, wrong
    ("</reasoning>\n<answer>\n\\boxed{96 - 48 + 26}\n</answer>" + EOT, [48, 96, 26], 74, 1.0),
    ("<answer>\\boxed{(49 \\times 2) \\div 2 + 3}</answer>", [49, 2, 3], 52, 0.1),
    ("<answer>\\boxed{49 \\times 2 - 3}</answer>", [49, 2, 3], 95, 1.0),
    ("<answer>\\boxed{49 \\cdot 2 - 3}</answer>", [49, 2, 3], 95, 1.0),
    ("<answer>\\boxed{98 \\div 2 + 3}</answer>", [98, 2, 3], 52, 1.0),
    ("<answer>$\\frac{98}{2} + 3 = 52$</answer>", [98, 2, 3], 52, 1.0),
    ("<answer>\\(\\left(98 - 2\\right) \\div 3\\)</answer>", [98, 2, 3], 32, 1.0),
    ("</reasoning>\n<answer>\n\\boxed{48 + 29 + 16><|eot_id|>", [48, 29, 16], 93, 1.0),   # unclosed box
    ("evaluates to 29.\n</reasoning>\n\n\\boxed{95 - 73 + 7><|eot_id|>", [95, 73, 7], 29, 1.0),
    ("<answer>\n\\boxed{95 - 73 + 7\n</answer}", [95, 73, 7], 29, 1.0),
    ("<answer>29 = 95 - 73 + 7</answer>", [95, 73, 7], 29, 1.0),
    ("<answer>[95 - (73 - 7)] \u00d7 1</answer>", [95, 73, 7, 1], 29, 1.0),
    ("Try 95 + 73 + 7.\n</reasoning>\n<answer>95 - 73 + 7</answer>", [95, 73, 7], 29, 1.0),
    ("Is it \\boxed{95 - 73 + 7}? No.\n</reasoning>\n<answer>95 + 73 - 7</answer>", [95, 73, 7], 29, 0.1),
])
def test_countdown_reads_latex_equations(text, numbers, target, expected):
    assert countdown_reward(numbers, target, text) == pytest.approx(expected)


def test_countdown_require_final_answer():
    cut = "<reasoning>\n95 - 73 + 7 = 29 works, so"
    assert countdown_reward([95, 73, 7], 29, cut) == 0.0     # prose is not an equation either way
    assert countdown_reward([95, 73, 7], 29, "95 - 73 + 7") == 1.0
    task = get_task("countdown", require_final_answer=True)
    assert task.reward(["Q <reasoning>"], ["95 - 73 + 7"], numbers=[[95, 73, 7]], target=[29]) == [0.0]
    assert task.reward(["Q"], ["95 - 73 + 7"], numbers=[[95, 73, 7]], target=[29]) == [1.0]


# ----------------------------------------------------------------------------- Sudoku

PUZ, SOL = "3102200002100320", "3142243142131324"
PROSE = ("\nTo solve this 4x4 Sudoku puzzle, we need to fill in the empty cells with digits 1-4 such that "
         "each row, column, and 2x2 box contains all digits exactly once. We can start by examining the "
         "given digits 3, 1, 2 and 4.\n")


@pytest.mark.parametrize("text,expected", [
    (PROSE, 0.0),                                                       # digits of prose never count
    ("314224314x213132", 7 / 8),                                        # a stray letter is not prose
    (PROSE + "</reasoning>" + EOT, 0.0),
    (f"The solved 4x4 Sudoku puzzle is: {SOL}", 1.0),                   # "4x4" does not shift the grid
    ("The solved 4x4 Sudoku puzzle is:\n3142\n2431\n4213\n1324\n", 1.0),
    ("Row 1: 3 1 4 2\nRow 2: 2 4 3 1\nRow 3: 4 2 1 3\nRow 4: 1 3 2 4", 1.0),
    (PROSE + "</reasoning>\n<answer>\n3142\n2431\n4213\n1324\n</answer>" + EOT, 1.0),
    (PROSE + "</reasoning>\n<answer>\n3142\\\\\n2431\\\\\n4213\\\\\n1324\n</answer>" + EOT, 1.0),
    (PROSE + "</reasoning>\n<answer>\nThe 4x4 grid is 3142 2431 4213 1324\n</answer>", 1.0),
    (PROSE + "</reasoning>\n<answer>\n31422431\n</answer<|eot_id|>", 4 / 8),   # short grid, mangled closer
    (PROSE + "</reasoning>\n<answer>\nThere is no solution to this puzzle.\n</answer>" + EOT, 0.0),
    (PROSE + "</reasoning>\n<>answer>\n314224\n314213\n1324\n</answer>" + EOT, 1.0),
])
def test_sudoku_reads_the_answer_grid_not_prose(text, expected):
    assert cell_reward(PUZ, SOL, text) == pytest.approx(expected)


def test_sudoku_require_final_answer():
    cut = f"<reasoning>\nThe grid so far is {SOL} and"
    assert cell_reward(PUZ, SOL, cut) == 1.0
    assert cell_reward(PUZ, SOL, cut, require_final_answer=True) == 0.0
    assert get_task("sudoku4x4", require_final_answer=True).reward(
        [""], [cut], puzzle=[PUZ], solution=[SOL]) == [0.0]


# ----------------------------------------------------------------------------- JSON and code

SCHEMA = json.dumps({"type": "object", "properties": {"note": {"type": "string"}, "n": {"type": "integer"}},
                     "required": ["note", "n"]})
BACKTICKS = '{"note": "close the block with ```", "n": 1}'


@pytest.mark.parametrize("text", [
    BACKTICKS,
    json.dumps(json.loads(BACKTICKS), indent=2),                       # bare, over several lines
    f"```json\n{BACKTICKS}\n```",
    f"Here it is:\n```json\n{BACKTICKS}\n```\nDone.",
    f"```\n{BACKTICKS}\n```",
    f"<reasoning>draft {{\"n\": \"x\"}}</reasoning>\n```json\n{BACKTICKS}\n```",
    f"{BACKTICKS}<|eot_id|>```json\n{{}}\n```",
])
def test_json_with_backticks_in_a_string(text):
    assert extract_json(text) == json.loads(BACKTICKS)
    assert schema_reward(SCHEMA, text) == 1.0


@pytest.mark.parametrize("ch", list(MINUS_CHARS))
def test_json_minus_like_characters_outside_strings(ch):
    assert extract_json(f'{{"n": {ch}5, "note": "a {ch} b"}}') == {"n": -5, "note": f"a {ch} b"}
    assert extract_json(f'```json\n[{ch}1, "\\"{ch}"]\n```') == [-1, f'"{ch}']


def test_json_cut_off_and_unparsable_fence():
    with pytest.raises(NoJSON):
        extract_json('<reasoning>the value will be {"note": "a", "n": 1}', require_final_answer=True)
    assert extract_json('<reasoning>the value will be {"note": "a", "n": 1}') == {"note": "a", "n": 1}
    with pytest.raises(NoJSON):
        extract_json("```json\n{not json}\n```")


def test_code_with_backticks_in_a_string():
    program = 'FENCE = "```"\n\ndef f(x):\n    return x + 1\n'
    assert extract_code(program) == program.strip("\n")
    fenced = "Sure.\n```python\ns = 'a```b'\nprint(s)\n```\nDone."
    assert extract_code(fenced) == "s = 'a```b'\nprint(s)"
    assert extract_code("<reasoning>\n```python\ndraft()\n```\n</reasoning>\n```python\nfinal()\n```") == "final()"
    assert extract_code("<reasoning>\n```python\ndraft()\n```\n") == ""     # cut off


# ----------------------------------------------------------------------------- configuration

def test_require_final_answer_from_config():
    from maskrl.pipeline import task_and_data

    cfg = load_config([], ["task.name=countdown", "task.require_final_answer=true", "task.train_size=2",
                           "task.eval_limit=2"])
    task, held_out, _, train = task_and_data(cfg)
    assert task.require_final_answer is True and len(train) == 2
    assert load_config([], []).task.require_final_answer is False


# --- issue 50 §3: MATH-500 grades the stated answer, never its last number -------------------------

UNBOXED = [  # (completion, its gold, a wrong gold equal to the completion's last number)
    ("<answer>1/3</answer>", "\\frac{1}{3}", "3"),
    ("\\frac{1}{3}", "\\frac{1}{3}", "3"),
    ("\\dfrac{5}{7}", "\\frac{5}{7}", "7"),
    ("\\sqrt{2}", "\\sqrt{2}", "2"),
    ("(1, 2)", "(1,2)", "2"),
    ("#### 3/4", "\\frac{3}{4}", "4"),
    ("2\\pi", "2\\pi", "2"),
    ("<reasoning>r</reasoning>\n<answer>\n$\\frac{1}{3}$.\n</answer>", "\\frac{1}{3}", "3"),
    ("First 2 + 2 = 4.\nSo the final answer is $2\\pi$.", "2\\pi", "2"),
]


@pytest.mark.parametrize("completion, gold, last", UNBOXED)
def test_math500_reads_the_whole_unboxed_answer(completion, gold, last):
    from maskrl.tasks.math import last_number

    assert last_number(completion) == last  # what the old rule graded
    ans = extract_answer(completion, whole_span=True)
    assert ans is not None and ans != last and last_number(ans) == last


def test_math500_grades_unboxed_answers_as_written_and_wrong_ones_zero():
    task = get_task("math500")
    comps = [c for c, _, _ in UNBOXED]
    assert task.reward([""] * len(comps), comps, answer=[g for _, g, _ in UNBOXED]) == [1.0] * len(comps)
    assert task.reward([""] * len(comps), comps, answer=[w for _, _, w in UNBOXED]) == [0.0] * len(comps)


def test_gsm8k_keeps_its_numeric_rule():
    task = get_task("gsm8k")
    comps = ["The total is 72 apples", "#### $1,000 total", "so 3 + 4 = 7 and 7 * 6 = 42", "<answer>42 eggs</answer>"]
    assert task.reward([""] * 4, comps, answer=["72", "1000", "42", "42"]) == [1.0] * 4


@pytest.mark.parametrize("task_name", ["gsm8k", "math500"])
def test_a_period_closing_the_boxed_answer_is_not_part_of_it(task_name):
    task = get_task(task_name)
    comps = ["\\boxed{18.}", "\\boxed{7.}", "\\boxed{1,200.}", "\\boxed{\\frac{1}{2}.}", "\\boxed{18}", "#### 18.",
             "\\boxed{2.5.}", "\\boxed{18.\\,}", "\\boxed{19.}"]
    golds = ["18", "7", "1200", "\\frac{1}{2}", "18", "18", "2.5", "18", "18"]
    assert task.reward([""] * len(comps), comps, answer=golds) == [1.0] * 8 + [0.0]
    assert [clean_answer(a) for a in ("1, 2, \\ldots", "...", "18.")] == ["1, 2, \\ldots", "...", "18"]


@pytest.mark.parametrize("completion, expected", [
    ("<answer>\n$$\n\\frac{1}{3}\n$$\n</answer>", "\\frac{1}{3}"),          # one display formula over lines
    ("Work: 3 + 4 = 7.\nSo the answer is $\\sqrt{2}$.", "\\sqrt{2}"),       # the last line, not the reasoning
    ("<reasoning>r</reasoning>\nThe area is\n\\[2\\pi\\]", "2\\pi"),
    ("<answer>Answer: (1, 2)</answer>", "(1, 2)"),
    ("The total is 72 apples", "72"),                                       # words around one number
])
def test_math500_answer_span_shapes(completion, expected):
    assert extract_answer(completion, whole_span=True) == expected
