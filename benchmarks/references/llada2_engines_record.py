"""Record what the serving engines' LLaDA2 loaders read from a checkpoint folder, as test data (issue 52 item 6):
the ``config.json`` keys their model code reads, the tensor names their weight loading fills, and the files
they open. ``tests/test_llada2_engines.py`` checks maskrl's exports against the record.

Their source is read, never run or copied (neither imports on a CPU: dInfer needs vLLM's ``FusedMoE``, SGLang
its CUDA layers). From a git directory and commit (``--dinfer`` / ``--sglang``), with :mod:`ast`:

* config keys: every ``config.X`` / ``self.config.X`` read (``required``: an ``AttributeError`` when neither ``config.json`` nor
  the config class has it) and every ``getattr(config, "X", default)`` / ``hasattr(config, "X")`` (``optional``;
  a key both read and guarded counts as optional);
* tensor names: for each class on the path from the LM class to the leaves (the edges in :data:`TREES`, each
  checked to be in that class's source), its ``self.X = <Linear / Embedding / Parameter / ...>(...)`` and
  ``register_buffer("X", ...)`` attributes; fused tensors are expanded back to the checkpoint's names the way
  the loader maps them (the ``stacked_params_mapping`` tuples; the experts' ``ckpt_*_proj_name`` keywords, or
  the ``*_proj`` names the loader picks out of ``.mlp.experts.`` keys);
* the loader's file names (``model.safetensors.index.json``) and how the router's ``expert_bias`` is held.

    PYTHONPATH=src python benchmarks/references/llada2_engines_record.py \\
        --dinfer /path/to/inclusionAI-dInfer.git [--sglang /path/to/sgl-project-sglang.git] --out tests/data
"""
from __future__ import annotations

import argparse
import ast
import json
import subprocess
from pathlib import Path

#: per engine: source file, LM class, loader method, and the module tree ``(class, attribute, child classes)``;
#: ``mlp`` has a dense and an MoE variant (``first_k_dense_replace``), ``layers`` is indexed ``{l}``
TREES = {
    "dinfer": {"file": "python/dinfer/model/modeling_llada2_moe.py", "root": "LLaDA2MoeModelLM",
               "loader": "load_state_dict", "edges": [
                   ("LLaDA2MoeModelLM", "model", "LLaDA2MoeModel"),
                   ("LLaDA2MoeModel", "layers.{l}", "LLaDA2MoeDecoderLayer"),
                   ("LLaDA2MoeModel", "norm", "LLaDA2MoeRMSNorm"),
                   ("LLaDA2MoeDecoderLayer", "attention", "ATTENTION_CLASSES>LLaDA2MoeAttention"),
                   ("LLaDA2MoeDecoderLayer", "mlp", "LLaDA2MoeMLP|LLaDA2MoeSparseMoeBlock"),
                   ("LLaDA2MoeDecoderLayer", "input_layernorm", "LLaDA2MoeRMSNorm"),
                   ("LLaDA2MoeDecoderLayer", "post_attention_layernorm", "LLaDA2MoeRMSNorm"),
                   ("LLaDA2MoeAttention", "query_layernorm", "LLaDA2MoeRMSNorm"),
                   ("LLaDA2MoeAttention", "key_layernorm", "LLaDA2MoeRMSNorm"),
                   ("LLaDA2MoeSparseMoeBlock", "gate", "LLaDA2MoeGate"),
                   ("LLaDA2MoeSparseMoeBlock", "shared_experts", "LLaDA2MoeMLP")]},
    "sglang": {"file": "python/sglang/srt/models/llada2.py", "root": "LLaDA2MoeModelLM", "loader": "load_weights",
               "edges": [
                   ("LLaDA2MoeModelLM", "model", "LLaDA2MoeModel"),
                   ("LLaDA2MoeModel", "layers.{l}", "LLaDA2MoeBlock"),
                   ("LLaDA2MoeBlock", "attention", "LLaDA2MoeAttention"),
                   ("LLaDA2MoeBlock", "mlp", "LLaDA2MoeMLP|LLaDA2MoeSparseMoeBlock"),
                   ("LLaDA2MoeSparseMoeBlock", "gate", "LLaDA2MoeGate"),
                   ("LLaDA2MoeSparseMoeBlock", "shared_experts", "LLaDA2MoeMLP")]},
}
#: library layers holding one ``weight`` (their other tensors, biases, are off in LLaDA2: ``use_bias`` false)
WEIGHT_LEAVES = {"Linear", "Embedding", "QKVParallelLinear", "RowParallelLinear", "MergedColumnParallelLinear",
                 "ColumnParallelLinear", "ReplicatedLinear", "VocabParallelEmbedding", "ParallelLMHead", "RMSNorm"}
EXPERT_LEAVES = {"FusedMoE", "get_moe_impl_class"}
#: layers with a bias unless ``bias=False`` (recorded as ``"bias if <config keys>"``, any of them true)
BIASED_LEAVES = {"Linear", "QKVParallelLinear", "RowParallelLinear", "MergedColumnParallelLinear",
                 "ColumnParallelLinear", "ReplicatedLinear"}


def _callee(node: ast.AST) -> str | None:
    f = node.func if isinstance(node, ast.Call) else None
    if isinstance(f, ast.Call):  # a factory's result called: get_moe_impl_class(quant_config)(...)
        return _callee(f)
    return f.attr if isinstance(f, ast.Attribute) else (f.id if isinstance(f, ast.Name) else None)


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def class_tensors(cls: ast.ClassDef) -> dict[str, str]:
    """``{attribute: what}`` of one class: ``weight`` leaves, ``Parameter``, persistent buffers, expert blocks."""
    out: dict[str, str] = {}
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call):
            t = node.targets[0]
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                name = _callee(node.value)
                if name in WEIGHT_LEAVES:
                    out[f"{t.attr}.weight"] = name
                    if name in BIASED_LEAVES and (bias := _bias(node.value)) is not None:
                        out[f"{t.attr}.bias"] = bias
                elif name == "Parameter":
                    out[t.attr] = "Parameter " + _dtype_of(node.value)
                elif name in EXPERT_LEAVES:
                    out[f"{t.attr}.*"] = name
        if (isinstance(node, ast.Call) and _callee(node) == "register_buffer" and node.args
                and getattr(node.func.value, "id", None) == "self"):
            persistent = all(not (k.arg == "persistent" and isinstance(k.value, ast.Constant) and k.value.value is False)
                             for k in node.keywords)
            if persistent and isinstance(node.args[0], ast.Constant):
                out[node.args[0].value] = "buffer " + _dtype_of(node)
    return out


def _bias(call: ast.Call) -> str | None:
    """``None`` for ``bias=False``; ``"bias if k1 or k2"`` for a bias set by config keys; ``"bias"`` otherwise."""
    kw = next((k.value for k in call.keywords if k.arg == "bias"), None)
    if isinstance(kw, ast.Constant) and kw.value is False:
        return None
    keys = sorted({n.attr for n in ast.walk(kw) if isinstance(n, ast.Attribute) and getattr(n.value, "id", None) == "config"}
                  ) if kw is not None else []
    return "bias if " + " or ".join(keys) if keys else "bias"


def _dtype_of(call: ast.Call) -> str:
    """The ``dtype=`` given where the tensor is made (``default``: the model's dtype, cast with it)."""
    for node in ast.walk(call):
        for k in getattr(node, "keywords", []):
            if k.arg == "dtype":
                return ast.unparse(k.value)
    return "default"


def _is_config(node: ast.AST) -> bool:
    """``config`` or ``self.config``."""
    return (isinstance(node, ast.Name) and node.id == "config") or (
        isinstance(node, ast.Attribute) and node.attr == "config" and getattr(node.value, "id", None) == "self")


def config_keys(tree: ast.Module) -> dict[str, list[str]]:
    """``required`` / ``optional`` ``config.json`` keys read on ``config`` or ``self.config`` (module docstring);
    private attributes left out."""
    read, guarded = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_config(node.value):
            read.add(node.attr)
        if isinstance(node, ast.Call) and _callee(node) in ("getattr", "hasattr") and len(node.args) >= 2:
            obj, key = node.args[0], node.args[1]
            if _is_config(obj) and isinstance(key, ast.Constant):
                guarded.add(key.value)
    public = lambda s: {k for k in s if not k.startswith("_")}  # noqa: E731
    return {"required": sorted(public(read - guarded)), "optional": sorted(public(guarded))}


def loader_facts(cls: ast.ClassDef, method: str) -> dict:
    """The loader's string constants, ``stacked_params_mapping`` tuples and expert checkpoint names."""
    fn = next(n for n in ast.walk(cls) if isinstance(n, ast.FunctionDef) and n.name == method)
    consts = sorted({n.value for n in ast.walk(fn) if isinstance(n, ast.Constant) and isinstance(n.value, str)})
    stacked = []
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "stacked_params_mapping" for t in n.targets):
            stacked = [list(ast.literal_eval(e)) for e in n.value.elts]
    experts = [k.value.value for n in ast.walk(fn) if _callee(n) == "make_expert_params_mapping"
               for k in n.keywords if k.arg.startswith("ckpt_")]
    if not experts and ".mlp.experts." in consts:
        experts = [c for c in consts if c.endswith("_proj")]
    return {"method": method, "files_opened": [c for c in consts if c.endswith(".json") or c.endswith(".safetensors")],
            "stacked_params_mapping": stacked, "expert_checkpoint_names": sorted(experts)}


def tensor_names(tree: ast.Module, spec: dict, loader: dict) -> dict[str, dict[str, str]]:
    """``{"dense_layer" | "moe_layer": {checkpoint name template: what}}`` (templates hold ``{l}``, ``{e}``)."""
    classes = _classes(tree)

    def module_source(name: str) -> str:
        return " ".join(ast.unparse(n) for n in tree.body if isinstance(n, ast.Assign)
                        and any(getattr(t, "id", None) == name for t in n.targets))

    edges: dict[str, list[tuple[str, list[str]]]] = {}
    for parent, attr, child in spec["edges"]:
        src = ast.unparse(classes[parent])
        via, _, child = child.rpartition(">")  # "TABLE>Class": the parent picks the class from a module-level dict
        found = all(c in (module_source(via) if via else src) for c in child.split("|")) and (not via or via in src)
        if not found or f"self.{attr.split('.')[0]}" not in src:
            raise ValueError(f"{spec['file']}: {parent}.{attr} -> {child} is not in the source: update TREES")
        edges.setdefault(parent, []).append((attr, child.split("|")))
    unstack = {p: [c for q, c, _ in loader["stacked_params_mapping"] if q == p] for p, _, _ in loader["stacked_params_mapping"]}

    def walk(cls: str, prefix: str, moe: bool) -> dict[str, str]:
        out = {}
        for name, what in class_tensors(classes[cls]).items():
            if what in EXPERT_LEAVES:
                for c in loader["expert_checkpoint_names"]:
                    out[f"{prefix}{name[:-1]}{{e}}.{c}.weight"] = f"{what} (one per expert)"
                continue
            head = name.split(".")[0]
            for piece in unstack.get(head, [head]):  # a stacked bias is read per shard too
                out[prefix + piece + name[len(head):]] = what
        for attr, children in edges.get(cls, []):
            child = children[-1] if moe else children[0]
            out |= walk(child, f"{prefix}{attr}.", moe)
        return out

    return {kind: walk(spec["root"], "", kind == "moe_layer") for kind in ("dense_layer", "moe_layer")}


def record(git_dir: Path, engine: str) -> dict:
    spec = TREES[engine]
    commit = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    src = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{commit}:{spec['file']}"], capture_output=True,
                         text=True, check=True).stdout
    tree = ast.parse(src)
    classes = _classes(tree)
    loader = loader_facts(classes[spec["root"]], spec["loader"])
    return {"commit": commit, "file": spec["file"], "class": spec["root"], "recorded_by": Path(__file__).name,
            "config_keys": config_keys(tree), "loader": loader, "tensors": tensor_names(tree, spec, loader)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dinfer", type=Path, help="git directory of inclusionAI/dInfer")
    p.add_argument("--sglang", type=Path, help="git directory of sgl-project/sglang")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    path = args.out / "llada2_engines.json"
    out = json.loads(path.read_text()) if path.is_file() else {}
    for engine, repo in (("dinfer", "inclusionAI/dInfer"), ("sglang", "sgl-project/sglang")):
        git = getattr(args, engine)
        if git is not None:  # a section's hand-written "notes" (what the record cannot say) are kept
            notes = out.get(engine, {}).get("notes")
            out[engine] = {"repo": repo, **record(git, engine)} | ({"notes": notes} if notes else {})
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
