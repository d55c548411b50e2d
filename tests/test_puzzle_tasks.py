import pytest

from maskrl.tasks import DataError, get_task
from maskrl.tasks.countdown import countdown_reward, parse_equation, solve
from maskrl.tasks.sudoku import all_grids, cell_reward, is_valid_grid, solutions_of

PUZ, SOL = "3102200002100320", "3142243142131324"


def test_sudoku_grid_facts():
    assert len(all_grids()) == 288
    assert is_valid_grid(SOL) and not is_valid_grid("1" * 16)
    assert solutions_of(PUZ) == [SOL]


@pytest.mark.parametrize("completion,expected", [
    (SOL, 1.0),
    ("3142 2431 4213 1324", 1.0),                # spacing ignored
    ("<answer>3142243142131324</answer>xx", 1.0),
    ("3142243142131323", 7 / 8),                  # last blank wrong
    ("31422431", 4 / 8),                          # blanks 2, 5, 6, 7 right; cells 8..15 missing
    ("", 0.0),
    ("garbage ☃ no digits", 0.0),
    ("0" * 40, 0.0),
])
def test_sudoku_reward_golden(completion, expected):
    assert cell_reward(PUZ, SOL, completion) == pytest.approx(expected)


def test_sudoku_loads_the_real_test_file():
    task = get_task("sudoku4x4")
    rows = task.load()
    assert len(rows) == 500
    assert all(ex.fields["puzzle"].count("0") == 8 for ex in rows)
    m = task.metrics(rows[:2], ["", ""], [1.0, 0.5])
    assert m["accuracy"] == 0.5 and m["cell_accuracy"] == 0.75


def test_sudoku_generated_training_never_contains_test_puzzles():
    task = get_task("sudoku4x4")
    test = task.load()
    keys = {task.instance_key(e) for e in test}
    train = task.generate(1000, seed=1234, exclude=keys)
    assert not keys & {task.instance_key(e) for e in train}
    assert all(len(solutions_of(e.fields["puzzle"])) == 1 for e in train[:200])
    # the filter does work: excluding a seed's own puzzles yields none of them again
    first = {task.instance_key(e) for e in task.generate(100, seed=7)}
    again = {task.instance_key(e) for e in task.generate(100, seed=7, exclude=first)}
    assert first == {task.instance_key(e) for e in task.generate(100, seed=7)} and not first & again


def test_sudoku_malformed_rows_name_file_and_line(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text(f"Puzzle,Solution\n{PUZ},{SOL}\n31022,{SOL}\n")
    with pytest.raises(DataError, match=r"bad.csv:3: Puzzle"):
        get_task("sudoku4x4").load(p)
    p.write_text(f"Puzzle,Solution\n{PUZ},{SOL[::-1]}\n")
    with pytest.raises(DataError, match=r"bad.csv:2"):
        get_task("sudoku4x4").load(p)
    p.write_text(f"Puzzle,Solution\n{PUZ},{SOL},{SOL}\n")  # csv.DictReader keeps extra cells under key None
    with pytest.raises(DataError, match=r"bad.csv:2: 3 cells but the header has 2 columns"):
        get_task("sudoku4x4").load(p)


@pytest.mark.parametrize("task,name,text", [
    ("sudoku4x4", "bad.csv", f"Puzzle,Solution\n{PUZ},{SOL}\n"),
    ("mbpp", "bad.json", '[{"task_id": 1, "prompt": "p", "code": "c", "test_list": ["assert 1"]}]'),
])
@pytest.mark.parametrize("encoding", ["latin-1", "utf-16"])
def test_a_data_file_that_is_not_utf8_is_named(tmp_path, task, name, text, encoding):
    """Sudoku's CSV reader and the code tasks' JSON reader let UnicodeDecodeError through, whose message
    ('utf-8' codec can't decode byte 0xff in position 16) names no file."""
    p = tmp_path / name
    p.write_bytes(text.replace(",", ",\u00e9", 1).encode(encoding))
    with pytest.raises(DataError, match=rf"^{p}: not UTF-8 text \(byte \d+"):
        get_task(task).load(p)


@pytest.mark.parametrize("text,expected", [
    ("30-(100-93)", 1.0),
    ("30 - (100 - 93) = 23", 1.0),
    ("<answer>(93-100)+30</answer>", 1.0),
    ("30−(100−93)", 1.0),                 # unicode minus
    ("30+100+93", 0.1),                   # well-formed, wrong value
    ("30-(100-93)+0", 0.1),               # extra number
    ("100-93", 0.1),                      # missing number
    ("30/(100-100)", 0.1),                # division by zero: well-formed, wrong
    ("", 0.0), ("hello", 0.0), ("30-(100-", 0.0),
    ("__import__('os').system('x')", 0.0),
    ("2**100", 0.0),                      # power not whitelisted
    ("-30+100-93", 0.0),                  # unary minus not whitelisted
    ("1" * 500, 0.0),                     # too long
])
def test_countdown_reward_golden(text, expected):
    assert countdown_reward([30, 100, 93], 23, text) == pytest.approx(expected)


def test_countdown_never_evals(monkeypatch):
    import builtins

    def boom(*a, **k):
        raise AssertionError("eval called")

    monkeypatch.setattr(builtins, "eval", boom)
    assert parse_equation("1+2*3")[0] == 7


def test_countdown_real_file_and_solver():
    task = get_task("countdown")
    rows = task.load()
    assert len(rows) == 256
    for ex in rows[:40]:
        eq = solve(ex.fields["numbers"], ex.fields["target"])
        assert eq is not None and countdown_reward(ex.fields["numbers"], ex.fields["target"], eq) == 1.0
    train = task.generate(200, seed=3, exclude=[task.instance_key(e) for e in rows])
    assert all(task.score_examples([e], [task.target(e)]) == [1.0] for e in train[:50])
    assert not {task.instance_key(e) for e in train} & {task.instance_key(e) for e in rows}


def test_countdown_malformed_rows(tmp_path):
    p = tmp_path / "cd.jsonl"
    p.write_text('{"input": "1,2,3", "output": "6"}\n{"input": "1,x", "output": "3"}\n')
    with pytest.raises(DataError, match=r"cd.jsonl:2"):
        get_task("countdown").load(p)
    p.write_text('{"input": "1,2,3"}\n')
    with pytest.raises(DataError, match=r"cd.jsonl:1: missing field 'output'"):
        get_task("countdown").load(p)
    p.write_text('not json\n')
    with pytest.raises(DataError, match=r"cd.jsonl:1: not valid JSON"):
        get_task("countdown").load(p)


def test_unknown_task_lists_valid_names():
    with pytest.raises(KeyError, match="sudoku4x4"):
        get_task("sudoku9x9")


def test_jsonschema_reward_survives_deeply_nested_garbage():
    task = get_task("jsonschema")
    rows = task.load(limit=1)
    assert task.score_examples(rows * 3, ["[" * 5000, "{" * 5000 + "}", "[[[[" * 3000]) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("template, match", [("{puzzle}{foo}=", r"unknown placeholder\(s\) \{foo\}; available: \{puzzle\}"),
                                             ("{puzzle}{}=", r"unknown placeholder"),
                                             ("{puzzle}={", r"not a valid str.format template")])
def test_prompt_template_with_an_unknown_or_broken_placeholder_is_refused_at_once(template, match):
    from maskrl.tasks import get_task

    with pytest.raises(ValueError, match=match):
        get_task("sudoku4x4", template)
    assert get_task("sudoku4x4", "{puzzle}= {{literal}}").prompt_template == "{puzzle}= {{literal}}"
