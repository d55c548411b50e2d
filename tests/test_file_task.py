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
