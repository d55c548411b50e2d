"""`maskrl train` evaluates a validation split every `train.eval_every` steps (issue 23): generated rows
for generated tasks (never the test file), a file through `train.eval_data`; a key that cannot take
effect is an error; the final `model/` carries a model card with the evaluation table."""
import json

import pytest

from maskrl.cli import main
from maskrl.config import ConfigError
from conftest import TINY_CLI, TINY_RL, cli_sets

TINY = TINY_CLI + cli_sets(*TINY_RL, "eval.steps=4", "eval.block_length=8", "train.steps=2", "train.report_to=[]")


def _train(tmp_path, *extra):
    return main(["train", "--config", "configs/countdown_diffu_grpo.yaml", *TINY, "--set", f"output_dir={tmp_path}/run",
                 *extra])


def test_eval_every_logs_validation_metrics_and_the_model_card(tmp_path):
    assert _train(tmp_path, "--set", "train.eval_every=1", "--set", "train.eval_limit=5") == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert 0.0 <= r["eval/accuracy"] <= 1.0 and r["eval/n"] == 5
    card = (tmp_path / "run" / "model" / "README.md").read_text()
    assert "countdown" in card and "## Evaluation" in card and "| step 2 (validation, generated:seed=" in card
    assert "Recipe (resolved configuration)" in card and "eval_every: 1" in card


def test_validation_rows_are_not_test_or_training_rows(tmp_path):
    from maskrl.config import load_config
    from maskrl.pipeline import drop_rows, task_and_data, validation_examples

    cfg = load_config(["configs/countdown_diffu_grpo.yaml"], ["task.train_size=300", "train.eval_every=1",
                                                              "train.eval_limit=50"])
    task, test, source, train = task_and_data(cfg)
    val, where = validation_examples(cfg, task, test)
    assert len(val) == 50 and where.startswith("generated:")
    key = task.instance_key
    assert not {key(e) for e in val} & {key(e) for e in test}
    train = drop_rows(train, task, val)
    assert not {key(e) for e in val} & {key(e) for e in train}


def test_eval_every_without_a_validation_source_is_an_error(tmp_path):
    from maskrl.config import load_config
    from maskrl.pipeline import validation_examples
    from maskrl.tasks import get_task

    cfg = load_config([], ["task.name=gsm8k", "train.eval_every=5"])
    with pytest.raises(ConfigError, match="train.eval_data"):
        validation_examples(cfg, get_task("gsm8k"), [])


def test_trainer_without_eval_fn_refuses_eval_every(tmp_path, tiny):
    from conftest import OddChars, small_cfg
    from maskrl.tasks.base import Example
    from maskrl.trainer import RLTrainer

    tr = RLTrainer(small_cfg(tmp_path, **{"train.eval_every": 1}), tiny, OddChars(),
                   [Example(id=i, prompt=f"p{i}") for i in range(4)])
    with pytest.raises(ConfigError, match="train.eval_every=1"):
        tr.train(steps=1, progress=False)


@pytest.mark.parametrize("sets, key", [(["train.eval_data=val.jsonl"], "train.eval_data"),
                                       (["train.eval_limit=50"], "train.eval_limit"),
                                       (["eval.mismatch_every=2"], "eval.mismatch_every")])
def test_keys_that_cannot_take_effect_are_errors(sets, key):
    from maskrl.config import load_config

    with pytest.raises(ConfigError, match=key):
        load_config([], sets)
