import pytest

from maskrl.cli import main
from maskrl.config import ConfigError, load_config, parse_override


def test_override_parsing_and_types(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("train:\n  lr: 1e-4\n  steps: 5\nrollout:\n  gen_length: 32\n  block_length: 8\n  steps: 16\n")
    cfg = load_config([y], ["train.steps=7", "objective.beta=0", "rollout.temperature=0.5"])
    assert cfg.train.lr == pytest.approx(1e-4) and cfg.train.steps == 7
    assert cfg.objective.beta == 0.0 and cfg.rollout.temperature == 0.5 and cfg.rollout.gen_length == 32
    assert parse_override("a.b.c=[1, 2]") == {"a": {"b": {"c": [1, 2]}}}


def test_unknown_key_names_it_and_lists_valid_ones():
    with pytest.raises(ConfigError) as e:
        load_config([], ["train.lrr=1e-4"])
    assert "train.lrr" in str(e.value) and "lr" in str(e.value) and "inner_iterations" in str(e.value)
    with pytest.raises(ConfigError, match="'trian'"):
        load_config([], ["trian.lr=1"])


def test_bad_values_name_the_key():
    with pytest.raises(ConfigError, match="train.steps"):
        load_config([], ["train.steps=many"])
    with pytest.raises(ConfigError, match="rollout.*block_length"):
        load_config([], ["rollout.gen_length=10", "rollout.block_length=4"])
    with pytest.raises(ConfigError, match="must look like"):
        parse_override("train.steps")


def test_cli_reports_config_typo(capsys):
    assert main(["train", "--set", "train.stepz=3"]) == 2
    err = capsys.readouterr().err
    assert "train.stepz" in err and "valid keys" in err


def test_every_shipped_config_loads():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "configs"
    files = [p for p in root.glob("*.yaml")]
    assert files, "configs/ has no YAML recipes"
    for p in files:
        load_config([p])


@pytest.mark.parametrize("item,key", [
    ("sft.batch_size=0", "sft.batch_size"), ("train.group_size=0", "train.group_size"),
    ("sft.steps=-1", "sft.steps"), ("train.lr=-1e-5", "train.lr"), ("model.tiny.num_heads=5", "model.tiny.num_heads"),
    ("likelihood.p_mask_prompt=1.5", "likelihood.p_mask_prompt"), ("train.prompts_per_step=0", "train.prompts_per_step"),
])
def test_out_of_range_values_name_the_key(item, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config([], [item])


def test_missing_and_broken_yaml_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config([tmp_path / "nope.yaml"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {tiny: [1\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config([bad])


def test_partial_section_keeps_the_run_defaults():
    cfg = load_config([], ["rollout.temperature=0.5"])
    assert (cfg.rollout.gen_length, cfg.rollout.block_length, cfg.rollout.temperature) == (16, 16, 0.5)
    assert cfg.eval.temperature == 0.0
