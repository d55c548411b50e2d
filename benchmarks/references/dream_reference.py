"""maskrl's Dream rule against Dream's own code, token for token (docs/spec.md §1.2; docs/sampler.md, "Dream's rule").

Dream's ``diffusion_generate`` (``generation_utils.py``) and Fast-dLLM's Dream block variant
(``generation_utils_block.py``, with its ``modeling_dream.py`` for the prefix / dual caches) are
imported at run time from a folder holding them -- NVlabs/Fast-dLLM's ``dream/model/``, whose
``generation_utils.py`` is Dream's, "modified from Dream repos" by a ``confidence_threshold`` branch
only. That code is not part of maskrl and is never committed; point ``--dream-code`` (or
``$MASKRL_DREAM_CODE``) at a checkout of it.

Both sides run the same tiny Dream-style model (``tests/conftest.py``'s ``tiny_dream``: Qwen2 class,
logits shifted by one): maskrl through its adapter, Dream's code through Fast-dLLM's ``DreamModel``
holding the same weights (its logits are bit for bit the adapter's; checked at start). Prompts are
unpadded (Fast-dLLM's ``modeling_dream`` ignores ``tok_idx``, so padded batches would differ by
positions, not by the rule). Dream draws from torch's global generator: before each call it is
seeded with ``torch.manual_seed(seed)`` and maskrl gets ``torch.Generator().manual_seed(seed)``, the
same stream on the CPU; maskrl draws what Dream draws, in Dream's order and shapes.

- ``plain``: Dream's ``diffusion_generate``, one call for all rows (the batch-averaged mask count and
  the row-major draws are exercised), against ``schedule: dream`` with ``block_length: gen_length``;
  tokens and the step at which each position was unmasked (from Dream's ``output_history``).
- ``block``: Fast-dLLM's variant, one row per call (its dual cache and threshold take one row),
  against ``block_first: forced`` with ``cache: prefix`` / ``dual``; ``alg="entropy"`` (the block
  variant ranks by entropy whatever ``alg`` says) or ``alg="confidence_threshold"`` against
  ``schedule: threshold, remasking: maskgit_plus``.

Two small compatibility shims let the mid-2025 code run on transformers >= 5 (what they do is all they
do): ``DreamGenerationConfig.validate`` accepts the keyword transformers now passes, and the
``"default"`` RoPE initialiser Fast-dLLM's model looks up is provided while it is built.

    PYTHONPATH=src python benchmarks/references/dream_reference.py --dream-code /path/to/Fast-dLLM/dream/model \\
        --out benchmarks/references/dream_reference.json
    PYTHONPATH=src python benchmarks/references/dream_reference.py --fixture tests/golden/dream_reference.json

``--fixture`` writes the tokens Dream's code produces for a few small settings (data, not code) for
``tests/test_dream_reference.py``, which checks maskrl against them without Dream's code.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import io
import json
import os
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import torch

from maskrl.machine import float_key

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CODE = Path(os.environ.get("MASKRL_DREAM_CODE", "/work/ref/fastdllm_dream_model"))
FILES = ("configuration_dream.py", "modeling_dream.py", "generation_utils.py", "generation_utils_block.py")
PACKAGE = "_dream_reference_code"


class DreamCodeMissing(RuntimeError):
    """The folder given does not hold Dream's / Fast-dLLM's code."""


# ------------------------------------------------------------------------------------------- loading
def load_dream_code(path: Path) -> types.ModuleType:
    """Import the four files of ``path`` as one package; raise :class:`DreamCodeMissing` naming what is absent."""
    path = Path(path)
    missing = [f for f in FILES if not (path / f).is_file()]
    if missing:
        raise DreamCodeMissing(
            f"Dream's code is not at {path}: missing {', '.join(missing)}. Point --dream-code (or "
            "$MASKRL_DREAM_CODE) at a folder holding NVlabs/Fast-dLLM's dream/model/ files "
            f"({', '.join(FILES)}); e.g. git clone https://github.com/NVlabs/Fast-dLLM and pass "
            "Fast-dLLM/dream/model")
    if PACKAGE in sys.modules:
        return sys.modules[PACKAGE]
    pkg = types.ModuleType(PACKAGE)
    pkg.__path__ = [str(path)]
    sys.modules[PACKAGE] = pkg
    for name in ("configuration_dream", "generation_utils", "generation_utils_block", "modeling_dream"):
        setattr(pkg, name, importlib.import_module(f"{PACKAGE}.{name}"))
    for mod in (pkg.generation_utils, pkg.generation_utils_block):  # shim: transformers >= 5 passes keywords
        mod.DreamGenerationConfig.validate = lambda self, *a, **k: None
    pkg.sha256 = {f: hashlib.sha256((path / f).read_bytes()).hexdigest()[:16] for f in FILES}
    pkg.where = str(path)
    return pkg


def _default_rope(config, device=None, seq_len=None, **_):
    """transformers 4.x's "default" RoPE inverse frequencies (removed in 5.x), for Fast-dLLM's model."""
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    exps = torch.arange(0, dim, 2, dtype=torch.int64).float().to(device) / dim
    return 1.0 / (config.rope_theta ** exps), 1.0


def dream_model(code: types.ModuleType, adapter) -> torch.nn.Module:
    """Fast-dLLM's ``DreamModel`` with the adapter's Qwen2 weights and dtype, eval mode."""
    import transformers.modeling_rope_utils as rope

    q = adapter.model.config
    cfg = code.configuration_dream.DreamConfig(
        vocab_size=q.vocab_size, hidden_size=q.hidden_size, intermediate_size=q.intermediate_size,
        num_hidden_layers=q.num_hidden_layers, num_attention_heads=q.num_attention_heads,
        num_key_value_heads=q.num_key_value_heads, max_position_embeddings=q.max_position_embeddings,
        rms_norm_eps=q.rms_norm_eps, rope_theta=q.rope_parameters["rope_theta"], mask_token_id=adapter.mask_id,
        pad_token_id=adapter.pad_id, attn_implementation="sdpa")
    added = "default" not in rope.ROPE_INIT_FUNCTIONS
    if added:
        rope.ROPE_INIT_FUNCTIONS["default"] = _default_rope
    try:
        model = code.modeling_dream.DreamModel(cfg)
    finally:
        if added:
            del rope.ROPE_INIT_FUNCTIONS["default"]
    head = adapter.model.get_output_embeddings()
    if head.bias is not None:  # tiny_dream's constant [M] logit
        model.lm_head = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    model.load_state_dict(adapter.model.state_dict())
    return model.to(adapter.dtype).eval()


def tiny_model(scale: float, dtype: torch.dtype, mask_logit: float | None = -20.0):
    """``tests/conftest.py``'s ``tiny_dream`` (the tests' model), in ``dtype``, its ``[M]`` logit the
    constant ``mask_logit`` (far below the others, as a trained Dream's; ``None``: the random row)."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from conftest import tiny_dream
    finally:
        sys.path.pop(0)
    ad = tiny_dream(scale=scale, max_positions=512, mask_logit=mask_logit)
    ad.model.to(dtype)
    return ad


def prompts(adapter, rows: int, chars: int = 12, seed: int = 0) -> torch.Tensor:
    """``[rows, 1 + chars]`` unpadded prompt ids of distinct random lowercase strings."""
    from maskrl.text import encode_prompts

    g = torch.Generator().manual_seed(seed)
    texts = ["".join(chr(97 + int(c)) for c in torch.randint(0, 26, (chars,), generator=g)) for _ in range(rows)]
    ids, mask = encode_prompts(adapter.tokenizer, texts)
    assert bool(mask.all()), "prompts must be unpadded"
    return ids


# ------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Setting:
    """One comparison: the variant (``plain`` / ``block``), Dream's arguments, and the model."""

    variant: str
    alg: str
    gen_length: int
    steps: int
    block_length: int | None = None
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    alg_temp: float = 0.0
    cache: str = "prefix"  # block variant: prefix (dual_cache=False) or dual
    threshold: float = 0.9
    model: str = "sharp"  # a MODEL_SPECS name: sharp (output layer x 8), flat (x 1), bf16 / bf16peak, mask0, loud
    dream_dtype: str = "float32"

    @property
    def name(self) -> str:
        parts = [self.variant, self.alg, f"L{self.gen_length}", f"T{self.steps}"]
        if self.variant == "block":
            parts += [f"b{self.block_length}", self.cache]
        parts += [f"tau{self.temperature}", f"topk{self.top_k}"]
        parts += [f"topp{self.top_p}"] if self.top_p is not None else []
        parts += [f"algtemp{self.alg_temp}"] if self.alg_temp else []
        parts += [self.model] + ([f"dtype-{self.dream_dtype}"] if self.model.startswith("bf16") else [])
        return "-".join(parts)

    def sampler(self):
        """maskrl's :class:`~maskrl.sampling.SamplerConfig` for this setting."""
        from maskrl.sampling import SamplerConfig

        kw = dict(gen_length=self.gen_length, steps=self.steps, temperature=self.temperature, top_k=self.top_k,
                  top_p=self.top_p if self.top_p is not None else 1.0, alg_temp=self.alg_temp,
                  dream_dtype=self.dream_dtype)
        if self.variant == "plain":
            return SamplerConfig(**kw, block_length=self.gen_length, schedule="dream", remasking=self.alg)
        kw.update(block_length=self.block_length, block_first="forced", cache=self.cache)
        if self.alg == "confidence_threshold":
            return SamplerConfig(**kw, schedule="threshold", remasking="maskgit_plus", threshold=self.threshold)
        return SamplerConfig(**kw, schedule="dream", remasking=self.alg)


def full_settings() -> list[Setting]:
    """The matrix of ``dream_reference.json``."""
    out = []
    for alg in ("maskgit_plus", "topk_margin", "entropy", "origin"):
        for top_k in (None, 50):
            for tau in (0.0, 0.7):
                for alg_temp in ((0.0,) if alg == "origin" else (0.0, 0.5)):
                    out.append(Setting("plain", alg, 32, 16, temperature=tau, top_k=top_k, alg_temp=alg_temp))
                out.append(Setting("plain", alg, 32, 32, temperature=tau, top_k=top_k, model="flat"))
                out.append(Setting("plain", alg, 32, 16, temperature=tau, top_k=top_k, model="bf16",
                                   dream_dtype="model"))
    out.append(Setting("plain", "entropy", 64, 64, temperature=0.2, top_k=50, top_p=0.95))  # Dream's README call
    # the departure: models whose [M] logit is 0 (mask0) or a random output row (loud) make [M] a candidate
    out += [Setting("plain", alg, 32, 16, temperature=tau, top_k=50, model=m)
            for m in ("mask0", "loud") for alg in ("maskgit_plus", "entropy") for tau in (0.0, 0.7)]
    out += [Setting("plain", "entropy", 32, 16, temperature=tau, top_k=50, model="bf16") for tau in (0.0, 0.7)]
    # bf16 with peaked distributions (output layer x 35): torch's Categorical rejects many of Dream's bf16
    # probabilities, and Dream's code then takes the greedy candidates
    out += [Setting("plain", alg, 32, 16, temperature=1.0, model="bf16peak", dream_dtype=dt)
            for alg in ("maskgit_plus", "entropy", "origin") for dt in ("model", "float32")]
    out += [Setting("block", alg, 256, 64, 32, temperature=1.0, model="bf16peak", dream_dtype="model", cache=cache)
            for alg in ("entropy", "confidence_threshold") for cache in ("prefix", "dual")]
    for cache in ("prefix", "dual"):
        for tau in (0.0, 0.7):
            for top_k in (None, 50):
                out.append(Setting("block", "entropy", 256, 64, 32, temperature=tau, top_k=top_k, cache=cache))
                out.append(Setting("block", "confidence_threshold", 256, 8, 32, temperature=tau, top_k=top_k,
                                   cache=cache))
            out.append(Setting("block", "entropy", 256, 256, 32, temperature=tau, top_k=50, cache=cache))
        out.append(Setting("block", "entropy", 256, 64, 32, temperature=0.7, top_k=50, alg_temp=0.5, cache=cache))
    return out


def fixture_settings() -> list[Setting]:
    """The small settings whose Dream tokens ``--fixture`` records for the tests."""
    out = []
    for alg in ("maskgit_plus", "topk_margin", "entropy", "origin"):
        for top_k in (None, 50):
            for tau in (0.0, 0.7):
                out.append(Setting("plain", alg, 16, 8, temperature=tau, top_k=top_k))
    out.append(Setting("plain", "entropy", 16, 8, temperature=0.7, top_k=50, alg_temp=0.5))
    out.append(Setting("plain", "maskgit_plus", 16, 8, temperature=0.7, top_k=50, model="bf16", dream_dtype="model"))
    for cache in ("prefix", "dual"):
        for tau in (0.0, 0.7):
            out.append(Setting("block", "entropy", 64, 16, 16, temperature=tau, top_k=50, cache=cache))
            out.append(Setting("block", "confidence_threshold", 64, 4, 16, temperature=tau, top_k=50, cache=cache))
        out.append(Setting("block", "entropy", 256, 64, 32, temperature=0.7, top_k=50, cache=cache))  # paper shape
    out.append(Setting("plain", "entropy", 16, 8, temperature=1.0, model="bf16peak", dream_dtype="model"))
    out.append(Setting("block", "entropy", 64, 16, 16, temperature=1.0, model="bf16peak", dream_dtype="model"))
    out.append(Setting("block", "confidence_threshold", 64, 4, 16, temperature=1.0, model="bf16peak",
                       dream_dtype="model"))
    return out


# ------------------------------------------------------------------------------------------- running
@dataclass
class Counters:
    """What Dream's code did that explains a difference: ``[M]`` candidates and Categorical rejections."""

    mask_draws: int = 0
    fallbacks: int = 0
    calls: int = 0
    _patched: list = field(default_factory=list)


@contextlib.contextmanager
def watching(code, mask_id: int):
    """Count, in Dream's ``sample_tokens``, the ``[M]`` candidates and the Categorical rejections
    (wrapping the module attributes at run time; Dream's functions themselves are called unchanged)."""
    c = Counters()
    saved = []
    for mod in (code.generation_utils, code.generation_utils_block):
        real_sample, real_dists = mod.sample_tokens, mod.dists

        def sample(*a, _real=real_sample, **k):
            c.calls += 1
            conf, x0 = _real(*a, **k)
            c.mask_draws += int((x0 == mask_id).sum())
            return conf, x0

        def categorical(*a, _real=real_dists, **k):
            try:
                return _real.Categorical(*a, **k)
            except Exception:
                c.fallbacks += 1
                raise

        saved.append((mod, real_sample, real_dists))
        mod.sample_tokens = sample
        mod.dists = types.SimpleNamespace(Categorical=categorical)
    try:
        yield c
    finally:
        for mod, real_sample, real_dists in saved:
            mod.sample_tokens, mod.dists = real_sample, real_dists


def run_dream(code, model, adapter, s: Setting, ids: torch.Tensor,
              seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Dream's completion ``[N, L]`` and, for ``plain``, the step each position was unmasked at (-1: never)."""
    mix = code.generation_utils if s.variant == "plain" else code.generation_utils_block
    model.diffusion_generate = types.MethodType(mix.DreamGenerationMixin.diffusion_generate, model)
    model._sample = types.MethodType(mix.DreamGenerationMixin._sample, model)
    gc = mix.DreamGenerationConfig(
        temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=s.gen_length, steps=s.steps,
        alg=s.alg, alg_temp=s.alg_temp, mask_token_id=adapter.mask_id, pad_token_id=adapter.pad_id,
        eos_token_id=adapter.eos_id, bos_token_id=int(ids[0, 0]), return_dict_in_generate=True,
        output_history=s.variant == "plain")
    kw = {} if s.variant == "plain" else dict(block_length=s.block_length, dual_cache=s.cache == "dual",
                                              threshold=s.threshold)
    torch.manual_seed(seed)
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        out = model.diffusion_generate(ids, generation_config=gc, attention_mask=torch.ones_like(ids), **kw)
    p = ids.shape[1]
    comp = out.sequences[:, p:]
    if not out.history:
        return comp, None
    hist = torch.stack([h[:, p:] for h in out.history])  # [T, N, L]
    unmasked = hist != adapter.mask_id
    first = unmasked.float().argmax(0)
    return comp, torch.where(unmasked.any(0), first, torch.full_like(first, -1))


def run_maskrl(adapter, s: Setting, ids: torch.Tensor, seed: int):
    """maskrl's Rollout for the setting."""
    from maskrl.sampling import generate

    return generate(adapter, ids, torch.ones_like(ids, dtype=torch.bool), s.sampler(),
                    generator=torch.Generator().manual_seed(seed))


def maskrl_tokens(adapter, s: Setting, ids: torch.Tensor, seed: int) -> torch.Tensor:
    """maskrl's completions ``[N, L]``, run as Dream's side runs: ``plain`` one batch seeded ``seed``,
    ``block`` one row per call seeded ``seed + row``."""
    if s.variant == "plain":
        return run_maskrl(adapter, s, ids, seed).completion_ids
    return torch.cat([run_maskrl(adapter, s, ids[r:r + 1], seed + r).completion_ids for r in range(ids.shape[0])])


def compare(code, models: dict, s: Setting, rows: int, seed: int) -> dict:
    """One setting: both sides on ``rows`` prompts; the counts of equal rows."""
    adapter, ref = models[s.model]
    ids = prompts(adapter, rows)
    t0 = time.time()
    with watching(code, adapter.mask_id) as c:
        if s.variant == "plain":
            dream_tokens, dream_steps = run_dream(code, ref, adapter, s, ids, seed)
        else:  # one row per call, as Fast-dLLM runs it (its dual cache and threshold take one row)
            dream_tokens = torch.cat([run_dream(code, ref, adapter, s, ids[r:r + 1], seed + r)[0] for r in range(rows)])
            dream_steps = None
    t1 = time.time()
    if s.variant == "plain":
        ro = run_maskrl(adapter, s, ids, seed)
        ours, our_steps = ro.completion_ids, ro.commit_step
    else:
        ours, our_steps = maskrl_tokens(adapter, s, ids, seed), None
    t2 = time.time()
    equal = (ours == dream_tokens).all(-1)
    rec = dict(name=s.name, **{k: v for k, v in vars(s).items()}, rows=rows,
               rows_equal_tokens=int(equal.sum()), positions_equal=int((ours == dream_tokens).sum()),
               positions=int(ours.numel()), dream_mask_candidates=c.mask_draws, dream_sample_calls=c.calls,
               dream_categorical_rejections=c.fallbacks, dream_seconds=round(t1 - t0, 2),
               maskrl_seconds=round(t2 - t1, 2))
    if dream_steps is not None:
        rec["rows_equal_commit_steps"] = int((our_steps == dream_steps).all(-1).sum())
    rec["_tokens"] = dream_tokens
    return rec


#: ``tiny_model`` arguments of each model name: output-layer scale, dtype (and ``mask_logit`` if not -20)
MODEL_SPECS = {"sharp": (8.0, torch.float32), "flat": (1.0, torch.float32), "bf16": (8.0, torch.bfloat16),
               "bf16peak": (35.0, torch.bfloat16), "mask0": (8.0, torch.float32, 0.0),
               "loud": (8.0, torch.float32, None)}


def build_models(code, names: set[str]) -> dict:
    """``{name: (adapter, Fast-dLLM DreamModel)}``; checks that both give the same logits bit for bit."""
    models = {}
    for name in sorted(names):
        adapter = tiny_model(*MODEL_SPECS[name])
        ref = dream_model(code, adapter)
        ids = prompts(adapter, 4)
        x = torch.cat([ids, torch.full((4, 20), adapter.mask_id)], 1)
        with torch.no_grad():
            a = adapter._raw_logits(x, None)
            b = ref(x, "full", None).logits
        if not torch.equal(a, b):
            raise RuntimeError(f"{name}: Fast-dLLM's DreamModel and maskrl's adapter differ by "
                               f"{(a.float() - b.float()).abs().max():.3g} on the same weights")
        models[name] = (adapter, ref)
    return models


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dream-code", type=Path, default=DEFAULT_CODE,
                    help="folder with Fast-dLLM's dream/model files (default $MASKRL_DREAM_CODE or %(default)s)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "references" / "dream_reference.json")
    ap.add_argument("--fixture", type=Path, default=None, help="write the tests' fixture here instead")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--only", default="", help="run the settings whose name contains this")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    try:
        code = load_dream_code(args.dream_code)
    except DreamCodeMissing as err:
        print(err, file=sys.stderr)
        return 2
    settings = fixture_settings() if args.fixture else [s for s in full_settings() if args.only in s.name]
    rows = 4 if args.fixture else args.rows
    models = build_models(code, {s.model for s in settings})
    records = []
    for s in settings:
        rec = compare(code, models, s, rows, args.seed)
        records.append(rec)
        extra = f" commit steps {rec['rows_equal_commit_steps']}/{rows}" if "rows_equal_commit_steps" in rec else ""
        print(f"{rec['name']}: tokens {rec['rows_equal_tokens']}/{rows}{extra} "
              f"([M] candidates {rec['dream_mask_candidates']}, rejections {rec['dream_categorical_rejections']})",
              flush=True)
    head = dict(dream_code=code.where, source="NVlabs/Fast-dLLM dream/model (commit 24cc59e)", sha256=code.sha256,
                torch=torch.__version__, transformers=importlib.import_module("transformers").__version__,
                seed=args.seed)
    if args.fixture:
        out = dict(head, machine=float_key(), rows=rows, prompts_seed=0,
                   note="tokens = completions produced by Dream's / Fast-dLLM's code (benchmarks/references/dream_reference.py)")
        lines = [json.dumps(dict({k: v for k, v in r.items() if k in Setting.__dataclass_fields__},
                                 name=r["name"], tokens=r["_tokens"].tolist())) for r in records]
        text = json.dumps(out, indent=1)[:-2] + ',\n "settings": [\n' + ",\n".join(lines) + "\n ]\n}\n"
        json.loads(text)
        args.fixture.write_text(text)
        return 0
    summary = dict(settings=len(records), rows=sum(r["rows"] for r in records),
                   rows_equal_tokens=sum(r["rows_equal_tokens"] for r in records))
    out = dict(head, summary=summary, settings=[{k: v for k, v in r.items() if not k.startswith("_")} for r in records])
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
