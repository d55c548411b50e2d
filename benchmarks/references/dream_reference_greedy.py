"""Dream's own ``diffusion_generate``, greedy, recorded on tiny Dream-layout checkpoints as test data
(``tests/golden/dream_code_greedy.json``, read by ``tests/test_dream_code_greedy.py``).

Whose code: ``generation_utils.py`` and ``modeling_dream.py`` of NVlabs/Fast-dLLM at commit
24cc59e75f20a6384bae8c905965bb090b96388e (``dream/model/``). DreamLM/Dream on GitHub (commit
fac0a7f2664b4adf0925fe682b7866923fa2d62b) ships no ``generation_utils.py``: Dream's sampler lives
beside the weights on the Hugging Face hub; Fast-dLLM's file is that code, "modified from Dream repos"
by a ``confidence_threshold`` branch (not used here) and two ``print`` calls. It runs under the
transformers it was written for (Fast-dLLM pins 4.49.0), in a separate environment; none of its code
is in this repository. Two steps, two environments:

    # 1. maskrl's environment: the checkpoints (weights, config, prompts) maskrl's tests build
    PYTHONPATH=src python benchmarks/references/dream_reference_greedy.py build /tmp/dream_ckpt
    # 2. an environment with transformers 4.49.0 (and torch): Dream's code on them
    python benchmarks/references/dream_reference_greedy.py record /tmp/dream_ckpt \\
        --dream-code /path/to/Fast-dLLM/dream/model --out tests/golden/dream_code_greedy.json

Each setting is one ``diffusion_generate`` call on 4 unpadded prompts: ``alg`` in maskgit_plus /
topk_margin / entropy / origin, ``top_k`` None or 50, ``(max_new_tokens, steps)`` in (32, 32), (32,
16), (64, 64), (64, 32), temperature 0, seed 1234 (``origin``'s reveal draw). Beside the tokens, each
row keeps its **closest decision**, so that the test can hold on any CPU: while Dream's code runs, its
``torch.topk`` of the confidences is watched (the gap between the k-th and the (k+1)-th confidence of
the row: a smaller gap than float noise means another CPU's last bits may choose other positions) and
its ``sample_tokens`` (the gap between the top two logits of each committed position: the same for the
greedy candidate). The watching wraps module attributes at run time; Dream's functions run unchanged.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import io
import json
import sys
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SEED = 1234
ROWS = 4
SHAPES = ((32, 32), (32, 16), (64, 64), (64, 32))
ALGS = ("maskgit_plus", "topk_margin", "entropy", "origin")
#: model name -> tests/conftest.py tiny_dream arguments (fp32: the recorded gaps are float32's)
MODELS = {"sharp": dict(scale=8.0, mask_logit=-20.0), "flat": dict(scale=1.0, mask_logit=-20.0)}
DREAM_COMMIT = "NVlabs/Fast-dLLM@24cc59e75f20a6384bae8c905965bb090b96388e dream/model"


def weights_digest(state: dict) -> str:
    """sha256 of a state dict's names, shapes, dtypes and bytes (16 hex digits)."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().contiguous().cpu()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def tiny_adapter(name: str):
    """``tests/conftest.py``'s ``tiny_dream`` as :data:`MODELS` names it."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from conftest import tiny_dream
    finally:
        sys.path.pop(0)
    return tiny_dream(max_positions=512, **MODELS[name])


def prompt_ids(adapter) -> torch.Tensor:
    """``[4, 13]`` unpadded prompts (``benchmarks/references/dream_reference.py``'s ``prompts``, seed 0)."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "references"))
    try:
        from dream_reference import prompts
    finally:
        sys.path.pop(0)
    return prompts(adapter, ROWS)


def build(folder: Path) -> None:
    """maskrl's side: each model's weights (safetensors), Qwen2 shape, special ids and prompts."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        ad = tiny_adapter(name)
        state = {k: v.contiguous() for k, v in ad.model.state_dict().items()}
        save_file(state, str(folder / f"{name}.safetensors"))
        q = ad.model.config
        meta = dict(vocab_size=q.vocab_size, hidden_size=q.hidden_size, intermediate_size=q.intermediate_size,
                    num_hidden_layers=q.num_hidden_layers, num_attention_heads=q.num_attention_heads,
                    num_key_value_heads=q.num_key_value_heads, max_position_embeddings=q.max_position_embeddings,
                    rms_norm_eps=q.rms_norm_eps, rope_theta=q.rope_parameters["rope_theta"],
                    mask_id=ad.mask_id, pad_id=ad.pad_id, eos_id=ad.eos_id, prompts=prompt_ids(ad).tolist(),
                    weights=weights_digest(state), lm_head_bias=ad.model.get_output_embeddings().bias is not None)
        (folder / f"{name}.json").write_text(json.dumps(meta) + "\n")
    print(f"wrote {', '.join(MODELS)} to {folder}")


# ------------------------------------------------------------------------------------ Dream's side
def load_code(path: Path) -> types.ModuleType:
    """Fast-dLLM's ``dream/model`` files as one package (relative imports kept)."""
    pkg = types.ModuleType("_dream_code")
    pkg.__path__ = [str(path)]
    sys.modules["_dream_code"] = pkg
    for mod in ("configuration_dream", "generation_utils", "modeling_dream"):
        setattr(pkg, mod, importlib.import_module(f"_dream_code.{mod}"))
    return pkg


def dream_model(code, folder: Path, name: str):
    """Fast-dLLM's ``DreamModel`` holding the checkpoint's weights (checked by digest)."""
    from safetensors.torch import load_file

    meta = json.loads((folder / f"{name}.json").read_text())
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "rope_theta")
    cfg = code.configuration_dream.DreamConfig(**{k: meta[k] for k in keys}, mask_token_id=meta["mask_id"],
                                               pad_token_id=meta["pad_id"], attn_implementation="sdpa")
    model = code.modeling_dream.DreamModel(cfg)
    if meta["lm_head_bias"]:
        model.lm_head = torch.nn.Linear(meta["hidden_size"], meta["vocab_size"], bias=True)
    state = load_file(str(folder / f"{name}.safetensors"))
    assert weights_digest(state) == meta["weights"], f"{name}: weights differ from the build"
    model.load_state_dict(state)
    return model.float().eval(), meta


class Watch:
    """What one ``diffusion_generate`` call decided, step by step (see the module docstring)."""

    def __init__(self, alg: str):
        self.alg = alg
        self.states: list[torch.Tensor] = []  # x before each step
        self.cand_gaps: list[torch.Tensor] = []  # per sample_tokens row: (top-1 - top-2 logit) / max(1, |top-1|)
        self.cut_gaps: dict[int, list[float]] = {}  # step -> per row: (k-th - (k+1)-th confidence) / max(1, |k-th|)
        self.sampling = False

    def on_forward(self, module, args):
        self.states.append(args[0].clone())

    def on_candidates(self, logits: torch.Tensor) -> None:
        top2 = logits.double().topk(2, dim=-1).values if logits.shape[0] else logits.new_zeros((0, 2)).double()
        self.cand_gaps.append((top2[:, 0] - top2[:, 1]) / top2[:, 0].abs().clamp(min=1))

    def on_topk(self, conf: torch.Tensor, k: int) -> None:
        vals = conf.double().sort(dim=-1, descending=True).values
        row = []
        for r in range(conf.shape[0]):
            finite = int(torch.isfinite(vals[r]).sum())
            row.append(float((vals[r, k - 1] - vals[r, k]) / vals[r, k - 1].abs().clamp(min=1)) if k < finite else -1.0)
        self.cut_gaps[len(self.states) - 1] = row  # the step of the last forward (Dream ranks only when k > 0)

    def decisions(self, history: list[torch.Tensor], p_len: int, mask_id: int) -> dict:
        """Per position: the step that committed it (-1: never) and its candidate's gap at that step;
        per step and row: the cut gap (-1: no ranking, or every mask taken)."""
        n, width = history[0].shape
        step = torch.full((n, width), -1, dtype=torch.long)
        gap = torch.full((n, width), -1.0, dtype=torch.float64)
        for i, (before, after) in enumerate(zip(self.states, history)):
            masked = before == mask_id
            done = masked & (after != mask_id)
            step[done] = i
            where = done if self.alg == "origin" else masked  # the rows sample_tokens saw, row-major
            full = torch.full((n, width), -1.0, dtype=torch.float64)
            full[where] = self.cand_gaps[i]
            gap[done] = full[done]
        cuts = [self.cut_gaps.get(i, [-1.0] * n) for i in range(len(self.states))]
        sig = lambda v: float(f"{v:.3g}")  # noqa: E731
        return dict(commit_step=step[:, p_len:].tolist(), candidate_gap=[[sig(v) for v in r] for r in gap[:, p_len:].tolist()],
                    cut_gap=[[sig(v) for v in r] for r in cuts])


@contextlib.contextmanager
def watching(code, model, watch: Watch):
    """Dream's ``sample_tokens`` and ``torch.topk`` (as its module sees them) reporting to ``watch``."""
    gu = code.generation_utils
    real_sample, real_torch = gu.sample_tokens, gu.torch

    def sample(logits, *a, **k):
        watch.on_candidates(logits)
        watch.sampling = True  # top_k_logits' own topk is not the position choice
        try:
            return real_sample(logits, *a, **k)
        finally:
            watch.sampling = False

    def topk(t, k, *a, **kw):
        if not watch.sampling:
            watch.on_topk(t, int(k))
        return real_torch.topk(t, k, *a, **kw)

    proxy = types.SimpleNamespace(**{n: getattr(real_torch, n) for n in dir(real_torch) if not n.startswith("__")})
    proxy.topk = topk
    hook = model.register_forward_pre_hook(watch.on_forward)
    gu.sample_tokens, gu.torch = sample, proxy
    try:
        yield
    finally:
        gu.sample_tokens, gu.torch = real_sample, real_torch
        hook.remove()


def run_dream(code, model, meta: dict, alg: str, top_k: int | None, length: int, steps: int) -> dict:
    """One greedy ``diffusion_generate`` call: completions, and each decision with its gap."""
    gu = code.generation_utils
    ids = torch.tensor(meta["prompts"])
    gc = gu.DreamGenerationConfig(temperature=0.0, top_p=None, top_k=top_k, max_new_tokens=length, steps=steps,
                                  alg=alg, alg_temp=0.0, mask_token_id=meta["mask_id"], pad_token_id=meta["pad_id"],
                                  eos_token_id=meta["eos_id"], bos_token_id=int(ids[0, 0]),
                                  return_dict_in_generate=True, output_history=True)
    model.diffusion_generate = types.MethodType(gu.DreamGenerationMixin.diffusion_generate, model)
    model._sample = types.MethodType(gu.DreamGenerationMixin._sample, model)
    watch = Watch(alg)
    torch.manual_seed(SEED)
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()), watching(code, model, watch):
        out = model.diffusion_generate(ids, generation_config=gc, attention_mask=torch.ones_like(ids))
    return dict(alg=alg, top_k=top_k, gen_length=length, steps=steps, tokens=out.sequences[:, ids.shape[1]:].tolist(),
                **watch.decisions(list(out.history), ids.shape[1], meta["mask_id"]))


def record(folder: Path, dream_code: Path, out: Path) -> None:
    code = load_code(dream_code)
    transformers = importlib.import_module("transformers")
    rec = dict(source=DREAM_COMMIT, transformers=transformers.__version__, torch=torch.__version__, seed=SEED,
               rows=ROWS, note="tokens: completions of Dream's diffusion_generate (benchmarks/references/dream_reference_greedy.py); "
                               "commit_step: the step that unmasked each position; cut_gap[step][row]: (k-th - "
                               "(k+1)-th confidence of Dream's topk) / max(1, |k-th|), -1 where nothing was ranked "
                               "out; candidate_gap: (top-1 - top-2 logit) / max(1, |top-1|) of each committed "
                               "position at its step", models={}, settings=[])
    torch.set_num_threads(1)
    for name in MODELS:
        model, meta = dream_model(code, folder, name)
        rec["models"][name] = dict(weights=meta["weights"], prompts=meta["prompts"])
        for alg in ALGS:
            for top_k in (None, 50):
                for length, steps in SHAPES:
                    rec["settings"].append(dict(model=name, **run_dream(code, model, meta, alg, top_k, length, steps)))
                    print(name, alg, top_k, length, steps, flush=True)
    lines = [json.dumps(s) for s in rec.pop("settings")]
    text = json.dumps(rec, indent=1)[:-2] + ',\n "settings": [\n' + ",\n".join(lines) + "\n ]\n}\n"
    json.loads(text)
    out.write_text(text)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=("build", "record"))
    ap.add_argument("folder", type=Path, help="where the checkpoints are written / read")
    ap.add_argument("--dream-code", type=Path, help="Fast-dLLM's dream/model folder (record)")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "golden" / "dream_code_greedy.json")
    args = ap.parse_args(argv)
    if args.step == "build":
        build(args.folder)
    else:
        record(args.folder, args.dream_code, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
