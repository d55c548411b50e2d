"""What the user wrote is what is read: a key repeated in one YAML mapping is an error naming the key
and both lines (issue 50 §2), in config files, ``--set`` values and accelerate configs."""
import pytest

from maskrl.config import ConfigError, load_config
from maskrl.yamlfile import DuplicateKeyError, load_yaml


@pytest.mark.parametrize("text, key, where, lines", [
    ("train:\n  lr: 0.001\n  steps: 5\nrollout:\n  gen_length: 8\ntrain:\n  lr: 1.0e-5\n", "train", "", (1, 6)),
    ("train:\n  lr: 0.001\n  steps: 5\n  lr: 0.002\n", "lr", "train", (2, 4)),
    ("task:\n  file:\n    answer: a\n    reward: ''\n    answer: b\n", "answer", "task.file", (3, 5)),
    ("credit:\n  - name: dtca\n    lam: 1\n    lam: 2\n", "lam", "credit[0]", (3, 4)),
    ("train: {lr: 1, lr: 2}\n", "lr", "train", (1, 1)),
    ("1: a\n2: b\n1: c\n", 1, "", (1, 3)),
    ("'a': 1\na: 2\n", "a", "", (1, 2)),  # the same key, quoted or not
])
def test_a_repeated_key_names_the_key_and_both_lines(text, key, where, lines):
    with pytest.raises(DuplicateKeyError) as e:
        load_yaml(text)
    assert (e.value.key, e.value.first_line, e.value.second_line) == (key, *lines)
    assert f"line {lines[0]} and line {lines[1]}" in str(e.value) and repr(key) in str(e.value)
    assert (f"in {where!r}" in str(e.value)) == bool(where)


def test_yaml_without_repeats_reads_as_safe_load():
    import yaml

    text = "base: &b {x: 1, y: [1, 2]}\nd:\n  <<: *b\n  x: 2\nlist:\n  - {a: 1}\n  - {a: 1}\nn: null\n"
    assert load_yaml(text) == yaml.safe_load(text) == {
        "base": {"x": 1, "y": [1, 2]}, "d": {"x": 2, "y": [1, 2]}, "list": [{"a": 1}, {"a": 1}], "n": None}
    assert load_yaml("") is None


def test_a_config_with_a_section_twice_is_refused_not_read_as_the_defaults(tmp_path):
    y = tmp_path / "run.yaml"
    y.write_text("train:\n  lr: 0.001\n  steps: 5\ntask:\n  name: countdown\ntrain:\n  seed: 3\n")
    with pytest.raises(ConfigError, match=r"run\.yaml: key 'train' is repeated: line 1 and line 6"):
        load_config([y])
    y.write_text("train:\n  lr: 0.001\n  steps: 5\n  lr: 0.002\n")
    with pytest.raises(ConfigError, match=r"run\.yaml: key 'lr' in 'train' is repeated: line 2 and line 4"):
        load_config([y])
    y.write_text("train:\n  lr: 0.001\n  steps: 5\n")  # the same file without the repeat is read as written
    cfg = load_config([y])
    assert (cfg.train.lr, cfg.train.steps) == (0.001, 5)


def test_a_set_value_with_a_repeated_key_is_refused():
    with pytest.raises(ConfigError, match=r"train: in the value .*key 'lr' is repeated"):
        load_config([], ["train={lr: 0.1, lr: 0.2}"])


def test_an_accelerate_config_with_a_repeated_key_is_refused(tmp_path):
    from maskrl.plan.shapes import PlanError, strategy_from_accelerate

    f = tmp_path / "acc.yaml"
    f.write_text("distributed_type: FSDP\nnum_processes: 2\ndistributed_type: MULTI_GPU\n")
    with pytest.raises(PlanError, match=r"key 'distributed_type' is repeated: line 1 and line 3"):
        strategy_from_accelerate(str(f), 2)
