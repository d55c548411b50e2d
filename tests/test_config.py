from pathlib import Path

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
    # were 'dropout probability has to be between 0 and 1, but got 2.0' from torch once LoRA was built, and
    # a negative LoRA scale, silently
    ("model.lora_dropout=2", "model.lora_dropout"), ("model.lora_dropout=1", "model.lora_dropout"),
    ("model.lora_dropout=-0.1", "model.lora_dropout"), ("model.lora_alpha=-1", "model.lora_alpha"),
    ("model.lora_alpha=0", "model.lora_alpha"),
])
def test_out_of_range_values_name_the_key(item, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config([], [item])


@pytest.mark.parametrize("key", ["train.lr", "train.max_grad_norm", "sft.lr", "objective.clip_eps", "objective.beta",
                                 "rollout.temperature", "rollout.cfg_scale", "rollout.eb_threshold", "eval.temperature"])
@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "nan", "inf"])
def test_non_finite_numbers_are_refused_naming_the_key(key, value):
    """A NaN passed every range check (``lr <= 0``, ``beta < 0``, ``temperature < 0`` are all false for NaN):
    train.lr NaN, objective.clip_eps NaN and rollout.temperature NaN were accepted by the config."""
    with pytest.raises(ConfigError, match=rf"^{key.replace('.', chr(92) + '.')}: expected a finite number, got "):
        load_config([], [f"{key}={value}"])


@pytest.mark.parametrize("item,why", [
    ("train.group_size=1", r"train\.group_size: must be >= 2, got 1: .*every advantage is 0"),
    ("train.steps=0", r"train\.steps: must be >= 1, got 0: .*train nothing"),
])
def test_settings_that_leave_every_gradient_zero_are_refused(item, why):
    """Issue 20 item 3: G = 1 makes every group-relative advantage 0; 0 steps train nothing."""
    with pytest.raises(ConfigError, match=why):
        load_config([], [item])
    load_config([], [item.split("=")[0] + "=2"])


def test_greedy_rollouts_without_credit_modules_are_refused():
    """Greedy, confidence-ordered rollouts make a group's completions identical: every advantage 0."""
    with pytest.raises(ConfigError, match=r"rollout\.temperature: 0 .* identical.*every gradient is 0"):
        load_config([], ["rollout.temperature=0"])
    load_config([], ["rollout.temperature=0", "rollout.remasking=random"])  # random order differs per completion
    load_config([], ["rollout.temperature=0", "credit=[{name: dispo}]"])    # DiSPO branches with its own τ


def test_missing_and_broken_yaml_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config([tmp_path / "nope.yaml"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {tiny: [1\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config([bad])


def test_a_config_file_that_is_not_utf8_or_is_a_folder_is_one_line_naming_it(tmp_path):
    """A UTF-16 / Latin-1 YAML file gave "'utf-8' codec can't decode byte 0xff in position 0", naming no file;
    a folder was 'does not exist'; a YAML syntax error ran over three lines."""
    bad = tmp_path / "utf16.yaml"
    bad.write_bytes("train:\n  lr: 0.1\n".encode("utf-16"))
    with pytest.raises(ConfigError, match=rf"^{bad}: not UTF-8 text \(byte 0: "):
        load_config([bad])
    with pytest.raises(ConfigError, match=rf"^config file {tmp_path} is a folder, not a YAML file$"):
        load_config([tmp_path])
    tab = tmp_path / "tab.yaml"
    tab.write_text("rollout:\n  gen_length: 16\n\tsteps: 3\n")
    with pytest.raises(ConfigError, match=r"tab\.yaml: not valid YAML \(.*line 3, column 1\)$") as e:
        load_config([tab])
    assert "\n" not in str(e.value)
    from maskrl.plan import PlanError, strategy_from_accelerate

    with pytest.raises(PlanError, match=rf"^--accelerate-config: cannot read {bad}: not UTF-8 text \(byte 0"):
        strategy_from_accelerate(str(bad), 8)


@pytest.mark.parametrize("item, shown", [("credit=[1, 2]", "1"), ("credit=[[dps]]", r"\['dps'\]"),
                                         ("credit=[true]", "True")])
def test_a_credit_entry_that_is_not_a_mapping_or_name_names_its_index(item, shown):
    """Was '1 is not a registered credit module', naming neither the key nor the entry's place."""
    with pytest.raises(ConfigError, match=rf"^credit\[0\]: expected a mapping {{name: \.\.\., \.\.\.}} or a credit "
                                          rf"name, got {shown}$"):
        load_config([], [item])


def test_partial_section_keeps_the_run_defaults():
    cfg = load_config([], ["rollout.temperature=0.5"])
    assert (cfg.rollout.gen_length, cfg.rollout.block_length, cfg.rollout.temperature) == (16, 16, 0.5)
    assert cfg.eval.temperature == 0.0


# ------------------------------------------------------------------ components own their config
@pytest.mark.parametrize("item, where", [
    ("objective.likelihood=state", "likelihood.name"),
    ("objective.p_mask_prompt=0.3", "likelihood.p_mask_prompt"),
])
def test_old_flat_keys_say_where_they_moved(item, where):
    with pytest.raises(ConfigError, match=rf"{item.split('=')[0]} has moved to {where}"):
        load_config([], [item])


def test_components_are_built_from_their_sections():
    from maskrl.likelihood import MeanField, State
    from maskrl.objectives import DiffuGRPO

    cfg = load_config([], [])
    assert cfg.objective == DiffuGRPO() and cfg.likelihood == MeanField() and cfg.credit == []
    cfg = load_config([], ["likelihood=state", "objective.beta=0"])  # a bare name is a section
    assert cfg.likelihood == State() and cfg.objective == DiffuGRPO(beta=0.0)
    # a section without a name keeps the run's component and changes only its fields
    assert load_config([], ["likelihood.p_mask_prompt=0.3"]).likelihood == MeanField(p_mask_prompt=0.3)
    # YAML 1.1 reads 1e-4 as a string: coerced by the field's type, as in every section
    assert load_config([], ["objective.clip_eps=2e-1"]).objective.clip_eps == pytest.approx(0.2)
    with pytest.raises(ConfigError, match=r"unknown key 'objective\.lr'; valid keys under objective: aggregation, "
                                          r"beta, clip_eps, normalize"):
        load_config([], ["objective.lr=1"])
    with pytest.raises(ConfigError, match=r"objective\.name: unknown objective 'grpo'; valid: diffu_grpo"):
        load_config([], ["objective.name=grpo"])
    with pytest.raises(ConfigError, match=r"objective\.normalize: normalize 'median' is not one of"):
        load_config([], ["objective.normalize=median"])
    with pytest.raises(ConfigError, match=r"objective\.beta: expected a number, got 'high'"):
        load_config([], ["objective.beta=high"])
    with pytest.raises(ConfigError, match=r"credit: expected a list"):
        load_config([], ["credit=dps"])


def test_config_round_trips_through_plain_data(tmp_path):
    import yaml

    from maskrl.config import to_dict

    cfg = load_config([Path(__file__).resolve().parents[1] / "configs" / "demo_sudoku.yaml"])
    y = tmp_path / "again.yaml"
    y.write_text(yaml.safe_dump(to_dict(cfg)))
    assert load_config([y]) == cfg
    assert to_dict(cfg)["likelihood"] == {"name": "state", "p_mask_prompt": 0.15}


def test_config_explain_lists_every_field_with_its_doc(capsys):
    import dataclasses

    from maskrl.config import _SECTIONS, explain, field_docs
    from maskrl.likelihood import LIKELIHOODS
    from maskrl.objectives import OBJECTIVES

    # every field of every section and registered component is documented
    classes = list(_SECTIONS.values()) + [OBJECTIVES.get(n) for n in OBJECTIVES.names()] + \
        [LIKELIHOODS.get(n) for n in LIKELIHOODS.names()]
    for cls in classes:
        docs = field_docs(cls)
        missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert missing == [], f"{cls.__name__}: undocumented fields {missing}"
    text = explain("train")
    assert "max_forward_rows = 0" in text and "forward rows" in text
    assert "clip_eps = 0.5" in explain("objective.diffu_grpo")
    assert main(["config", "--explain", "likelihood"]) == 0
    out = capsys.readouterr().out
    assert "name: state" in out and "p_mask_prompt = 0.15" in out
    assert main(["config", "--explain", "nope"]) == 2
    assert "valid:" in capsys.readouterr().err
    assert main(["config", "--set", "likelihood=state"]) == 0
    assert "name: state" in capsys.readouterr().out


def test_a_component_can_be_switched_from_the_command_line(tmp_path):
    """Issue 20 item 3: ``--set objective='{name: wd1}'`` replaces the whole section; switching only
    the name when the section's keys do not fit says how to replace it. Same for every section."""
    from maskrl.objectives import WD1
    from maskrl.sampling import SamplerConfig

    recipe = tmp_path / "r.yaml"
    recipe.write_text("objective: {name: diffu_grpo, clip_eps: 0.3, beta: 0.1}\n"
                      "credit: [{name: dps, lam: 0.5}]\nrollout: {gen_length: 32, block_length: 8, steps: 32}\n")
    with pytest.raises(ConfigError, match=r"unknown key 'objective\.clip_eps'.*clip_eps is a field of diffu_grpo.*"
                                          r"not of wd1.*--set objective='\{name: wd1\}'"):
        load_config([recipe], ["objective.name=wd1"])
    cfg = load_config([recipe], ["objective={name: wd1}"])
    assert cfg.objective == WD1()
    assert load_config([recipe], ["objective={name: wd1, beta: 0.2}"]).objective == WD1(beta=0.2)
    # list entries by index (both spellings), and a whole list
    assert load_config([recipe], ["credit.0.lam=0.25"]).credit[0].lam == 0.25
    assert load_config([recipe], ["credit[0].lam=0.125"]).credit[0].lam == 0.125
    with pytest.raises(ConfigError, match=r"credit\.1: credit has 1 entries"):
        load_config([recipe], ["credit.1.lam=0.25"])
    with pytest.raises(ConfigError, match=r"credit\[0\]\.clip_eps.*--set credit='\{name: dps\}' \(a list"):
        load_config([recipe], ["credit.0.clip_eps=0.2"])
    assert load_config([recipe], ["credit=[]"]).credit == []
    # a non-component section: a mapping replaces it (the rest take the run's defaults), a key merges
    assert load_config([recipe], ["rollout={gen_length: 16, block_length: 16}"]).rollout == \
        SamplerConfig(gen_length=16, block_length=16, steps=16, temperature=0.9)
    assert load_config([recipe], ["rollout.temperature=0.5"]).rollout.gen_length == 32


def test_a_removed_key_says_why():
    with pytest.raises(ConfigError, match=r"credit\[0\]\.seed: removed: DiSPO's branch generator .* train\.seed"):
        load_config([], ["credit=[{name: dispo, seed: 3}]"])
    with pytest.raises(ConfigError, match=r"unknown key 'credit\[0\]\.sead'"):
        load_config([], ["credit=[{name: dispo, sead: 3}]"])


def test_explain_one_field_of_a_section_or_component():
    from maskrl.config import explain

    text = explain("credit.dispo.z")
    assert text.splitlines()[0] == "[credit.dispo]" and "z = 2" in text and "fillings per state" in text
    assert "lr = 1e-05" in explain("train.lr") and "group_size" not in explain("train.lr")
    assert "clip_eps = " in explain("objective.diffu_grpo.clip_eps")
    with pytest.raises(ConfigError, match=r"credit\.dispo\.seed: removed"):
        explain("credit.dispo.seed")
    with pytest.raises(ConfigError, match=r"credit\.dispo\.zz: unknown field; valid: .*\bz\b"):
        explain("credit.dispo.zz")
    with pytest.raises(ConfigError, match=r"train\.nope: unknown field"):
        explain("train.nope")


def test_an_index_into_an_empty_list_says_so_and_how_to_add_the_entry(tmp_path, capsys):
    """``--set credit.0.lam=...`` with no credit module (the default, or ``credit: []`` in the YAML)
    names the list and its length and shows the override that adds the entry, which then works; the
    field picks the module that has it. An index past a non-empty list keeps its message, and an
    index into a list field the YAML leaves out reads the list in effect (its default)."""
    add = "--set credit='[{name: dps, lam: 0.3}]'"
    for yaml_text in ("", "credit: []\n"):
        recipe = tmp_path / "r.yaml"
        recipe.write_text(yaml_text)
        for key in ("credit.0.lam", "credit[0].lam"):
            with pytest.raises(ConfigError) as e:
                load_config([recipe], [f"{key}=0.3"])
            assert str(e.value) == ("credit.0.lam: credit is an empty list (0 entries), so it has no entry 0 to set; "
                                    f"add the entry by setting the whole list, e.g. {add}")
    assert load_config([], ["credit=[{name: dps, lam: 0.3}]"]).credit[0].lam == 0.3  # the suggestion works
    with pytest.raises(ConfigError, match=r"e\.g\. --set credit='\[\{name: dispo, z: 4\}\]'$"):
        load_config([], ["credit.0.z=4"])
    with pytest.raises(ConfigError, match=r"e\.g\. --set credit='\[dps\]'$"):
        load_config([], ["credit.0=dps"])
    with pytest.raises(ConfigError, match=r"e\.g\. --set credit='\[\{name: dps\}\]'$"):  # no second name key
        load_config([], ["credit.0.name=dps"])
    for index in ("x", "-1"):  # not a number: an empty list still says it is one (not "expected a list, got {...}")
        with pytest.raises(ConfigError, match=rf"credit\.{index}\.lam: credit is an empty list \(0 entries\), so it "
                                              rf"has no entry {index} to set"):
            load_config([], [f"credit.{index}.lam=0.3"])
    with pytest.raises(ConfigError, match=r"credit\.1: credit has 1 entries \(indices 0-0\)"):
        load_config([], ["credit=[dps]", "credit.1.lam=0.3"])
    assert load_config([], ["train.report_to.0=wandb"]).train.report_to == ["wandb"]
    assert main(["config", "--set", "credit.0.lam=0.3"]) == 2
    assert "credit is an empty list (0 entries)" in capsys.readouterr().err


def test_explain_a_component_field_without_its_name_uses_the_configured_component(tmp_path, capsys):
    """``--explain objective.aggregation`` is ``objective.<configured name>.aggregation``: the default
    objective's without a config, the recipe's with one; the same for the likelihood (the objective's
    own by default) and each configured credit module that has the field. A key no configured
    component has names the configured ones and the components that do have it."""
    from maskrl.config import explain

    assert explain("objective.aggregation") == explain("objective.diffu_grpo.aggregation")
    assert explain("likelihood.p_mask_prompt") == explain("likelihood.mean_field.p_mask_prompt")
    wd1 = load_config([], ["objective=wd1"])
    assert explain("objective.beta", wd1) == explain("objective.wd1.beta") != explain("objective.beta")
    two = load_config([], ["credit=[{name: dps}, {name: dispo}]"])
    assert explain("credit.lam", lambda: two) == explain("credit.dps.lam")
    assert explain("credit.clip_eps", two) == explain("credit.dispo.clip_eps")
    with pytest.raises(ConfigError) as e:
        explain("credit.lam")
    assert str(e.value) == ("credit.lam: neither a registered credit module nor a field of the configured credit "
                            "module (none); valid credit modules: dispo, dps, dtca, rldf_steps; lam is a field of dps "
                            "(e.g. credit.dps.lam)")
    with pytest.raises(ConfigError, match=r"objective\.nonsense: neither a registered objective nor a field of the "
                                          r"configured objective \(diffu_grpo\); valid objectives: diffu_grpo,"):
        explain("objective.nonsense")
    assert explain("objective.diffu_grpo").startswith("[objective] name: diffu_grpo")  # a name is still a name
    recipe = tmp_path / "r.yaml"
    recipe.write_text("objective: {name: spg}\n")
    assert main(["config", "--config", str(recipe), "--explain", "objective.aggregation"]) == 0
    assert capsys.readouterr().out.strip() == explain("objective.spg.aggregation")
    broken = tmp_path / "broken.yaml"
    broken.write_text("train: {lrr: 1}\n")  # the config is read only when the key needs it
    assert main(["config", "--config", str(broken), "--explain", "train.lr"]) == 0
    assert "lr = 1e-05" in capsys.readouterr().out


def test_explain_a_credit_entry_indexed_as_set_indexes_it(tmp_path, capsys):
    """``--explain credit.0.lam`` / ``credit[0].lam`` (the ``--set`` spelling) is the field of the
    configured list's entry 0; an index past the list names its length and entries."""
    from maskrl.config import explain

    two = load_config([], ["credit=[{name: dps}, {name: dispo}]"])
    assert explain("credit.0.lam", two) == explain("credit[0].lam", two) == explain("credit.dps.lam")
    assert explain("credit.1.z", lambda: two) == explain("credit.dispo.z")
    assert explain("credit.1", two) == explain("credit.dispo")
    with pytest.raises(ConfigError, match=r"credit\.2: the configured credit list has 2 entries \(dps, dispo\)"):
        explain("credit.2.lam", two)
    with pytest.raises(ConfigError, match=r"credit\.0: the configured credit list has 0 entries \(none\)"):
        explain("credit.0.lam")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("credit: [{name: dtca}]\n")
    assert main(["config", "--config", str(recipe), "--explain", "credit[0].coverage"]) == 0
    assert capsys.readouterr().out.strip() == explain("credit.dtca.coverage")


def test_paths_in_a_yaml_file_are_read_from_its_folder(tmp_path, monkeypatch):
    """Issue 20 item 3: every input path field of a YAML file is relative to the file's folder (as
    its reader takes it); --set values stay relative to the working directory."""
    import json as _json
    import os

    recipes = tmp_path / "recipes"
    (recipes / "tables").mkdir(parents=True)
    (recipes / "tables" / "w.json").write_text(_json.dumps({"w_c": {"NOUN": 1.1}}))
    (recipes / "my_plugin.py").write_text("VALUE = 1\n")
    (recipes / "data").mkdir()
    (recipes / "tok").mkdir()
    (recipes / "tok" / "tokenizer.json").write_text("{}")
    (recipes / "r.yaml").write_text(
        "plugins: [my_plugin.py, json]\n"
        "model: {path: ckpt, tiny: {tokenizer: tok}}\n"
        "task: {data_path: data/test.jsonl}\n"
        "credit: [{name: dtca, pos_weights: tables/w.json, tagger: 'maskrl.pos:spacy_pos_classes'}]\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(["../recipes/r.yaml"])
    assert cfg.credit[0].pos_weights == str(recipes / "tables" / "w.json")
    assert cfg.plugins[0] == str(recipes / "my_plugin.py") and cfg.plugins[1] == "json"  # a module name stays
    assert cfg.model.path == str(recipes / "ckpt") and cfg.task.data_path == str(recipes / "data" / "test.jsonl")
    assert cfg.model.tiny.tokenizer == str(recipes / "tok")
    assert all(type(p) is str for p in cfg.plugins) and type(cfg.model.path) is str
    # the command line: relative to the working directory
    (elsewhere / "w2.json").write_text(_json.dumps({"w_c": {"NOUN": 0.9}}))
    cfg = load_config(["../recipes/r.yaml"], ["model.path=ckpt", "credit.0.pos_weights=w2.json", "task.data_path=d"])
    assert (cfg.model.path, cfg.credit[0].pos_weights, cfg.task.data_path) == ("ckpt", "w2.json", "d")
    # a Hub id stays a Hub id, built-in tokenizer names stay names, absolute paths stay
    (recipes / "hub.yaml").write_text(f"model: {{path: GSAI-ML/LLaDA-8B-Instruct, tiny: {{tokenizer: char}}}}\n"
                                      f"task: {{data_path: {tmp_path}}}\n")
    cfg = load_config([recipes / "hub.yaml"])
    assert (cfg.model.path, cfg.model.tiny.tokenizer, cfg.task.data_path) == ("GSAI-ML/LLaDA-8B-Instruct", "char",
                                                                             str(tmp_path))
    # the resolved config reloads to the same paths from any folder (config.json of a run)
    import yaml as _yaml

    from maskrl.config import to_dict

    saved = tmp_path / "saved.yaml"
    saved.write_text(_yaml.safe_dump(to_dict(load_config(["../recipes/r.yaml"]))))
    monkeypatch.chdir(tmp_path)
    assert load_config([saved]).credit[0].pos_weights == str(recipes / "tables" / "w.json")
    assert os.path.isabs(load_config([saved]).plugins[0])


def test_shipped_recipes_with_paths_load_from_any_folder(tmp_path, monkeypatch):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "configs"
    monkeypatch.chdir(tmp_path)
    cfg = load_config([root / "dtca_countdown_dtca.yaml"])
    assert Path(cfg.credit[0].pos_weights).is_file()
