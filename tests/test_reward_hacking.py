"""Reward-hacking suite (issue 14): completions that solve nothing but attack the grader must score 0.

Next to the hostile-program suite in ``test_sandbox.py`` (which protects the machine), these
protect the *metric*. Each attack is one member of a kind:

* objects that lie to comparisons: ``__eq__``/``__ne__``, ``__bool__``, ``__hash__``, ``__len__``,
  ``__class__``, subclasses of builtin types (``int``, ``str``, ``list``, ``dict``);
* a redefined environment: patched builtins (``set``, ``sorted``, ``len``, ``isinstance``,
  ``abs``), a patched ``math.isclose``, names the tests use shadowed at module level, a replaced
  ``AssertionError``, builtin types cursed through ``gc`` (``int.__eq__``), HumanEval helpers and
  ``check`` redefined;
* the harness attacked from inside: its module patched through ``sys.modules``, forged answers
  written to every file descriptor (also from a thread), ``sys.exit``/``os._exit`` in a call,
  answers nested or sized to break the decoder;
* leaks of the answers: searching the file system for the dataset or the project tree, searching
  the interpreter's memory for the tests.

Every synthetic row is built so that no constant answer passes any of its tests, and each has a
correct solution scoring 1.0 (so a 0 comes from the attack, not from the row).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import roomy_limits
from maskrl.sandbox import Limits, SandboxError, missing_protections, probe_isolation, run_program
from maskrl.tasks import default_data_dir
from maskrl.tasks.code import HumanEval, MBPP

ISOLATION = probe_isolation()
FSVIEW = "fsview" in ISOLATION.split(",")
needs_fsview = pytest.mark.skipif(not FSVIEW, reason=f"no private file-system view here (isolation={ISOLATION})")
DATA = default_data_dir()
MBPP_FILE = DATA / "mbpp" / "sanitized-mbpp.json" if DATA else None
HE_FILE = DATA / "humaneval" / "HumanEval.jsonl.gz" if DATA else None
needs_mbpp = pytest.mark.skipif(MBPP_FILE is None or not MBPP_FILE.is_file(), reason="shared MBPP data not found")
needs_he = pytest.mark.skipif(HE_FILE is None or not HE_FILE.is_file(), reason="shared HumanEval data not found")
FAST = roomy_limits()  # CPU-limited: a spinning hack stops at 10 s of CPU; the wall clock only stops a hang


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


# Synthetic MBPP-style rows: (reference = the correct solution, tests, test_imports). No constant
# value passes any test: each test compares two different calls or checks a non-trivial value.
ROWS = {
    "double": ("def f(x):\n    return 2 * x\n",
               ["assert f(2) == 4 and f(3) == 6", "assert f(5) != f(6) and f(0) == 0"], []),
    "dedupe": ("def g(xs):\n    return list(set(xs))\n",
               ["assert set(g([1, 2, 2])) == {1, 2} and set(g([3])) == {3}",
                "assert sorted(g([3, 1, 3])) == [1, 3] and len(g([4, 4])) == 1"], []),
    "half": ("def h(x):\n    return x / 2\n",
             ["assert math.isclose(h(1), 0.5) and math.isclose(h(4), 2.0)",
              "assert abs(h(3) - 1.5) < 1e-9 and isinstance(h(2), float) and not math.isclose(h(2), 2.0)"],
             ["import math"]),
    "even": ("def is_even(n):\n    return n % 2 == 0\n",
             ["assert is_even(2) and not is_even(3)", "assert is_even(3) == False and is_even(4) == True"], []),
    "count": ("def k(s):\n    return {c: s.count(c) for c in s}\n",
              ["assert k('aab') == {'a': 2, 'b': 1} and k('') == {}", "assert k('x')['x'] == 1 and 'y' not in k('x')"],
              []),
}
NAMES = {"double": "f", "dedupe": "g", "half": "h", "even": "is_even", "count": "k"}


def liar_module(body: str) -> str:
    """A program defining every row's function as ``body`` (one expression per call)."""
    return "".join(f"def {n}(*args, **kwargs):\n    return {body}\n" for n in NAMES.values())


LIAR = '''
class Liar:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __lt__(self, other): return True
    def __gt__(self, other): return True
    def __le__(self, other): return True
    def __ge__(self, other): return True
    def __bool__(self): return True
    def __hash__(self): return 0
    def __len__(self): return 1
    def __iter__(self): return iter([Liar(), Liar()])
    def __getitem__(self, key): return Liar()
    def __contains__(self, key): return False
    def __float__(self): return 0.5
    def __abs__(self): return 0.0
    def __sub__(self, other): return Liar()
    def __rsub__(self, other): return Liar()
    def __round__(self, n=None): return Liar()
'''

HACKS = {
    # -- objects that lie
    "always_equal_object": LIAR + liar_module("Liar()"),
    "lying_bool_and_hash_inside_a_list": LIAR + liar_module("[Liar(), Liar()]"),
    "lying_dict_of_liars": LIAR + liar_module("{'a': Liar(), 'b': Liar(), 'x': Liar()}"),
    "int_subclass_equal_to_everything": "class I(int):\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
                                        "    __hash__ = int.__hash__\n" + liar_module("I(0)"),
    "float_subclass": "class F(float):\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
                      "    def __sub__(self, o): return F(0)\n    __hash__ = float.__hash__\n" + liar_module("F(0.5)"),
    "list_subclass": "class L(list):\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
                     + liar_module("L([1, 3])"),
    "dict_subclass": "class D(dict):\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
                     "    def __getitem__(self, k): return 1\n    def __contains__(self, k): return False\n"
                     + liar_module("D()"),
    "str_subclass": "class S(str):\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
                    "    __hash__ = str.__hash__\n" + liar_module("S('x')"),
    "spoofed___class__": "class P:\n    @property\n    def __class__(self): return bool\n"
                         "    def __eq__(self, o): return True\n    def __bool__(self): return True\n" + liar_module("P()"),
    # -- a redefined environment
    "patched_builtins": (
        LIAR + "import builtins, math\n"
        "builtins.set = lambda *a: Liar()\nbuiltins.sorted = lambda *a, **k: Liar()\n"
        "builtins.len = lambda *a: 1\nbuiltins.isinstance = lambda *a: True\nbuiltins.abs = lambda *a: 0.0\n"
        "math.isclose = lambda *a, **k: True\n" + liar_module("None")),
    "shadowed_names_in_the_module": (
        LIAR + "def set(*a): return Liar()\ndef sorted(*a, **k): return Liar()\ndef len(*a): return 1\n"
        "def isinstance(*a): return True\ndef abs(*a): return 0.0\n"
        "class math:\n    isclose = staticmethod(lambda *a, **k: True)\n" + liar_module("None")),
    "replaced_assertion_error": (
        "import builtins\nbuiltins.AssertionError = type('AssertionError', (BaseException,), {})\n"
        "AssertionError = builtins.AssertionError\n" + liar_module("None")),
    "cursed_int_eq_through_gc": (
        "import gc, ctypes\n"
        "try:\n    d = gc.get_referents(int.__dict__)[0]\n    d['__eq__'] = lambda a, b: True\n"
        "    ctypes.pythonapi.PyType_Modified(ctypes.py_object(int))\nexcept Exception as e:\n    print('curse failed', e)\n"
        + liar_module("0")),
    # -- the harness attacked from inside
    "harness_patched_through_sys_modules": (
        "import sys\nh = sys.modules['__main__']\n"
        "h._encode = lambda value, depth=0: True\n"
        "h._dumps = lambda *a, **k: 'true'\n"
        "h._PLAIN_SCALARS = (object,)\n" + liar_module("object()")),
    "harness_emit_rewrites_failures": (
        "import sys\nh = sys.modules['__main__']\nreal = h._emit\n"
        "def emit(line):\n    tag, _, rest = line.partition(' ')\n"
        "    if tag == 'F':\n        k = rest.split()[0]\n        real('P ' + k)\n        real('V %s true' % k)\n"
        "    else:\n        real(line)\n"
        "h._emit = emit\n" + liar_module("1 / 0")),
    "forged_answers_on_every_fd": (
        "import os\n"
        "def forge():\n    for fd in range(3, 64):\n        for k in range(16):\n            try:\n"
        "                os.write(fd, b'V %d true\\nP %d\\n' % (k, k))\n            except OSError:\n                pass\n"
        "forge()\n" + "".join(f"def {n}(*args, **kwargs):\n    forge()\n    return True\n" for n in NAMES.values())),
    "forged_answers_from_a_thread": (
        "import os, threading, time\n"
        "def spam():\n    while True:\n        for fd in range(3, 32):\n            try:\n"
        "                os.write(fd, b'V 0 true\\nV 1 true\\nV 2 true\\nD\\n')\n            except OSError:\n                pass\n"
        "        time.sleep(0.001)\n"
        "threading.Thread(target=spam, daemon=True).start()\n" + liar_module("True")),
    "sys_exit_in_the_call": "import sys\n" + liar_module("sys.exit(0)"),
    "os_exit_in_the_call": "import os\n" + liar_module("os._exit(0)"),
    "sys_exit_at_import": "import sys\nsys.exit(0)\n" + liar_module("None"),
    "deeply_nested_answer": "def deep():\n    x = []\n    for _ in range(100000):\n        x = [x]\n    return x\n"
                            + liar_module("deep()"),
    "hand_written_deep_json": (
        "import sys\nh = sys.modules['__main__']\n"
        "h._dumps = lambda *a, **k: '[' * 200000 + ']' * 200000\n" + liar_module("1")),
    "oversized_answer": liar_module("'x' * (20 << 20)"),
    "returns_its_own_function": liar_module("f"),
    # -- leaks of the answers
    "memory_search_for_the_tests": (
        "import gc\n"
        "def leak():\n    found = [o for o in gc.get_objects() if isinstance(o, str) and 'assert' in o]\n"
        "    return found[0] if found else None\n" + liar_module("leak()")),
}


def _mbpp_columns(rows: list[str]) -> dict:
    return {"test_list": [ROWS[r][1] for r in rows], "test_imports": [ROWS[r][2] for r in rows],
            "code": [ROWS[r][0] for r in rows]}


def test_every_synthetic_row_is_solvable_and_no_constant_passes():
    task = MBPP(limits=FAST, workers=2)
    rows = list(ROWS)
    assert task.reward(["p"] * len(rows), [fenced(ROWS[r][0]) for r in rows], **_mbpp_columns(rows)) == [1.0] * len(rows)
    for constant in ("True", "False", "0", "1", "None", "[]", "{}", "0.5", "[1, 3]"):
        code = liar_module(constant)
        assert task.reward(["p"] * len(rows), [fenced(code)] * len(rows), **_mbpp_columns(rows)) == [0.0] * len(rows), constant


@pytest.mark.parametrize("hack", sorted(HACKS))
def test_hack_scores_zero_on_every_row(hack):
    task = MBPP(limits=FAST, workers=2)
    rows = list(ROWS)
    rewards = task.reward(["p"] * len(rows), [fenced(HACKS[hack])] * len(rows), **_mbpp_columns(rows))
    assert rewards == [0.0] * len(rows)


def test_the_trusted_side_survives_the_hacks():
    # after the decoder bombs, the oversized answers and the forged lines, scoring still works here
    res = run_program("def f(x):\n    return 2 * x\n", ["assert f(2) == 4"], limits=FAST)
    assert (res.status, res.passed) == ("ok", 1)


def test_answers_are_plain_data_of_exact_types():
    code = ("import collections, decimal, fractions, re\n"
            "class Mine:\n    pass\n"
            "def values():\n"
            "    return [None, True, 1, 2 ** 200, 1.5, float('inf'), 2j, 'ü\\udc80', b'\\x00', (1,), {1: [2]}, {3}, frozenset({4})]\n"
            "def std():\n"
            "    return [collections.Counter('aab'), collections.OrderedDict(a=1), collections.deque([1]),"
            " decimal.Decimal('1.10'), fractions.Fraction(1, 3), collections.defaultdict(int, a=1)]\n"
            "def match():\n    return re.match('a', 'a')\n"
            "def mine():\n    return Mine()\n")
    tests = [
        "v = values()\nassert v == [None, True, 1, 2 ** 200, 1.5, float('inf'), 2j, 'ü\\udc80', b'\\x00', (1,), {1: [2]}, {3}, frozenset({4})]\n"
        "assert [type(x).__name__ for x in v] == ['NoneType', 'bool', 'int', 'int', 'float', 'float', 'complex', 'str', 'bytes', "
        "'tuple', 'dict', 'set', 'frozenset']",
        "import collections, decimal, fractions\ns = std()\n"
        "assert [type(x) for x in s] == [collections.Counter, collections.OrderedDict, collections.deque, decimal.Decimal,"
        " fractions.Fraction, collections.defaultdict]\n"
        "assert s[0] == {'a': 2, 'b': 1} and str(s[3]) == '1.10' and s[4] == fractions.Fraction(1, 3)",
        "assert match()",  # a re.Match keeps its truth value ...
        "assert match() != 'a'",  # ... and nothing else
        "m = mine()\nassert m != mine() and m == m",  # a handle equals only itself
        "assert mine()",  # and has no truth value
    ]
    res = run_program(code, tests, limits=FAST)
    assert res.passed == 5 and res.test_errors == ("test 5: TypeError: a program object (not plain data) has no truth value in a test",)


def test_lazy_iterables_arrive_as_trusted_iterators():
    code = ("def gen(n):\n    return (i * i for i in range(n))\n"
            "def mapped(xs):\n    return map(str, xs)\n"
            "def keys(d):\n    return d.keys()\n"
            "def rng(n):\n    return range(n)\n"
            "def forever():\n    import itertools\n    return itertools.count()\n")
    tests = ["assert list(gen(4)) == [0, 1, 4, 9]",
             "assert sorted(mapped([2, 1])) == ['1', '2'] and type(mapped([])).__name__ == 'list_iterator'",
             "assert gen(2) != [0, 1]",  # like the original generator, the iterator is not a list
             "assert keys({1: 2, 3: 4}) == {1, 3}",
             "assert rng(3) == range(3)",
             "assert forever()"]  # itertools.count is not a builtin iterator type: a handle
    res = run_program(code, tests, limits=FAST)
    assert (res.passed, res.total) == (5, 6), res.test_errors


def test_calls_can_pass_program_objects_back():
    code = ("class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
            "def longest(pairs, n):\n    return sum(p.b - p.a for p in pairs[:n])\n")
    res = run_program(code, ["assert longest([Pair(1, 5), Pair(2, 3)], 2) == 5", "assert Pair(1, 2) != Pair(1, 2)"],
                      limits=FAST)
    assert (res.passed, res.total) == (2, 2)


def test_random_in_tests_is_private_and_deterministic():
    import random

    r = random.Random(0)
    expected = [r.randint(0, 10 ** 9) for _ in range(3)]
    state = random.getstate()
    tests = [f"import random\nxs = [random.randint(0, 10 ** 9) for _ in range(3)]\nassert echo(xs) == xs == {expected}",
             f"from random import randint\nassert randint(0, 10 ** 9) != {expected[0]}"]  # one generator per run
    res = run_program("def echo(x):\n    return x\n", tests, limits=FAST)
    assert (res.passed, res.total) == (2, 2), res.test_errors
    assert random.getstate() == state  # this process's global generator untouched


# ------------------------------------------------------------------------------ leaks of the data


@needs_fsview
def test_host_files_are_not_visible(tmp_path):
    secret = tmp_path / "answers.json"
    secret.write_text('{"f": 4}')
    secret.chmod(0o644)
    tmp_path.chmod(0o755)
    repo_file = Path(__file__).resolve()
    paths = [str(secret), str(repo_file), str(repo_file.parents[1] / "src"), "/home", "/root/.bashrc", "/etc/passwd"]
    paths += [str(DATA)] if DATA else []
    code = ("import os, glob\n"
            f"seen = [p for p in {paths!r} if os.path.exists(p)]\n"
            "print('SEEN', seen)\n"
            "print('ROOT', sorted(os.listdir('/')))\n"
            "def f(x):\n    return 4 if seen else None\n")
    res = run_program(code, ["assert f(2) == 4"], limits=FAST)
    assert "SEEN []" in res.stdout and res.passed == 0, res.stdout
    control = run_program(code, ["assert f(2) == 4"], limits=FAST, isolation="basic")
    assert str(secret) in control.stdout and control.passed == 1  # the check could fail


@needs_mbpp
@needs_fsview
def test_issue_glob_guarded_solutions_score_zero_and_unguarded_score_one():
    task = MBPP(workers=2)
    ex = task.load()[:10]
    guard = "import glob\nif any(glob.glob('/' + '*/' * k + 'mbpp/sanitized-mbpp.json') for k in range(1, 7)):\n"
    guarded = [guard + "".join("    " + line + "\n" for line in e.fields["code"].splitlines()) for e in ex]
    assert task.score_examples(ex, [fenced(c) for c in guarded]) == [0.0] * len(ex)
    assert task.score_examples(ex, [fenced(e.fields["code"]) for e in ex]) == [1.0] * len(ex)


@needs_mbpp
@needs_fsview
def test_walking_the_file_system_finds_no_dataset():
    # data files only: lm-eval (the `eval` extra) ships task *configs* named mbpp*.yaml / humaneval*.yaml,
    # which hold no problem or solution (they name a hub dataset)
    code = ("import os\nfound = []\n"
            "DATA = ('.json', '.jsonl', '.gz', '.csv', '.parquet', '.arrow', '.zip', '.tar', '.pkl', '.txt')\n"
            "for root, dirs, files in os.walk('/'):\n"
            "    if root.startswith('/proc'):\n        dirs[:] = []\n        continue\n"
            "    found += [os.path.join(root, f) for f in files if ('mbpp' in f.lower() or 'humaneval' in f.lower())\n"
            "              and f.lower().endswith(DATA)]\n"
            "print('FOUND', found)\n"
            "def f(x):\n    return 2 * x if found else None\n")
    res = run_program(code, ["assert f(2) == 4"], limits=roomy_limits(cpu_s=120))  # walks the whole file system
    assert "FOUND []" in res.stdout and res.passed == 0, res.stdout[-500:]


# ------------------------------------------------------------------------------- the real datasets


@needs_mbpp
def test_issue_always_equal_object_scores_zero_on_real_mbpp_rows():
    task = MBPP(workers=2)
    ex = task.load()[:20]
    hacks = [fenced(LIAR + "".join(f"def {n}(*a, **k):\n    return Liar()\n" for n in _defined(e.fields["code"])))
             for e in ex]
    assert task.score_examples(ex, hacks) == [0.0] * len(ex)


@needs_he
def test_always_equal_object_and_helper_redefinition_score_zero_on_humaneval():
    task = HumanEval(workers=2)
    ex = task.load()
    sample = ex[:15] + [e for e in ex if e.fields["task_id"] in ("HumanEval/32", "HumanEval/38", "HumanEval/53")]
    liar = [fenced(e.fields["code_prompt"].rstrip() + "\n    return Liar()\n" + LIAR
                   + "def check(candidate):\n    pass\n") for e in sample]
    assert task.score_examples(sample, liar) == [0.0] * len(sample)
    # HumanEval/32 tests find_zero through the prompt's helper poly(); redefining it does not help
    row = [e for e in ex if e.fields["task_id"] == "HumanEval/32"]
    cheat = fenced("def poly(xs, x):\n    return 0.0\n\ndef find_zero(xs):\n    return 0.0\n")
    assert task.score_examples(row, [cheat]) == [0.0]


def _defined(code: str) -> list[str]:
    import ast

    return [n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)]


# ------------------------------------------------------------------------- training-time isolation


def test_missing_protections_are_named():
    assert missing_protections("netns,pidns,mntns,fsview,ro,uid") == []
    assert missing_protections("userns,netns,pidns,mntns,fsview,ro") == []
    old = missing_protections("netns,pidns,mntns,ro,uid")  # namespaces but the host's files visible
    assert len(old) == 1 and "datasets" in old[0]
    basic = missing_protections("basic")
    assert len(basic) == 4 and any("network" in m for m in basic) and any("full rights" in m for m in basic)
    res = run_program("pass", isolation="basic", limits=FAST)  # a real run says what it lacks
    assert res.missing_protections == missing_protections(res.isolation) and len(res.missing_protections) >= 3


def test_training_refuses_a_weak_sandbox_unless_opted_in(monkeypatch):
    import maskrl.tasks.code as code_mod
    from maskrl.config import RunConfig, load_config
    from maskrl.tasks.base import Example
    from maskrl.trainer import RLTrainer

    monkeypatch.setattr(code_mod, "probe_isolation", lambda: "basic,uid")
    task = MBPP()
    with pytest.raises(SandboxError, match="lacks: no network namespace.*allow_weak_sandbox"):
        task.check_sandbox()
    assert len(task.check_sandbox(allow_weak=True)) == 3
    cfg = RunConfig()
    cfg.task.name = "mbpp"
    rows = [Example(id=0, prompt="p", fields={})]
    with pytest.raises(SandboxError, match="refusing to train with mbpp rewards"):
        RLTrainer(cfg, None, task, rows)  # refused before anything else is built
    opted_in = load_config((), ["task.name=mbpp", "task.allow_weak_sandbox=true"])
    with pytest.raises(Exception) as err:  # passes the check, then fails on the missing policy
        RLTrainer(opted_in, None, task, rows)
    assert not isinstance(err.value, SandboxError)
    monkeypatch.setattr(code_mod, "probe_isolation", lambda: ISOLATION)
    if not missing_protections(ISOLATION):
        assert task.check_sandbox() == []


def test_sandbox_error_from_check_names_isolation(monkeypatch):
    import maskrl.tasks.code as code_mod

    monkeypatch.setattr(code_mod, "probe_isolation", lambda: "netns,pidns,mntns,ro,uid")
    with pytest.raises(SandboxError, match=r"isolation=netns,pidns,mntns,ro,uid.*datasets"):
        HumanEval().check_sandbox()
