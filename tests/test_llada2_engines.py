"""maskrl's LLaDA2 exports hold what SGLang's and dInfer's LLaDA2 loaders read (issue 52 item 6).

The expectations are recorded from their source by ``benchmarks/references/llada2_engines_record.py`` into
``tests/data/llada2_engines.json`` (dInfer fce4e32 ``python/dinfer/model/modeling_llada2_moe.py``; SGLang 02ceb3b
``python/sglang/srt/models/llada2.py``): the ``config.json`` keys their model code reads without a default, the
checkpoint tensor names their weight loading fills (per expert; SGLang stacks ``gate_proj`` / ``up_proj`` and the
experts itself, dInfer the experts), and the files they open. Neither engine imports on a CPU (CUDA layers,
vLLM's ``FusedMoE``), so their loaders are not run here; the family's own code reading the same exports is
``tests/test_llada2_export.py``.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open
from transformers import PretrainedConfig

from maskrl.models import load, save_model
from test_llada2_export import _tiny_llada2_with_tokenizer

DATA = Path(__file__).resolve().parent / "data"
RECORD = json.loads((DATA / "llada2_engines.json").read_text())
ENGINES = ("dinfer", "sglang")


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """An export of the tiny checkpoint in the family's layout (its source config.json), and one of a model
    built without a source config (the export's defaults fill the keys)."""
    tmp = tmp_path_factory.mktemp("engines")
    built = _tiny_llada2_with_tokenizer()
    assert built.model.config.use_bias  # the family's config default: an attention output bias
    return {"from_checkpoint": save_model(load(DATA / "llada2_tiny"), tmp / "ckpt"),
            "built": save_model(built, tmp / "built")}


def _tensors(folder: Path) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of the tensors the index names, read from the shards it points to."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    out = {}
    for shard in sorted(set(index.values())):
        with safe_open(folder / shard, framework="pt") as f:
            out |= {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
    assert set(out) == set(index)  # the index names every stored tensor, and only those
    return out


def _present(what: str, cfg: dict) -> bool:
    """Whether a recorded tensor exists under ``cfg``: ``"bias if k1 or k2"`` when one of the keys is true."""
    keys = what.removeprefix("bias if ").split(" or ") if what.startswith("bias if ") else []
    return not keys or any(cfg.get(k) for k in keys)


def expected_names(record: dict, cfg: dict) -> set[str]:
    """The recorded name templates filled in for ``cfg``'s layers (dense below ``first_k_dense_replace``) and
    experts, biases where its keys turn them on; a tied output layer is not read (both engines skip / share it)."""
    out = set()
    for layer in range(cfg["num_hidden_layers"]):
        kind = "dense_layer" if layer < cfg.get("first_k_dense_replace", 0) else "moe_layer"
        for t in (t for t, what in record["tensors"][kind].items() if _present(what, cfg)):
            experts = range(cfg["num_experts"]) if "{e}" in t else [None]
            out |= {t.format(l=layer, e=e) for e in experts}
    return {n for n in out if not (cfg.get("tie_word_embeddings") and n == "lm_head.weight")}


def test_the_two_engines_read_the_same_checkpoint_names():
    """A check of the record itself: both engines' loaders map the family's layout, so they read one name set
    (biases aside: SGLang gives the dense and shared MLPs a bias under ``use_bias``, dInfer and the family's
    code never; every published LLaDA2 config has ``use_bias: false``)."""
    off = {"use_bias": False, "use_qkv_bias": False}
    for kind in ("dense_layer", "moe_layer"):
        names = {e: {t for t, w in RECORD[e]["tensors"][kind].items() if _present(w, off)} for e in ENGINES}
        assert names["dinfer"] == names["sglang"]
    assert "model.layers.{l}.mlp.experts.{e}.gate_proj.weight" in RECORD["sglang"]["tensors"]["moe_layer"]
    assert RECORD["dinfer"]["loader"]["files_opened"] == ["model.safetensors.index.json"]


@pytest.mark.parametrize("engine,which", [("dinfer", "from_checkpoint"), ("dinfer", "built"),
                                          ("sglang", "from_checkpoint")])
def test_every_tensor_the_engine_reads_is_exported_with_its_shape(exports, engine, which):
    """(SGLang on the ``use_bias: true`` model would also read MLP biases no LLaDA2 model has: not checked.)"""
    folder = exports[which]
    cfg = json.loads((folder / "config.json").read_text())
    shapes = _tensors(folder)
    assert set(shapes) == expected_names(RECORD[engine], cfg)  # none missing; none it would skip or print
    h, d, e = cfg["hidden_size"], cfg["head_dim"], cfg["num_experts"]
    q, kv, moe = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["moe_intermediate_size"]
    shared = moe * cfg["num_shared_experts"]
    rules = {  # the shapes their constructors give (QKVParallelLinear: q | k | v heads of head_dim, ...)
        "attention.query_key_value.weight": ((q + 2 * kv) * d, h), "attention.dense.weight": (h, q * d),
        "attention.query_layernorm.weight": (d,), "attention.key_layernorm.weight": (d,),
        "mlp.gate.weight": (e, h), "mlp.gate.expert_bias": (e,), "shared_experts.gate_proj.weight": (shared, h),
        "shared_experts.down_proj.weight": (h, shared), "experts.0.up_proj.weight": (moe, h),
        "experts.0.down_proj.weight": (h, moe), "model.word_embeddings.weight": (cfg["vocab_size"], h),
        "lm_head.weight": (cfg["vocab_size"], h), "layers.0.mlp.gate_proj.weight": (cfg["intermediate_size"], h),
        "model.norm.weight": (h,)}
    for end, shape in rules.items():
        hits = [n for n in shapes if n.endswith(end)]
        assert hits and all(shapes[n] == shape for n in hits), (end, {n: shapes[n] for n in hits})


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("which", ["from_checkpoint", "built"])
def test_every_config_key_the_engine_reads_is_in_config_json(exports, engine, which):
    cfg = json.loads((exports[which] / "config.json").read_text())
    every_config = PretrainedConfig()  # dtype, use_return_dict, ...: attributes of every transformers config
    required = {k for k in RECORD[engine]["config_keys"]["required"] if not hasattr(every_config, k)}
    assert sorted(required - set(cfg)) == []
    # read with a default that would change the model: SGLang drops the expert bias without
    # moe_router_enable_expert_bias, and the family's config classes disagree on use_qk_norm's default
    assert (cfg["moe_router_enable_expert_bias"], cfg["use_qk_norm"], cfg["score_function"]) == (True, True, "sigmoid")
    assert cfg["architectures"][0] == "LLaDA2MoeModelLM"  # SGLang's dLLM table: block 32, mask 156895


@pytest.mark.parametrize("which", ["from_checkpoint", "built"])
def test_auto_map_names_the_familys_configuration_code_where_it_can_be_found(exports, which):
    """Both engines read the config with ``AutoConfig.from_pretrained(folder, trust_remote_code=True)``: each
    ``auto_map`` entry is either a module in the folder or ``repo--module.Class`` on the Hub."""
    folder = exports[which]
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert set(auto_map) >= {"AutoConfig", "AutoModel", "AutoModelForCausalLM"}
    for ref in auto_map.values():
        repo, _, ref = ref.rpartition("--")
        assert repo == "inclusionAI/LLaDA2.0-mini" or (folder / f"{ref.split('.')[0]}.py").is_file(), ref


DINFER_GIT = Path("/work/.mirror/inclusionAI+dInfer/repo")


@pytest.mark.skipif(not DINFER_GIT.is_dir(), reason="no inclusionAI/dInfer checkout here: the record stands in")
def test_the_recorder_reproduces_the_dinfer_record():
    import subprocess

    from conftest import benchmark_script

    rec = benchmark_script("references/llada2_engines_record.py")
    head = subprocess.run(["git", "--git-dir", str(DINFER_GIT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    if head.strip() != RECORD["dinfer"]["commit"]:
        pytest.skip("the dInfer checkout is at another commit than the record")
    assert {"repo": "inclusionAI/dInfer", **rec.record(DINFER_GIT, "dinfer"), "notes": RECORD["dinfer"]["notes"]} == RECORD["dinfer"]


#: a made-up module in the shape of an engine's model file (stacked MLP, experts from a factory, a float32 bias
#: parameter, a guarded key), to check the recorder's rules on what the dInfer file does not exercise
ENGINE_LIKE = '''
class Mlp(nn.Module):
    def __init__(self, config):
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [4, 4], bias=config.use_bias)
        self.down_proj = RowParallelLinear(4, config.hidden_size, bias=False)
class Gate(nn.Module):
    def __init__(self, config):
        self.weight = nn.Parameter(torch.empty(2, 2))
        if getattr(config, "moe_router_enable_expert_bias", False):
            self.expert_bias = nn.Parameter(torch.empty(2, dtype=torch.float32))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)
class Moe(nn.Module):
    def __init__(self, config):
        self.gate = Gate(config)
        self.experts = get_moe_impl_class(None)(num_experts=config.num_experts)
class Lm(nn.Module):
    def __init__(self, config):
        self.mlp = Mlp(config) if config.first_k_dense_replace else Moe(config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
    def load_weights(self, weights):
        stacked_params_mapping = [("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1)]
        m = FusedMoE.make_expert_params_mapping(ckpt_gate_proj_name="w1", ckpt_down_proj_name="w2", ckpt_up_proj_name="w3")
'''


def test_the_recorders_rules_on_an_engine_like_module():
    import ast

    from conftest import benchmark_script

    rec = benchmark_script("references/llada2_engines_record.py")
    tree = ast.parse(ENGINE_LIKE)
    loader = rec.loader_facts(rec._classes(tree)["Lm"], "load_weights")
    assert loader["stacked_params_mapping"] == [["gate_up_proj", "gate_proj", 0], ["gate_up_proj", "up_proj", 1]]
    assert loader["expert_checkpoint_names"] == ["w1", "w2", "w3"] and loader["files_opened"] == []
    spec = {"file": "x.py", "root": "Lm", "edges": [("Lm", "mlp", "Mlp|Moe"), ("Moe", "gate", "Gate")]}
    names = rec.tensor_names(tree, spec, loader)
    assert names["dense_layer"] == {"mlp.gate_proj.weight": "MergedColumnParallelLinear",
                                    "mlp.up_proj.weight": "MergedColumnParallelLinear",
                                    "mlp.gate_proj.bias": "bias if use_bias", "mlp.up_proj.bias": "bias if use_bias",
                                    "mlp.down_proj.weight": "RowParallelLinear", "lm_head.weight": "ParallelLMHead"}
    assert names["moe_layer"] == {"lm_head.weight": "ParallelLMHead", "mlp.gate.weight": "Parameter default",
                                  "mlp.gate.expert_bias": "Parameter torch.float32",
                                  **{f"mlp.experts.{{e}}.{c}.weight": "get_moe_impl_class (one per expert)"
                                     for c in ("w1", "w2", "w3")}}
    assert rec.config_keys(tree) == {"required": ["first_k_dense_replace", "hidden_size", "num_experts", "use_bias",
                                                  "vocab_size"], "optional": ["moe_router_enable_expert_bias"]}
    with pytest.raises(ValueError, match="not in the source"):
        rec.tensor_names(tree, {**spec, "edges": [("Lm", "mlp", "Nowhere")]}, loader)
