"""Bring your own data and reward (issue 23): the `file` task trains from YAML alone on a user's JSONL
with a user's reward function in TRL's call shape; CSV and `datasets` folders read the same way."""
import json

import pytest
import yaml

from maskrl.cli import main
from maskrl.config import ConfigError, load_config
from maskrl.tasks.base import DataError

REWARD = '''
import json, os

def my_reward(prompts, completions, answer, level, **columns):
    with open(os.environ["REWARD_LOG"], "a") as fh:
        fh.write(json.dumps({"prompts": prompts, "n": len(completions), "answer": answer, "level": level,
                             "other": sorted(columns)}) + "\\n")
    return [0.25 if lv == "easy" else 0.75 for lv in level]
'''


def _files(tmp_path):
    rows = [{"question": f"{a}+{a}", "answer": str(2 * a), "level": "easy" if a % 2 else "hard"} for a in range(12)]
    for name, part in (("train.jsonl", rows[:8]), ("test.jsonl", rows[8:])):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in part))
    (tmp_path / "user_reward.py").write_text(REWARD)
    return rows


def test_user_jsonl_and_reward_train_two_steps_from_yaml_alone(tmp_path, monkeypatch):
    _files(tmp_path)
    monkeypatch.setenv("REWARD_LOG", str(tmp_path / "calls.jsonl"))
    recipe = {"output_dir": str(tmp_path / "run"),
              "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}},
              "task": {"name": "file", "prompt_template": "Q {question} =", "data_path": str(tmp_path / "test.jsonl"),
                       "file": {"train": str(tmp_path / "train.jsonl"), "answer": "answer",
                                "reward": f"{tmp_path / 'user_reward.py'}:my_reward"}},
              "rollout": {"gen_length": 4, "block_length": 4, "steps": 2, "temperature": 1.0},
              "train": {"steps": 2, "prompts_per_step": 2, "group_size": 2, "inner_iterations": 1, "report_to": []}}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["train", "--config", str(tmp_path / "recipe.yaml")]) == 0
    calls = [json.loads(x) for x in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert len(calls) == 2 and all(c["n"] == 4 for c in calls)  # 2 steps x (2 prompts x 2 completions)
    train_q = {f"Q {a}+{a} =" for a in range(8)}
    for c in calls:
        assert set(c["prompts"]) <= train_q and c["other"] == ["question"]  # every column reaches the reward
        assert all(ans == str(2 * int(p.split()[1].split("+")[0])) for p, ans in zip(c["prompts"], c["answer"]))
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for m, c in zip(metrics, calls):
        assert m["reward"] == pytest.approx(sum(0.25 if lv == "easy" else 0.75 for lv in c["level"]) / 4)
    card = json.loads((tmp_path / "run" / "model" / "maskrl_prompt.json").read_text())
    assert card["task"] == "file" and card["task_options"]["reward"] == f"{tmp_path / 'user_reward.py'}:my_reward"
    # the saved model is evaluated by `maskrl eval` with the user's reward, read from its prompt card
    before = len((tmp_path / "calls.jsonl").read_text().splitlines())
    assert main(["eval", "--model", str(tmp_path / "run" / "model"), "--task", "file", "--data",
                 str(tmp_path / "test.jsonl"), "--gen-length", "4", "--block-length", "4", "--out", str(tmp_path / "eval")]) == 0
    evals = [json.loads(x) for x in (tmp_path / "calls.jsonl").read_text().splitlines()[before:]]
    assert sum(c["n"] for c in evals) == 4 and {p for c in evals for p in c["prompts"]} == {f"Q {a}+{a} =" for a in
                                                                                         range(8, 12)}
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["results"][0]["mean_reward"] == pytest.approx(0.5)  # test rows 8..11: hard, easy, hard, easy


def test_csv_and_datasets_folder_read_like_jsonl(tmp_path):
    import datasets

    from maskrl.tasks import get_task

    rows = _files(tmp_path)
    (tmp_path / "d.csv").write_text("question,answer,level\n" + "".join(f"{r['question']},{r['answer']},{r['level']}\n"
                                                                       for r in rows))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "folder"))
    task = get_task("file", "{question}=", answer="answer")
    a, b, c = (task.load(tmp_path / n) for n in ("test.jsonl", "d.csv", "folder"))
    assert [e.prompt for e in b] == [e.prompt for e in c] == [f"{r['question']}=" for r in rows]
    assert [e.prompt for e in a] == [f"{r['question']}=" for r in rows[8:]]
    assert str(b[3].fields["answer"]) == "6" and task.target(c[3]) == "6"
    assert task.score_examples(c[:2], ["0", "5"]) == [1.0, 0.0]  # default reward: exact match


def test_bad_rows_and_keys_are_named(tmp_path):
    from maskrl.tasks import get_task

    (tmp_path / "bad.jsonl").write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl: row 2: no value in column\(s\) answer"):
        get_task("file", "{question}=").load(tmp_path / "bad.jsonl")
    with pytest.raises(DataError, match=r"row 1: no value in column\(s\) topic"):
        get_task("file", "{topic}: {question}=").load(tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match="task.file.reward: cannot import 'no_such_module_xyz'"):
        get_task("file", "{question}=", reward="no_such_module_xyz:f")
    with pytest.raises(ValueError, match="task.file.reward: 'nocolon' is not of the form"):
        get_task("file", "{question}=", reward="nocolon")
    with pytest.raises(ValueError, match="task.prompt_template"):
        get_task("file").load(tmp_path / "bad.jsonl")
    with pytest.raises(ConfigError, match="task.file: only read by task.name: file"):
        load_config([], ["task.file.train=x.jsonl"])


def test_malformed_or_empty_jsonl_names_the_line_and_a_failing_reward_is_one_error(tmp_path):
    from maskrl.tasks.file_task import FileTask, read_rows

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": \n')
    with pytest.raises(DataError, match=r"bad.jsonl.*line 2: not valid JSON"):
        read_rows(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match=r"empty.jsonl"):
        read_rows(empty)
    (tmp_path / "r.py").write_text("def f(prompts, completions, answer, **kw):\n    return [len(a) for a in answer]\n")
    task = FileTask("{question}=", answer="answer", reward=f"{tmp_path / 'r.py'}:f")
    with pytest.raises(ValueError, match=r"task.file.reward .*r.py:f.* raised TypeError.*answer: int"):
        task.reward(["1+2="], ["3"], answer=[3])


CELLS = ["007", "100", "0.50", "10", "None", "NA", "null", "", "1e3", " 2 ", "-0", "N/A", "nan", "TRUE"]


def test_csv_cells_are_read_as_their_text(tmp_path):
    """Issue 50 §2: `007, 100, 0.50, 10` were read as 7.0, 100.0, 0.5, 10.0 and `None`/`NA`/`null`
    as missing values; every cell is its text, the SFT target is it and exact match accepts it."""
    from maskrl.tasks import get_task

    f = tmp_path / "cells.csv"
    f.write_text("question,answer\n" + "".join(f"q{i},\"{c}\"\n" if c != "" else f"q{i},\n"
                                                for i, c in enumerate(CELLS)))
    task = get_task("file", "{question}:{answer}", answer="answer")
    rows = task.load(f)
    assert [ex.fields["answer"] for ex in rows] == CELLS
    assert [task.target(ex) for ex in rows] == CELLS
    assert [ex.prompt for ex in rows] == [f"q{i}:{c}" for i, c in enumerate(CELLS)]
    assert task.score_examples(rows[:4], ["007", "100", "0.50", "10"]) == [1.0] * 4
    assert task.score_examples(rows[:3], ["7", "100.0", "0.5"]) == [0.0] * 3


def test_jsonl_strings_and_numbers_keep_their_text(tmp_path):
    from maskrl.tasks import get_task

    f = tmp_path / "cells.jsonl"
    lines = [json.dumps({"q": f"q{i}", "answer": c}) for i, c in enumerate(CELLS)]
    lines += ['{"q": "n1", "answer": 0.50}', '{"q": "n2", "answer": 100}', '{"q": "n3", "answer": 1e3}',
              '{"q": "n4", "answer": -0.0, "extra": true}', '{"q": "n5", "answer": 12345678901234567890.10}']
    f.write_text("\n".join(lines) + "\n")
    rows = get_task("file", "{q}", answer="answer").load(f)
    assert [ex.fields["answer"] for ex in rows] == CELLS + ["0.50", "100", "1e3", "-0.0", "12345678901234567890.10"]
    assert rows[0].fields["extra"] is None and rows[-2].fields["extra"] is True  # one set of columns
    arr = tmp_path / "cells.json"
    arr.write_text("[" + ",\n".join(lines) + "]")
    assert [ex.fields for ex in get_task("file", "{q}", answer="answer").load(arr)] == [ex.fields for ex in rows]


def test_json_null_and_short_csv_rows_are_missing_values_named_by_row(tmp_path):
    from maskrl.tasks import get_task

    (tmp_path / "n.jsonl").write_text('{"q": "a", "answer": "1"}\n{"q": "b", "answer": null}\n')
    with pytest.raises(DataError, match=r"n.jsonl: row 2: no value in column\(s\) answer"):
        get_task("file", "{q}").load(tmp_path / "n.jsonl")
    (tmp_path / "s.csv").write_text("q,answer\na,1\nb\n")
    with pytest.raises(DataError, match=r"s.csv: row 2: no value in column\(s\) answer"):
        get_task("file", "{q}").load(tmp_path / "s.csv")


@pytest.mark.parametrize("name, text, why", [
    ("empty.csv", "", r"empty.csv: the file is empty"),
    ("hdr.csv", "question,answer\n", r"hdr.csv: no rows after the header"),
    ("wide.csv", "q,answer\na,1\nb,2,3\n", r"wide.csv: line 3: 3 cells but the header has 2 columns"),
    ("dup.csv", "q,q\na,1\n", r"dup.csv: line 1: column 'q' appears 2 times"),
    ("arr.jsonl", '{"q": "a"}\n[1, 2]\n', r"arr.jsonl: line 2: not a JSON object"),
    ("bad.json", '[{"q": "a"},\n {"q": }]', r"bad.json: line 2: not valid JSON"),
    ("bin.csv", b"q,answer\n\xff\xfe,1\n", r"bin.csv: cannot read as UTF-8"),
])
def test_unreadable_files_are_one_line_naming_file_and_line(tmp_path, name, text, why):
    from maskrl.tasks.file_task import read_rows

    f = tmp_path / name
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(DataError, match=why) as e:
        read_rows(f)
    assert "\n" not in str(e.value) and "datasets" not in str(e.value) and e.value.__cause__ is None


def test_a_template_that_cannot_format_a_text_cell_names_the_row(tmp_path):
    from maskrl.tasks import get_task

    (tmp_path / "d.csv").write_text("x,answer\n0.5,1\n")
    with pytest.raises(DataError, match=r"d.csv: row 1: task.prompt_template '\{x:.2f\}' cannot be filled"):
        get_task("file", "{x:.2f}").load(tmp_path / "d.csv")
    (tmp_path / "junk").mkdir()
    with pytest.raises(DataError, match=r"junk: not a datasets save_to_disk folder"):
        get_task("file", "{x}").load(tmp_path / "junk")


def test_an_sft_target_longer_than_the_completion_names_the_row_its_text_and_the_key(tmp_path, capsys):
    """Was 'example 0: target has 19 tokens > gen_length=8': no text to find the row by, no config key."""
    rows = _files(tmp_path)
    rows[3]["answer"] = "1234567890"
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:8]))
    recipe = {"output_dir": str(tmp_path / "run"),
              "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}},
              "task": {"name": "file", "prompt_template": "Q {question} =", "data_path": str(tmp_path / "test.jsonl"),
                       "file": {"train": str(tmp_path / "train.jsonl")}},
              "rollout": {"gen_length": 4, "block_length": 4, "steps": 2}, "eval": {"gen_length": 4, "block_length": 4,
                                                                                    "steps": 2},
              "sft": {"steps": 1, "batch_size": 2}}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["sft", "--config", str(tmp_path / "recipe.yaml"), "--out", str(tmp_path / "sft")]) == 2
    err = capsys.readouterr().err
    assert ("training example 3 (prompt 'Q 3+3 ='): its SFT target '1234567890' is 10 tokens, more than "
            "the completion length rollout.gen_length = 4") in err, err
