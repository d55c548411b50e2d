"""``maskrl plan``: memory and time of a recipe per process, before renting GPUs (issue 21).

How each number is obtained -- counted on the library's own code, not from hand formulas:

* **Work** (forward rows, scored positions): the recipe's trainer runs on a *stand-in* -- a
  1-layer, 32-wide built-in model with the recipe's sampler (L, block, steps, schedule, cache),
  B, G, μ, objective, likelihood and credit modules, on synthetic prompts of ``prompt_length``
  tokens and random 0/1 rewards (a seeded generator), with early stopping switched off (every
  completion runs to L tokens, the worst case) and DiSPO keeping every branched state
  (``skip_equal: false``: the step term's B·G·Z rows, its worst case, instead of the states whose
  random rewards happen to differ, :func:`dispo_step_rows`). ``RLTrainer.collect`` records every
  decoder and output-layer call of the rollout (and of the credit modules' observers); the loss terms come from
  ``RLTrainer.loss_terms`` (DiSPO's branches, SML's strata, RLDF/DTCA's states included) and are
  split with the trainer's own :func:`maskrl.trainer.split_rows` under ``micro_batch_size`` /
  ``max_forward_rows``; each micro-batch's likelihood call runs once on the stand-in (no grad) to
  record its rows R, sequence length S and scored positions M. Phases follow the trainer's rules
  (``optimize``): θ_old when μ > 1 and the objective uses a ratio, the reference when it needs one,
  θ always (forward + backward), each μ times.
* **FLOPs**: ``torch.utils.flop_counter.FlopCounterMode`` on the recipe's real model shape built on
  the ``meta`` device (no memory), through the same adapter calls (``log_probs_at`` with and without
  backward, ``decoder_forward`` with a key/value cache, the output layer), at (R, M) = (1, 1), (2, 1),
  (1, 2) per sequence length; every count is affine in R and M (rows and scored positions are batch
  dimensions), which the three points give exactly. Gradient checkpointing's recomputation and
  LoRA's extra matmuls are counted because they run.
* **Parameter memory**: ``accelerate.utils.calculate_maximum_sizes`` on the meta model (accelerate's
  ``estimate-memory`` logic), LoRA applied with peft on the meta model; gradients and AdamW states
  from the trainable count, divided by the processes where the strategy shards them (FSDP, ZeRO-3:
  weights, gradients, optimizer; ZeRO-2: gradients, optimizer; DDP: nothing, plus one gradient
  bucket copy).
* **Activation memory** (transient peaks of one forward, one forward + backward, one sampler step):
  measured with torch's CPU profiler (allocation events) on *narrow* real models of the recipe's
  architecture -- the same vocabulary, layer types, head count, LoRA rank, dtype and checkpointing,
  hidden widths 2·heads and 4·heads, 1 and 2 layers -- at the recipe's sequence length. Each peak is
  affine in 1/k (k = the width's reduction; every activation has one width-proportional dimension or
  none) and in the layer count, and affine in R and M; the fit is exact for that structure and is
  evaluated at the full width and depth.

The CPU check (``benchmarks/plan_check.py``) compares this plan with the peak resident memory of real
trainer steps in fresh processes and with ``FlopCounterMode`` on the same steps.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

GIB = 2**30

#: published shapes (config.json) of the checkpoints the 8B recipes name, so that planning needs no
#: download. LLaDA: GSAI-ML/LLaDA-8B-Instruct config.json (d_model 4096, n_layers 32, n_heads 32,
#: n_kv_heads 32, mlp_hidden_size 12288, embedding_size 126464, no biases, untied). Dream:
#: Dream-org/Dream-v0-Instruct-7B config.json (Qwen2-7B shape: hidden_size 3584, num_hidden_layers 28,
#: num_attention_heads 28, num_key_value_heads 4, intermediate_size 18944, vocab_size 152064, q/k/v
#: biases, untied).
_LLADA = dict(family="llada", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=32,
              intermediate_size=12288, vocab_size=126464, tie=False)
_DREAM = dict(family="dream", hidden_size=3584, num_layers=28, num_heads=28, num_kv_heads=4,
              intermediate_size=18944, vocab_size=152064, tie=False)
KNOWN_MODELS: dict[str, dict] = {
    "GSAI-ML/LLaDA-8B-Instruct": _LLADA, "GSAI-ML/LLaDA-8B-Base": _LLADA,
    "Dream-org/Dream-v0-Instruct-7B": _DREAM, "Dream-org/Dream-v0-Base-7B": _DREAM,
}
STRATEGIES = ("single", "ddp", "fsdp", "zero2", "zero3")


class PlanError(ValueError):
    """A plan cannot be made (unknown model shape, bad option); the message names the option."""


@dataclass(frozen=True)
class ModelShape:
    """Architecture of a model family member (SPEC §1.1).

    Attributes:
        family: ``llada`` (Llama blocks, no biases), ``dream`` (Qwen2 blocks, q/k/v biases) or ``tiny``
            (the built-in Llama).
        hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size, vocab_size: the shape.
        tie: output layer tied to the embedding.
        source: where the numbers come from.
    """

    family: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie: bool = False
    source: str = ""

    def hf_config(self, hidden_size: int | None = None, num_layers: int | None = None):
        """A transformers config of this shape (optionally narrowed: ``hidden_size`` with the same head
        count, so head_dim = hidden/heads; intermediate scaled by the same factor)."""
        from transformers import LlamaConfig, Qwen2Config

        h = hidden_size or self.hidden_size
        inter = self.intermediate_size * h // self.hidden_size
        kw = dict(vocab_size=self.vocab_size, hidden_size=h, intermediate_size=inter,
                  num_hidden_layers=num_layers or self.num_layers, num_attention_heads=self.num_heads,
                  num_key_value_heads=self.num_kv_heads, tie_word_embeddings=self.tie, max_position_embeddings=8192,
                  rms_norm_eps=1e-5, pad_token_id=None)
        if self.family == "dream":
            return Qwen2Config(**kw, rope_theta=1e6)
        return LlamaConfig(**kw, rope_theta=500000.0, attention_bias=False, mlp_bias=False)


def model_shape(cfg) -> ModelShape:
    """The shape of ``cfg.model``: a known Hub id (:data:`KNOWN_MODELS`), a local folder's ``config.json``
    (LLaDA or standard keys), or the built-in tiny model (``model.path`` empty).

    Raises:
        PlanError: a path that is neither known nor a folder with a readable config.json.
    """
    path = cfg.model.path
    if not path:
        from maskrl.pipeline import tiny_tokenizer
        from maskrl.models.tokenizer import build_char_tokenizer

        t = cfg.model.tiny
        tok = tiny_tokenizer(t.tokenizer) or build_char_tokenizer()
        return ModelShape("tiny", t.hidden_size, t.num_layers, t.num_heads, t.num_heads, t.intermediate_size, len(tok),
                          source="model.tiny")
    if path in KNOWN_MODELS:
        return ModelShape(**KNOWN_MODELS[path], source=f"{path} config.json (published values, maskrl.plan.KNOWN_MODELS)")
    f = Path(path) / "config.json"
    if not f.is_file():
        raise PlanError(f"model.path: {path!r} is neither a known Hub id ({', '.join(KNOWN_MODELS)}) nor a folder "
                        "with a config.json; download the config or pass a local folder")
    c = json.loads(f.read_text())
    if "d_model" in c:  # LLaDA's OLMo-style keys
        return ModelShape("llada", c["d_model"], c["n_layers"], c["n_heads"], c.get("n_kv_heads") or c["n_heads"],
                          c["mlp_hidden_size"], c.get("embedding_size") or c["vocab_size"], bool(c.get("weight_tying")),
                          source=str(f))
    fam = "dream" if str(c.get("model_type", "")).lower() in ("dream", "qwen2") else "llada"
    return ModelShape(fam, c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
                      c.get("num_key_value_heads") or c["num_attention_heads"], c["intermediate_size"], c["vocab_size"],
                      bool(c.get("tie_word_embeddings")), source=str(f))


def parse_bytes(text: str) -> float:
    """``"80GB"`` / ``"80GiB"`` / ``"24G"`` / a plain number of GiB -> bytes (GB is read as GiB, as
    GPU vendors' "80 GB" cards hold 79-80 GiB usable).

    Raises:
        PlanError: unparsable text.
    """
    s = str(text).strip().upper().replace(" ", "")
    for suffix in ("GIB", "GB", "G"):
        if s.endswith(suffix):
            s = s[: -len(suffix)]
            break
    try:
        v = float(s)
    except ValueError:
        raise PlanError(f"--gpu-memory: cannot read {text!r} (e.g. 80GB)") from None
    if v <= 0:
        raise PlanError(f"--gpu-memory: must be > 0, got {text!r}")
    return v * GIB


def strategy_from_accelerate(path: str | None, gpus: int) -> str:
    """The sharding strategy of an accelerate config file (``distributed_type`` FSDP / DEEPSPEED with
    its ZeRO stage / MULTI_GPU), or ``ddp`` for several processes and ``single`` for one without a file.

    Raises:
        PlanError: an unreadable file.
    """
    if not path:
        return "ddp" if gpus > 1 else "single"
    import yaml

    try:
        c = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise PlanError(f"--accelerate-config: cannot read {path} ({e})") from None
    kind = str(c.get("distributed_type", "")).upper()
    if kind == "FSDP":
        return "fsdp"
    if kind == "DEEPSPEED":
        ds = c.get("deepspeed_config") or {}
        stage = ds.get("zero_stage")
        if stage is None and ds.get("deepspeed_config_file"):
            f = Path(ds["deepspeed_config_file"])
            f = f if f.is_file() else Path(path).parent / f.name
            stage = json.loads(f.read_text()).get("zero_optimization", {}).get("stage")
        return "zero3" if int(stage or 2) == 3 else "zero2"
    return "ddp" if gpus > 1 else "single"


# ----------------------------------------------------------------------------------------------
# work: what the trainer runs, recorded on a stand-in
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """One model forward: ``rows`` × ``seq`` tokens (``past`` cached keys), ``scored`` output-layer
    positions, in ``phase`` (``rollout``, ``theta_old``, ``reference``, ``theta``) of loss ``term``;
    ``count`` times per RL step."""

    phase: str
    term: str
    rows: int
    seq: int
    scored: int
    past: int = 0
    count: int = 1


class _Recorder:
    """Hooks on a stand-in model recording (rows, query length, cached keys, scored positions) of each
    decoder and output-layer call."""

    def __init__(self, adapter) -> None:
        self.calls: list[list[int]] = []
        model = adapter.model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._h = [base.get_decoder().register_forward_pre_hook(self._decoder, with_kwargs=True),
                   base.get_output_embeddings().register_forward_hook(self._head)]

    def _decoder(self, _m, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        q = ids.shape[1]
        past = (mask.shape[-1] - q) if mask is not None and mask.dim() == 4 else 0
        self.calls.append([ids.shape[0], q, past, 0])

    def _head(self, _m, _args, out):  # after the adapter's own pre-hook has picked the scored positions
        if self.calls:
            self.calls[-1][3] += out.reshape(-1, out.shape[-1]).shape[0]

    def take(self) -> list[list[int]]:
        out, self.calls = self.calls, []
        return out

    def close(self) -> None:
        for h in self._h:
            h.remove()


def dispo_step_rows(cfg) -> int:
    """Forward rows of DiSPO's step term per RL step and process in the worst case (SPEC §4): every
    trajectory branches at exactly one state (the fixed schedule draws t from {0, …, T−1}; the
    threshold schedule falls back to a row's last step), so there are B·G states
    (``train.prompts_per_step`` × ``train.group_size``); a state is kept when its Z fillings' rewards
    differ, at most all of them, and each kept state is Z rows. Returns B·G·Z summed over the
    recipe's DiSPO modules with ``alpha_step > 0`` (0 without one). Unit: forward rows (sequences of
    P + L tokens) of one θ pass, before micro-batching and μ.

    How many states are kept depends on the rewards (the fraction with reward spread), which no plan
    knows; the plan counts this bound, which is what memory and time must be sized for (the step
    term's forwards are padded to the processes' maximum anyway, ``RLTrainer.optimize``)."""
    from maskrl.credit.dispo import DiSPO

    n = cfg.train.prompts_per_step * cfg.train.group_size
    return sum(n * m.z for m in cfg.credit if isinstance(m, DiSPO) and m.alpha_step > 0)


def _standin_config(cfg):
    """The recipe on the stand-in model: 1-layer 32-wide tiny Llama (char tokenizer), float32, no LoRA
    or checkpointing (neither changes which forwards run), DTCA's POS table dropped (it only reweights),
    DiSPO with ``skip_equal: false`` (every branched state kept, the step term's worst case,
    :func:`dispo_step_rows`; with the stand-in's random rewards the kept count was a sample that moved
    with the seed and with any change to the draws); every other section as in the recipe."""
    from maskrl.credit.dispo import DiSPO

    c = copy.deepcopy(cfg)
    c.model = dataclasses.replace(c.model, path="", dtype="float32", lora_rank=0, gradient_checkpointing=False,
                                  tiny=dataclasses.replace(c.model.tiny, hidden_size=32, num_layers=1, num_heads=2,
                                                           intermediate_size=64, tokenizer="char"))
    credits = []
    for m in c.credit:
        if hasattr(m, "pos_weights") and getattr(m, "pos_weights", None):
            m = dataclasses.replace(m, pos_weights=None, tagger=None)
        if isinstance(m, DiSPO):
            m = dataclasses.replace(m, skip_equal=False)
        credits.append(m)
    c.credit = credits
    return c


def estimate_prompt_length(cfg, limit: int = 256, default: int = 256) -> tuple[int, str]:
    """``(P, how)``: the longest prompt in tokens among the first ``limit`` training rows, measured with
    the run's tokenizer and prompt format when it is at hand (the built-in tiny model's tokenizers; a
    local model folder), else ``default`` (a Hub id, or no data)."""
    from maskrl.pipeline import prompt_formatter, task_and_data, tiny_tokenizer
    from maskrl.text import encode_prompts

    try:
        if cfg.model.path:
            if not (Path(cfg.model.path) / "tokenizer.json").is_file():
                return default, f"default {default} (no local tokenizer)"
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(cfg.model.path, trust_remote_code=False)  # never asks to run remote code
        else:
            from maskrl.models.tokenizer import build_char_tokenizer

            tok = tiny_tokenizer(cfg.model.tiny.tokenizer) or build_char_tokenizer()
        c = copy.deepcopy(cfg)
        c.task = dataclasses.replace(c.task, train_size=min(c.task.train_size, limit))
        task, _, _, train = task_and_data(c)
        from types import SimpleNamespace

        fmt = prompt_formatter(SimpleNamespace(tokenizer=tok), cfg.model.chat_template)
        ids, _ = encode_prompts(tok, [fmt(task.format_prompt(ex) if hasattr(task, "format_prompt") else ex.prompt)
                                      for ex in train[:limit]])
        return int(ids.shape[1]), f"measured: longest of {min(limit, len(train))} training prompts"
    except Exception as e:  # noqa: BLE001 - no data or tokenizer here: the stated default
        return default, f"default {default} ({type(e).__name__}: {str(e)[:80]})"


def synthetic_trainer(cfg, prompt_length: int, seed: int = 0):
    """An :class:`~maskrl.trainer.RLTrainer` of ``cfg``'s model (``load_policy``) on synthetic work:
    ``train.prompts_per_step`` prompts of ``prompt_length`` random characters (the built-in character
    tokenizer: one token each, bos included), random 0/1 rewards from a generator seeded with ``seed``,
    and no early stop (the adapter's eos id is set to -1, so every completion is L tokens long). The
    plan's stand-in and the CPU check (``benchmarks/plan_check.py``) run their steps on it; nothing is
    written to disk."""
    from maskrl.pipeline import load_policy
    from maskrl.tasks.base import Example, Task
    from maskrl.trainer import RLTrainer

    cfg = copy.deepcopy(cfg)
    cfg.output_dir = "/nonexistent-maskrl-plan"
    policy = load_policy(cfg)
    policy = dataclasses.replace(policy, eos_id=-1, stop_ids=())
    gen = torch.Generator().manual_seed(seed)

    class _Synthetic(Task):
        name = "plan_synthetic"

        def reward(self, prompts, completions, **_):
            return torch.randint(0, 2, (len(completions),), generator=gen).float().tolist()

    chars = "0123456789abcdefghijklmnopqrstuvwxyz"
    picks = torch.randint(0, len(chars), (cfg.train.prompts_per_step, max(1, prompt_length - 1)), generator=gen)
    examples = [Example(id=i, prompt="".join(chars[j] for j in row)) for i, row in enumerate(picks.tolist())]
    return RLTrainer(cfg, policy, _Synthetic(), examples)


def record_work(cfg, prompt_length: int, seed: int = 0, micro_batch_size: int | None = None,
                max_forward_rows: int | None = None) -> list[Call]:
    """The forwards of one RL step of ``cfg`` per process (see the module docstring).

    Args:
        cfg: a :class:`maskrl.config.RunConfig`.
        prompt_length: P, prompt tokens per row (the sequence is P + L).
        seed: seed of the stand-in's weights, prompts and rewards.
        micro_batch_size, max_forward_rows: override ``train.*`` (for the "what to change" search).

    Returns:
        The :class:`Call` list (rollout calls one by one; loss calls with ``count`` = μ).
    """
    from maskrl.trainer import split_rows

    sc = _standin_config(cfg)
    if micro_batch_size is not None or max_forward_rows is not None:
        sc.train = dataclasses.replace(sc.train, micro_batch_size=sc.train.micro_batch_size if micro_batch_size is None
                                       else micro_batch_size,
                                       max_forward_rows=sc.train.max_forward_rows if max_forward_rows is None
                                       else max_forward_rows)
    trainer = synthetic_trainer(sc, prompt_length, seed)
    rec = _Recorder(trainer.policy_eval)
    try:
        batch = trainer.collect()
        calls = [Call("rollout", "-", r, q, m, past) for r, q, past, m in rec.take()]
        mu = sc.train.inner_iterations
        with torch.no_grad():
            for ti, t in enumerate(trainer.loss_terms(batch)):
                rows = t.likelihood.rows(t.rollout, t.mask)
                for j, sl in enumerate(split_rows(rows, sc.train.micro_batch_size, sc.train.max_forward_rows)):
                    if int(rows[sl].sum()) == 0:
                        continue
                    g = torch.Generator().manual_seed(1000 * ti + j)
                    t.likelihood(trainer.policy_eval, t.rollout.select(sl), g, t.mask[sl])
                    for r, q, past, m in rec.take():
                        if mu > 1 and t.objective.uses_ratio:
                            calls.append(Call("theta_old", t.name, r, q, m, past, mu))
                        if t.objective.needs_reference:
                            calls.append(Call("reference", t.name, r, q, m, past, mu))
                        calls.append(Call("theta", t.name, r, q, m, past, mu))
    finally:
        rec.close()
    return calls


# ----------------------------------------------------------------------------------------------
# FLOPs and parameters on the meta device
# ----------------------------------------------------------------------------------------------
def _dtype(name: str) -> torch.dtype:
    from maskrl.models.loading import parse_dtype

    return parse_dtype(name)


def build_adapter(shape: ModelShape, dtype: torch.dtype, lora: dict | None, checkpointing: bool, device="meta",
                  hidden_size: int | None = None, num_layers: int | None = None, seed: int = 0):
    """A :class:`~maskrl.models.ModelAdapter` of ``shape`` (optionally narrowed) on ``device``, with LoRA
    (``{rank, alpha, targets}``) and gradient checkpointing as the recipe has them."""
    from transformers import AutoModelForCausalLM

    from maskrl.models import ModelAdapter, apply_lora, enable_gradient_checkpointing

    config = shape.hf_config(hidden_size, num_layers)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    v = shape.vocab_size
    ad = ModelAdapter(model=model, mask_id=v - 1, eos_id=v - 2, pad_id=v - 2, shift=shape.family == "dream",
                      family=shape.family)
    if checkpointing:
        enable_gradient_checkpointing(ad)
    if lora:
        ad = apply_lora(ad, rank=lora["rank"], alpha=lora["alpha"], target_modules=lora["targets"])
    return ad


def _lora(cfg) -> dict | None:
    mc = cfg.model
    if mc.lora_rank <= 0:
        return None
    t = mc.lora_target_modules
    return {"rank": mc.lora_rank, "alpha": mc.lora_alpha,
            "targets": t if t == "all-linear" else [m.strip() for m in t.split(",") if m.strip()]}


def _inputs(ad, rows: int, seq: int, scored: int, device):
    ids = torch.zeros((rows, seq), dtype=torch.long, device=device)
    attn = torch.ones((rows, seq), dtype=torch.bool, device=device)
    r = torch.arange(scored, device=device) % rows
    c = torch.full((scored,), seq - 1, dtype=torch.long, device=device)
    return ids, attn, r, c, torch.zeros(scored, dtype=torch.long, device=device)


class FlopModel:
    """FLOPs of the calls of one model shape, counted by ``FlopCounterMode`` on the meta device (see
    the module docstring); memoised per (kind, sequence length, cached keys)."""

    def __init__(self, shape: ModelShape, dtype: torch.dtype, lora: dict | None, checkpointing: bool) -> None:
        from maskrl.models.scale import rl_train_mode

        self.lora = lora
        self.adapter = build_adapter(shape, dtype, lora, checkpointing)
        self.train_adapter = build_adapter(shape, dtype, lora, checkpointing)
        rl_train_mode(self.train_adapter.model)
        self.shape = shape
        self._memo: dict = {}

    def _count(self, kind: str, rows: int, seq: int, scored: int, past: int) -> int:
        from torch.utils.flop_counter import FlopCounterMode

        dev = torch.device("meta")
        if kind == "train":
            ad = self.train_adapter
            ids, attn, r, c, t = _inputs(ad, rows, seq, scored, dev)
            with FlopCounterMode(display=False) as fc:
                ad.log_probs_at(ids, attn, r, c, t).sum().backward()
            return fc.get_total_flops()
        ad = self.adapter
        off = ad.reference() if kind == "reference" and self.lora else contextlib.nullcontext()
        with torch.no_grad(), off, FlopCounterMode(display=False) as fc:
            if kind in ("forward", "reference"):
                ids, attn, r, c, t = _inputs(ad, rows, seq, scored, dev)
                ad.log_probs_at(ids, attn, r, c, t)
            else:  # rollout: decoder against ``past`` cached keys, then the output layer on ``scored`` states
                ids = torch.zeros((rows, seq), dtype=torch.long, device=dev)
                kv = None
                if past:
                    cfg = ad.model.config
                    hd = cfg.hidden_size // cfg.num_attention_heads
                    kv = [(torch.zeros((rows, cfg.num_key_value_heads, past, hd), dtype=ad.dtype, device=dev),) * 2
                          for _ in range(cfg.num_hidden_layers)]
                pos = torch.arange(past, past + seq, device=dev).expand(rows, seq)
                hidden, _ = ad.decoder_forward(ids, torch.ones((rows, past + seq), dtype=torch.bool, device=dev), pos,
                                               past=kv)
                if scored:
                    ad.head(hidden.reshape(-1, hidden.shape[-1])[:1].expand(scored, -1))
        return fc.get_total_flops()

    def flops(self, kind: str, rows: int, seq: int, scored: int, past: int = 0) -> int:
        """FLOPs of one call: ``kind`` ``train`` (forward + backward), ``forward`` (no grad, scored
        positions through the output layer), ``reference`` (the same with LoRA adapters disabled, as the
        trainer's reference policy is) or ``rollout`` (decoder + output layer)."""
        key = (kind, seq, past)
        if key not in self._memo:
            f11 = self._count(kind, 1, seq, 1, past)
            f21 = self._count(kind, 2, seq, 1, past)
            f12 = self._count(kind, 1, seq, 2, past)
            self._memo[key] = (f11, f21 - f11, f12 - f11)
        f11, per_row, per_pos = self._memo[key]
        return int(f11 + (rows - 1) * per_row + (scored - 1) * per_pos)


def param_memory(shape: ModelShape, dtype: torch.dtype, lora: dict | None) -> dict:
    """Parameter bytes and counts of the model (meta device; accelerate's ``calculate_maximum_sizes``):
    ``{total_bytes, largest_layer_bytes, params, trainable}``."""
    from accelerate.utils import calculate_maximum_sizes

    ad = build_adapter(shape, dtype, lora, False)
    total, largest = calculate_maximum_sizes(ad.model)
    params = sum(p.numel() for p in ad.model.parameters())
    trainable = sum(p.numel() for p in ad.model.parameters() if p.requires_grad)
    return {"total_bytes": int(total), "largest_layer_bytes": int(largest[0]), "params": int(params),
            "trainable": int(trainable)}


# ----------------------------------------------------------------------------------------------
# activation peaks: narrow real models, torch's CPU profiler
# ----------------------------------------------------------------------------------------------
#: bytes of the boundary marker :func:`profiled_peak` allocates when ``fn`` returns (odd, so that no
#: float or integer tensor of the measured code has this size)
_MARK_BYTES = 999_983


def _allocation_events(prof) -> list[tuple[int, int, int]]:
    """``(time ns, address, bytes)`` of every CPU allocation (bytes > 0) and free (bytes < 0) a finished
    ``torch.profiler.profile(profile_memory=True)`` recorded, in time order."""
    from torch._C._profiler import _EventType

    out, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            out.append((node.start_time_ns, node.extra_fields.ptr, node.extra_fields.alloc_size))
        stack.extend(node.children)
    return sorted(out, key=lambda e: e[0])


def profiled_peak(fn) -> tuple[int, int]:
    """``(peak, end)``: bytes allocated above the starting level at the peak and at the end of
    ``fn()`` (torch's CPU profiler allocation events; CPU tensors only).

    Only frees of blocks allocated *inside* the profiled region count (matched by address). The CPU
    allocator's profiling reporter (c10 ``ProfiledCPUMemoryReporter``) forgets a block's size only
    when the block is freed while profiling; a block freed outside leaves a stale address -> size
    entry, and when the C allocator later hands that address to a tensor allocated outside
    profiling, the tensor's free in a later session is reported with the stale size -- a spurious
    free that lowered measured peaks by a whole activation at random (which addresses get reused
    varies between processes; plans of one recipe differed by up to 30 %). What ``fn`` returns is
    freed inside the region too, after a marker allocation of :data:`_MARK_BYTES` bytes that dates
    ``fn``'s end.

    Raises:
        RuntimeError: the profiler recorded no marker (memory profiling unavailable).
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        keep = fn()
        mark = torch.empty(_MARK_BYTES, dtype=torch.uint8)
        del keep, mark
    live: dict[int, int] = {}
    cur = best = 0
    for _, ptr, b in _allocation_events(prof):
        if b == _MARK_BYTES:
            return int(best), int(cur)
        if b > 0:
            live[ptr] = b
        elif live.pop(ptr, None) is None:
            continue  # a block allocated before the region (or a stale reporter entry): not ours
        cur += b
        best = max(best, cur)
    raise RuntimeError("profiled_peak: the profiler recorded no marker allocation (memory profiling unavailable?)")


def narrow_widths(shape: ModelShape) -> tuple[int, int]:
    """The two narrow hidden widths of the activation fit: d/16 and d/8 when both keep the head count
    with an even head size and an integer MLP width, else 2·heads and 4·heads (the narrowest such)."""
    d, h = shape.hidden_size, shape.num_heads
    picks = [d // f for f in (16, 8) if d % f == 0 and (d // f) % (2 * h) == 0
             and (shape.intermediate_size * (d // f)) % d == 0]
    if len(picks) == 2:
        return picks[0], picks[1]
    return (2 * h, 4 * h) if 4 * h < d else (d, d)


def _affine(x1: float, y1: float, x2: float, y2: float, x: float) -> float:
    return y1 + (x - x1) * (y2 - y1) / (x2 - x1) if x2 != x1 else y1


class ActivationModel:
    """Transient activation bytes of one call, from narrow real CPU models (module docstring).

    A call's peak is built from parts that each grow linearly with what they scale with, measured
    with :func:`profiled_peak` and fitted:

    * ``decoder(R)``: peak of a no-grad decoder forward of R rows (fitted in 1/k and layers, then R);
    * ``saved(R, M)``: bytes autograd keeps after the θ forward (checkpointed or not; additive, fitted
      in 1/k, layers, R and M);
    * ``backward(R)``: the decoder backward's peak above ``saved`` (per-layer recomputation and
      activation gradients);
    * ``head(M)`` / ``head_backward(M)`` / ``propose(R)``: the output layer and log-probability of M
      scored positions without / with backward, and the sampler's block proposal (float64 Gumbel-max,
      SPEC §1.2) of R rows.

    Peaks: no-grad forward ``max(decoder(R), hidden(R) + head(M))``; θ forward + backward
    ``saved(R, M) + max(backward(R), head_backward(M))``; rollout step ``max(decoder(R), hidden(R) +
    propose(R))``; ``hidden(R)`` = R·S·d bytes of the last hidden state.
    """

    def __init__(self, shape: ModelShape, dtype: torch.dtype, lora: dict | None, checkpointing: bool,
                 sampler=None) -> None:
        self.shape, self.dtype, self.lora, self.ckpt, self.sampler = shape, dtype, lora, checkpointing, sampler
        self.widths = narrow_widths(shape)
        self.bytes = torch.finfo(dtype).bits // 8
        self._memo: dict = {}
        self._models: dict = {}

    def _adapter(self, width: int, layers: int):
        key = (width, layers)
        if key not in self._models:
            from maskrl.models.scale import rl_train_mode

            ad = build_adapter(self.shape, self.dtype, self.lora, self.ckpt, device="cpu", hidden_size=width,
                               num_layers=layers)
            rl_train_mode(ad.model)
            ids, attn, r, c, t = _inputs(ad, 1, 4, 1, "cpu")  # allocate .grad once: gradients are counted apart
            ad.log_probs_at(ids, attn, r, c, t).sum().backward()
            for p in ad.model.parameters():
                if p.grad is not None:
                    p.grad.zero_()
            self._models[key] = ad
        return self._models[key]

    def _decoder_parts(self, width: int, layers: int, rows: int, seq: int) -> tuple[int, int, int]:
        """(no-grad decoder peak, saved bytes after the θ forward with one scored position, θ backward
        peak above them) of a narrow model."""
        ad = self._adapter(width, layers)
        ids, attn, r, c, t = _inputs(ad, rows, seq, 1, "cpu")
        ids = ids + 5

        def dec():
            with torch.no_grad():
                ad.decoder_forward(ids, attn, ad.position_ids(attn))

        fwd, _ = profiled_peak(dec)
        _, saved = profiled_peak(lambda: ad.log_probs_at(ids, attn, r, c, t))
        lp = ad.log_probs_at(ids, attn, r, c, t)
        bwd, _ = profiled_peak(lambda: lp.sum().backward())
        return fwd, saved, bwd

    def _head_parts(self, scored: int) -> tuple[int, int, int, int]:
        """(no-grad head + log-prob peak, saved bytes of the head with grad, its backward peak, the
        sampler's proposal peak) for ``scored`` positions, at the narrowest width (the [M, V] tensors
        dominate; the [M, d] input is added at full width)."""
        from maskrl.models.adapter import token_log_probs
        from maskrl.sampling import _propose  # the sampler's own candidate draw

        ad = self._adapter(self.widths[0], 1)
        head = ad.model.get_output_embeddings()
        hid = torch.randn((scored, self.widths[0]), dtype=self.dtype)
        tg = torch.zeros(scored, dtype=torch.long)

        def fwd():
            with torch.no_grad():
                token_log_probs(head(hid), tg)

        hf, _ = profiled_peak(fwd)
        leaf = hid.clone().requires_grad_(True)
        _, hs = profiled_peak(lambda: token_log_probs(head(leaf), tg))
        lp = token_log_probs(head(leaf), tg)
        hb, _ = profiled_peak(lambda: lp.sum().backward())
        g = torch.Generator().manual_seed(0)
        temp = self.sampler.temperature if self.sampler is not None else 0.0

        def prop():
            with torch.no_grad():
                _propose(head(hid).view(1, scored, -1), temp, g)

        pp, _ = profiled_peak(prop)
        return hf, hs, hb, pp

    def _fit(self, seq: int) -> dict:
        if seq in self._memo:
            return self._memo[seq]
        s = self.shape
        parts = {}
        for rows in (1, 2):
            vals = {(w, n): self._decoder_parts(w, n, rows, seq) for w in self.widths for n in (1, 2)}
            parts[rows] = [self._extrapolate({k: v[i] for k, v in vals.items()}) for i in range(3)]
        m1, m2 = 16, 32
        h1, h2 = self._head_parts(m1), self._head_parts(m2)
        extra = (s.hidden_size - self.widths[0]) * self.bytes  # the [M, d] input at full width, per position
        self._memo[seq] = {"dec": parts, "head": (m1, h1, m2, h2), "extra": extra}
        return self._memo[seq]

    def peak(self, kind: str, rows: int, seq: int, scored: int) -> int:
        """Transient peak bytes of one call (``forward``, ``train`` or ``rollout``) at the full shape."""
        f = self._fit(seq)
        d1, d2 = f["dec"][1], f["dec"][2]
        m1, h1, m2, h2 = f["head"]

        def dec(i):
            return max(0.0, _affine(1, d1[i], 2, d2[i], rows))

        def head(i, m):
            return max(0.0, _affine(m1, h1[i], m2, h2[i], m) + f["extra"] * m)

        hidden = rows * seq * self.shape.hidden_size * self.bytes
        if kind == "forward":
            return int(max(dec(0), hidden + head(0, scored)))
        if kind == "rollout":  # the block's rows x b positions are proposed (float64 Gumbel-max); observers' extra
            blk = min(scored, rows * self.sampler.block_length) if self.sampler is not None else scored  # ones: logits
            extra = head(0, scored - blk) if scored > blk else 0.0
            return int(max(dec(0), hidden + head(3, blk) + extra))
        saved = dec(1) + head(1, scored)
        return int(saved + max(dec(2), head(2, scored)))

    def _extrapolate(self, vals: dict) -> float:
        """``vals[(width, layers)]`` -> value at the full width and depth, affine in 1/k and layers."""
        s = self.shape
        w1, w2 = self.widths
        per_layer = {w: vals[w, 2] - vals[w, 1] for w in self.widths}
        fixed = {w: vals[w, 1] - per_layer[w] for w in self.widths}

        def at_full(d):
            return _affine(w1 / s.hidden_size, d[w1], w2 / s.hidden_size, d[w2], 1.0)

        return at_full(fixed) + s.num_layers * at_full(per_layer)


# ----------------------------------------------------------------------------------------------
# the plan
# ----------------------------------------------------------------------------------------------
@dataclass
class Hardware:
    """What the plan is for.

    Attributes:
        gpus: processes (one GPU each).
        gpu_memory: bytes per GPU.
        tflops: peak dense bf16 TFLOP/s per GPU (H100 SXM: 989).
        mfu: fraction of the peak reached (0.4 default).
        bandwidth: memory bandwidth per GPU in bytes/s (H100 SXM 3.35e12; H200 4.8e12): each forward
            reads every weight once, so a forward lasts at least weights / bandwidth.
        strategy: ``single``, ``ddp``, ``fsdp``, ``zero2`` or ``zero3``.
    """

    gpus: int = 1
    gpu_memory: float = 80 * GIB
    tflops: float = 989.0
    mfu: float = 0.4
    bandwidth: float = 3.35e12
    strategy: str = "single"

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise PlanError(f"--gpus: must be >= 1, got {self.gpus}")
        if not 0 < self.mfu <= 1:
            raise PlanError(f"--mfu: must lie in (0, 1], got {self.mfu}")
        if self.tflops <= 0 or self.bandwidth <= 0:
            raise PlanError("--tflops and --bandwidth must be > 0")
        if self.strategy not in STRATEGIES:
            raise PlanError(f"strategy: unknown {self.strategy!r}; valid: {', '.join(STRATEGIES)}")


def work_table(calls: list[Call], fm: FlopModel, checkpointing: bool) -> tuple[dict, int, int]:
    """``(by phase/term {forwards, rows, scored_positions, flops}, total FLOPs, weight reads)`` of one RL
    step's :class:`Call` list; weight reads count a checkpointed θ pass twice (its recomputation)."""
    work: dict[str, dict] = {}
    total = reads = 0
    for c in calls:
        kind = {"rollout": "rollout", "theta": "train", "reference": "reference"}.get(c.phase, "forward")
        f = fm.flops(kind, c.rows, c.seq, c.scored, c.past) * c.count
        key = c.phase if c.phase == "rollout" else f"{c.phase}/{c.term}"
        w = work.setdefault(key, {"forwards": 0, "rows": 0, "scored_positions": 0, "flops": 0})
        w["forwards"] += c.count
        w["rows"] += c.rows * c.count
        w["scored_positions"] += c.scored * c.count
        w["flops"] += f
        total += f
        reads += c.count * (2 if kind == "train" and checkpointing else 1)
    return work, total, reads


def dry_run(cfg, prompt_length: int = 256, seed: int = 0) -> dict:
    """One full RL step (rollout, credit modules, θ_old / reference / θ passes, update) of ``cfg`` on the
    plan's stand-in model (:func:`record_work`'s): the recipe's sampler, G, B, μ, micro-batching,
    objective, likelihood and credit modules on a 1-layer 32-wide model. Returns the step's metrics.
    A recipe whose settings cannot run together fails here, before any GPU is rented."""
    trainer = synthetic_trainer(_standin_config(cfg), prompt_length, seed)
    return trainer.step()


#: models, fits and recorded work shared by the plans of one process (keyed by content)
_CACHE: dict = {}


def _static_memory(cfg, pm: dict, hw: Hardware, dtype: torch.dtype, needs_reference: bool) -> dict:
    n = hw.gpus
    trainable = pm["trainable"]
    lora = cfg.model.lora_rank > 0
    shard_params = hw.strategy in ("fsdp", "zero3")
    shard_states = hw.strategy in ("fsdp", "zero2", "zero3")
    weights = pm["total_bytes"] / (n if shard_params else 1)
    grads = 4 * trainable / (n if shard_states else 1)
    adam = 8 * trainable / (n if shard_states else 1)
    out = {"weights": weights, "gradients": grads, "optimizer": adam}
    if hw.strategy == "ddp" and n > 1:
        out["ddp_buckets"] = 4.0 * trainable  # DDP's flat gradient buckets (a second copy of the gradients)
    if shard_params:
        out["gathered_layers"] = 2.0 * pm["largest_layer_bytes"]  # one unit in use, the next prefetched
    if needs_reference and not lora:
        out["reference_copy"] = float(pm["total_bytes"])  # frozen deepcopy, not sharded (docs/scaling.md)
    return out


def make_plan(cfg, hw: Hardware, prompt_length: int = 256, seed: int = 0, search: bool = True,
              micro_batch_size: int | None = None, max_forward_rows: int | None = None, shape: ModelShape | None = None,
              _cache: dict | None = None) -> dict:
    """The plan of one recipe on ``hw`` (per process): memory, work, time, and what to change.

    Args:
        cfg: the run configuration.
        hw: the hardware.
        prompt_length: P, prompt tokens per row (an estimate: the tokenizer and chat template decide).
        seed: the stand-in's seed.
        search: when the peak does not fit, try the changes listed under ``what_to_change``.
        micro_batch_size, max_forward_rows: override the recipe's.
        shape: the model's shape (default: :func:`model_shape` of ``cfg``).

    Returns:
        A JSON-able dict: ``model``, ``hardware``, ``memory_gib`` (static parts, per-phase peaks,
        ``peak``, ``fits``), ``work`` (per phase and term: forwards, rows, scored positions, FLOPs),
        ``time`` (seconds per step: compute-bound at ``mfu``, and the weight-read bound; per run),
        ``what_to_change``.
    """
    cache = _cache if _cache is not None else _CACHE
    shape = shape or model_shape(cfg)
    dtype = _dtype(cfg.model.dtype)
    lora = _lora(cfg)
    ckpt = cfg.model.gradient_checkpointing
    obj = cfg.objective
    needs_reference = obj.needs_reference or any(getattr(c, "needs_reference", False) for c in cfg.credit)
    mkey = (shape, str(dtype), json.dumps(lora, sort_keys=True), ckpt)
    if ("flop", mkey) not in cache:
        cache["flop", mkey] = FlopModel(shape, dtype, lora, ckpt)
        cache["act", mkey] = ActivationModel(shape, dtype, lora, ckpt, cfg.rollout)
        cache["param", mkey] = param_memory(shape, dtype, lora)
    fm, am, pm = cache["flop", mkey], cache["act", mkey], cache["param", mkey]
    from maskrl.config import to_dict

    wkey = ("work", json.dumps(to_dict(cfg), sort_keys=True, default=str), micro_batch_size, max_forward_rows,
            prompt_length, seed)
    if wkey not in cache:
        cache[wkey] = record_work(cfg, prompt_length, seed, micro_batch_size, max_forward_rows)
    calls = cache[wkey]

    work, total_flops, forwards = work_table(calls, fm, ckpt)

    # ---- memory
    static = _static_memory(cfg, pm, hw, dtype, needs_reference)
    static_total = sum(static.values())
    phases: dict[str, float] = {}
    kv = 0.0
    if cfg.rollout.cache != "none":
        hd = shape.hidden_size // shape.num_heads
        n_rows = max((c.rows for c in calls if c.phase == "rollout"), default=0)
        seq = prompt_length + cfg.rollout.gen_length
        kv = 2.0 * shape.num_layers * n_rows * shape.num_kv_heads * hd * seq * torch.finfo(dtype).bits / 8
    for c in calls:
        if c.phase == "rollout":
            if c.past:  # cached window steps cost less than the block's full refresh forward
                continue
            act = am.peak("rollout", c.rows, c.seq, c.scored) + kv
        elif c.phase == "theta":
            act = am.peak("train", c.rows, c.seq, c.scored)
        else:
            act = am.peak("forward", c.rows, c.seq, c.scored)
        phases[c.phase] = max(phases.get(c.phase, 0.0), act)
    peaks = {p: static_total + a for p, a in phases.items()}
    peak = max(peaks.values()) if peaks else static_total
    fits = peak <= hw.gpu_memory

    # ---- time
    rate = hw.tflops * 1e12 * hw.mfu
    compute_s = total_flops / rate
    weight_read_s = forwards * (pm["total_bytes"] / (hw.gpus if hw.strategy in ("fsdp", "zero3") else 1)) / hw.bandwidth
    step_s = max(compute_s, weight_read_s)
    by_phase_s = {k: v["flops"] / rate for k, v in work.items()}
    plan = {
        "model": {**dataclasses.asdict(shape), "dtype": str(dtype).removeprefix("torch."), "params": pm["params"],
                  "trainable": pm["trainable"], "lora": lora, "gradient_checkpointing": ckpt},
        "hardware": dataclasses.asdict(hw) | {"gpu_memory": hw.gpu_memory / GIB},
        "recipe": {"prompts_per_step": cfg.train.prompts_per_step, "group_size": cfg.train.group_size,
                   "inner_iterations": cfg.train.inner_iterations, "steps": cfg.train.steps,
                   "gen_length": cfg.rollout.gen_length, "block_length": cfg.rollout.block_length,
                   "rollout_steps": cfg.rollout.steps, "schedule": cfg.rollout.schedule, "cache": cfg.rollout.cache,
                   "prompt_length": prompt_length,
                   "micro_batch_size": cfg.train.micro_batch_size if micro_batch_size is None else micro_batch_size,
                   "max_forward_rows": cfg.train.max_forward_rows if max_forward_rows is None else max_forward_rows},
        "memory_gib": {"static": {k: v / GIB for k, v in static.items()},
                       "static_total": static_total / GIB,
                       "kv_cache": kv / GIB,
                       "activations": {k: v / GIB for k, v in phases.items()},
                       "peak_by_phase": {k: v / GIB for k, v in peaks.items()},
                       "peak": peak / GIB, "gpu_memory": hw.gpu_memory / GIB, "fits": fits},
        "work": {"by_phase_term": work, "forwards": sum(v["forwards"] for v in work.values()),
                 "flops": total_flops, "flops_per_process": total_flops,
                 "tokens_per_step": cfg.train.prompts_per_step * cfg.train.group_size * cfg.rollout.gen_length * hw.gpus},
        "time": {"compute_seconds_per_step": compute_s, "weight_read_seconds_per_step": weight_read_s,
                 "seconds_per_step": step_s, "seconds_by_phase_term": by_phase_s,
                 "hours_per_run": step_s * cfg.train.steps / 3600,
                 "basis": f"{hw.tflops:g} TFLOP/s x MFU {hw.mfu:g} per GPU; every forward reads the weights once at "
                          f"{hw.bandwidth / 1e12:g} TB/s; the slower of the two"},
        "what_to_change": [],
        "notes": ["prompt_length is an estimate (pass --prompt-length); completions run to L tokens (no early stop)",
                  "DiSPO's step term is its worst case: every branched state kept (B*G*Z rows; a run keeps only "
                  "states whose Z rewards differ)",
                  "other data-dependent work (RLDF/DTCA's filters, the threshold schedule's steps, DiSPO's extra "
                  "exact-logit forwards under a key/value cache) is that of the stand-in with random rewards"],
    }
    if search and not fits:
        plan["what_to_change"] = _search(cfg, hw, prompt_length, seed, cache, plan, shape)
    return plan


def _brief(p: dict, change: str) -> dict:
    return {"change": change, "peak_gib": round(p["memory_gib"]["peak"], 2), "fits": p["memory_gib"]["fits"],
            "seconds_per_step": round(p["time"]["seconds_per_step"], 2),
            "hours_per_run": round(p["time"]["hours_per_run"], 2)}


def _search(cfg, hw: Hardware, prompt_length: int, seed: int, cache: dict, base: dict,
            shape: ModelShape | None = None) -> list[dict]:
    """Changes that make the recipe fit, each with its new numbers (smallest row budget / micro-batch
    first, then checkpointing, LoRA, more processes)."""
    out = []
    n_seq = cfg.train.prompts_per_step * cfg.train.group_size
    theta_rows = max((v["rows"] // max(1, v["forwards"]) for k, v in base["work"]["by_phase_term"].items()
                      if k.startswith("theta/")), default=1)
    for mb in sorted({max(1, n_seq // d) for d in (2, 3, 4, 6, 8, 12, 16, 24, 48)} | {1}, reverse=True):
        if cfg.train.micro_batch_size and mb >= cfg.train.micro_batch_size:
            continue
        p = make_plan(cfg, hw, prompt_length, seed, False, micro_batch_size=mb, shape=shape, _cache=cache)
        if p["memory_gib"]["fits"]:
            out.append(_brief(p, f"--set train.micro_batch_size={mb}"))
            break
    budget = theta_rows
    while budget > 1:
        budget = max(1, budget // 2)
        p = make_plan(cfg, hw, prompt_length, seed, False, max_forward_rows=budget, shape=shape, _cache=cache)
        if p["memory_gib"]["fits"]:
            out.append(_brief(p, f"--set train.max_forward_rows={budget}"))
            break
    variants = []
    if not cfg.model.gradient_checkpointing:
        variants.append(("--set model.gradient_checkpointing=true",
                         lambda c: setattr(c, "model", dataclasses.replace(c.model, gradient_checkpointing=True))))
    if cfg.model.lora_rank == 0:
        variants.append(("--set model.lora_rank=128 --set model.dtype=bfloat16",
                         lambda c: setattr(c, "model", dataclasses.replace(c.model, lora_rank=128, lora_alpha=64.0,
                                                                           dtype="bfloat16"))))
    for text, edit in variants:
        c = copy.deepcopy(cfg)
        edit(c)
        p = make_plan(c, hw, prompt_length, seed, False, shape=shape, _cache=cache)
        out.append(_brief(p, text))
    for n in (2, 4, 8):
        if n > hw.gpus:
            h2 = dataclasses.replace(hw, gpus=n, strategy="fsdp")
            p = make_plan(cfg, h2, prompt_length, seed, False, shape=shape, _cache=cache)
            out.append(_brief(p, f"{n} GPUs with FSDP (configs/accelerate/fsdp.yaml)"))
            if p["memory_gib"]["fits"]:
                break
    return out


def format_plan(p: dict) -> str:
    """A short text report of :func:`make_plan`'s dict."""
    m, t, w = p["memory_gib"], p["time"], p["work"]
    hw = p["hardware"]
    n = p['model']['params']
    lines = [f"model: {p['model']['family']} {n / 1e9:.2f} B params ({p['model']['dtype']}), " if n >= 1e9 else
             f"model: {p['model']['family']} {n / 1e6:.2f} M params ({p['model']['dtype']}), "
             f"trainable {p['model']['trainable'] / 1e6:.1f} M, LoRA {p['model']['lora']['rank'] if p['model']['lora'] else 'off'}, "
             f"checkpointing {'on' if p['model']['gradient_checkpointing'] else 'off'}",
             f"hardware: {hw['gpus']} x {hw['gpu_memory']:.3g} GiB, {hw['strategy']}, {hw['tflops']:g} TFLOP/s x MFU {hw['mfu']:g}",
             "memory per process (GiB):"]
    lines += [f"  {k:16s} {v:8.2f}" for k, v in m["static"].items()]
    if m["kv_cache"]:
        lines.append(f"  {'kv_cache':16s} {m['kv_cache']:8.2f}")
    lines += [f"  peak {k:11s} {v:8.2f}  (activations {m['activations'][k]:.2f})" for k, v in m["peak_by_phase"].items()]
    lines.append(f"  PEAK {m['peak']:.2f} GiB of {m['gpu_memory']:.3g}: {'fits' if m['fits'] else 'DOES NOT FIT'}")
    lines.append("work per RL step and process:")
    for k, v in w["by_phase_term"].items():
        lines.append(f"  {k:22s} forwards {v['forwards']:6d}  rows {v['rows']:8d}  scored {v['scored_positions']:9d}  "
                     f"{v['flops'] / 1e12:11.4g} TFLOP  {t['seconds_by_phase_term'][k]:9.3g} s")
    lines.append(f"  total {w['flops'] / 1e12:.4g} TFLOP; {t['seconds_per_step']:.3g} s per step "
                 f"(compute {t['compute_seconds_per_step']:.3g} s, weight reads {t['weight_read_seconds_per_step']:.3g} s); "
                 f"{t['hours_per_run']:.3g} h for {p['recipe']['steps']} steps")
    if p["what_to_change"]:
        lines.append("what to change:")
        lines += [f"  {c['change']}: peak {c['peak_gib']} GiB ({'fits' if c['fits'] else 'does not fit'}), "
                  f"{c['seconds_per_step']} s/step, {c['hours_per_run']} h" for c in p["what_to_change"]]
    return "\n".join(lines)
