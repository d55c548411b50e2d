"""What a plan is for: the model's shape (published configs of the 8B checkpoints, a local
``config.json`` or the built-in tiny model) and the hardware (GPUs, memory, throughput, sharding)."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30

#: published shapes (config.json) of the checkpoints the 8B recipes name, so that planning needs no
#: download. LLaDA: GSAI-ML/LLaDA-8B-Instruct config.json (d_model 4096, n_layers 32, n_heads 32,
#: n_kv_heads 32, mlp_hidden_size 12288, embedding_size 126464, no biases, untied). Dream:
#: Dream-org/Dream-v0-Instruct-7B config.json (Qwen2-7B shape: hidden_size 3584, num_hidden_layers 28,
#: num_attention_heads 28, num_key_value_heads 4, intermediate_size 18944, vocab_size 152064, q/k/v
#: biases, untied). SDAR / TraDo (JetAstra/SDAR ``training/model/SDAR-{4B,8B}-Chat/config.json``, commit
#: c2041a8; TraDo-4B/8B are SDAR-4B/8B trained further, same config): Qwen3 shapes, head_dim 128 (so
#: heads × head_dim is not the width at 4B), 8 key/value heads, vocab 151936, untied, RoPE θ 1e6, block 4.
_LLADA = dict(family="llada", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=32,
              intermediate_size=12288, vocab_size=126464, tie=False, rope_theta=500000.0)
_DREAM = dict(family="dream", hidden_size=3584, num_layers=28, num_heads=28, num_kv_heads=4,
              intermediate_size=18944, vocab_size=152064, tie=False, rope_theta=1e6)
_SDAR_8B = dict(family="sdar", hidden_size=4096, num_layers=36, num_heads=32, num_kv_heads=8,
                intermediate_size=12288, vocab_size=151936, tie=False, head_dim=128, block_size=4, rope_theta=1e6)
_SDAR_4B = dict(_SDAR_8B, hidden_size=2560, intermediate_size=9728)
#: LLaDA2.0-mini / 2.1-mini (inclusionAI; dFactory ``configs/model_configs/llada2_mini/config.json``, commit
#: 92b6890): BailingMoeV2, 20 layers (the first dense, intermediate 5120), hidden 2048, 16 / 4 heads of 128,
#: 256 routed experts of width 512, 8 active + 1 shared, grouped top-k 8 / 4, vocab 157184, untied, RoPE θ
#: 600000, no attention output bias; block 32 (``generate()``'s default)
_LLADA2_MINI = dict(family="llada2", hidden_size=2048, num_layers=20, num_heads=16, num_kv_heads=4,
                    intermediate_size=5120, vocab_size=157184, tie=False, head_dim=128, block_size=32,
                    rope_theta=600000.0, num_experts=256, num_experts_per_tok=8, num_shared_experts=1,
                    moe_intermediate_size=512, first_dense_layers=1, n_group=8, topk_group=4)
KNOWN_MODELS: dict[str, dict] = {
    "GSAI-ML/LLaDA-8B-Instruct": _LLADA, "GSAI-ML/LLaDA-8B-Base": _LLADA,
    "Dream-org/Dream-v0-Instruct-7B": _DREAM, "Dream-org/Dream-v0-Base-7B": _DREAM,
    "JetLM/SDAR-8B-Chat": _SDAR_8B, "Gen-Verse/TraDo-8B-Instruct": _SDAR_8B, "Gen-Verse/TraDo-8B-Thinking": _SDAR_8B,
    "JetLM/SDAR-4B-Chat": _SDAR_4B, "Gen-Verse/TraDo-4B-Instruct": _SDAR_4B,
    "inclusionAI/LLaDA2.0-mini": _LLADA2_MINI, "inclusionAI/LLaDA2.1-mini": _LLADA2_MINI,
}
STRATEGIES = ("single", "ddp", "fsdp", "zero2", "zero3")


class PlanError(ValueError):
    """A plan cannot be made (unknown model shape, bad option); the message names the option."""


@dataclass(frozen=True)
class ModelShape:
    """Architecture of a model family member (docs/spec.md §1.1).

    Attributes:
        family: a registered family's name (:data:`maskrl.models.families.FAMILIES`: ``llada``, ``dream``,
            ``sdar``, ``fast_dllm``, ...) or ``tiny`` (the built-in Llama); the family gives the transformers
            class (its ``model_class``) and the logit shift (:attr:`shift`).
        hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size, vocab_size: the shape.
        tie: output layer tied to the embedding.
        source: where the numbers come from.
        head_dim: size of one attention head when the config states it (Qwen3: 128, whatever the width);
            ``None``: ``hidden_size // num_heads``.
        block_size: tokens per block of a block-diffusion model (the family's reading of its config),
            ``None`` for full attention.
        rope_theta: RoPE base (``None``: the transformers class's default).
        num_experts, num_experts_per_tok, num_shared_experts, moe_intermediate_size: a Mixture-of-Experts
            model's routed experts per MoE layer, experts a token runs through (k), shared experts and one
            expert's width (``None`` / 0: dense).
        first_dense_layers: leading dense decoder layers of an MoE model (``first_k_dense_replace``).
        n_group, topk_group: the router's grouped top-k.
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
    head_dim: int | None = None
    block_size: int | None = None
    rope_theta: float | None = None
    num_experts: int | None = None
    num_experts_per_tok: int = 0
    num_shared_experts: int = 0
    moe_intermediate_size: int | None = None
    first_dense_layers: int = 0
    n_group: int | None = None
    topk_group: int | None = None

    @property
    def head_size(self) -> int:
        """Size of one attention head (:attr:`head_dim`, else ``hidden_size // num_heads``)."""
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def shift(self) -> bool:
        """The family's logit shift (``logits[i]`` predicts token ``i + 1``: Dream, Fast-dLLM v2)."""
        return bool(getattr(_family(self.family), "shift", False))

    def hf_config(self, hidden_size: int | None = None, num_layers: int | None = None):
        """A transformers config of this shape in the family's class (optionally narrowed: ``hidden_size``
        with the same head count, head size and intermediate size scaled by the same factor, so every
        width-proportional dimension shrinks alike).

        Raises:
            PlanError: a narrowed width that gives a fractional head size or MLP width.
        """
        import transformers

        h = hidden_size or self.hidden_size
        inter = self.intermediate_size * h // self.hidden_size
        kw = dict(vocab_size=self.vocab_size, hidden_size=h, intermediate_size=inter,
                  num_hidden_layers=num_layers or self.num_layers, num_attention_heads=self.num_heads,
                  num_key_value_heads=self.num_kv_heads, tie_word_embeddings=self.tie, max_position_embeddings=8192,
                  rms_norm_eps=1e-5, pad_token_id=None)
        if self.head_dim is not None:
            if (self.head_dim * h) % self.hidden_size:
                raise PlanError(f"model width {h}: head_dim {self.head_dim} x {h} / {self.hidden_size} is not an integer")
            kw["head_dim"] = self.head_dim * h // self.hidden_size
        if self.num_experts:
            from maskrl.plan.moe import llada2_config

            if self.family != "llada2":
                raise PlanError(f"model family {self.family!r}: maskrl plan counts the llada2 MoE family only")
            if (self.moe_intermediate_size * h) % self.hidden_size:
                raise PlanError(f"model width {h}: moe_intermediate_size x {h} / {self.hidden_size} is not an integer")
            return llada2_config(self, h, kw["num_hidden_layers"], kw.get("head_dim", h // self.num_heads), inter)
        cls_name = getattr(_family(self.family), "model_class", "") or "LlamaForCausalLM"
        config_cls = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))
        extra = {"attention_bias": False, "mlp_bias": False} if cls_name == "LlamaForCausalLM" else {}
        theta = self.rope_theta or (500000.0 if cls_name == "LlamaForCausalLM" else 1e6)
        return config_cls(**kw, **extra, rope_theta=theta)


def _family(name: str):
    """The registered family class of ``name`` (``None`` for ``tiny`` or an unregistered name)."""
    from maskrl.models.families import FAMILIES

    return FAMILIES.get(name) if name in FAMILIES else None


def model_shape(cfg) -> ModelShape:
    """The shape of ``cfg.model``: a known Hub id (:data:`KNOWN_MODELS`), a local folder's ``config.json``
    (read by the family that claims it, :func:`maskrl.models.families.detect`: LLaDA's OLMo keys or
    the standard ones, the family's block size), or the built-in tiny model (``model.path`` empty,
    ``model.tiny.block_size`` its block size).

    Raises:
        PlanError: a path that is neither known nor a folder with a readable config.json, or a
            config.json no registered family claims, or a Mixture-of-Experts config (``num_experts``) of a
            family other than ``llada2_moe`` (the MoE family the planner counts).
    """
    path = cfg.model.path
    if not path:
        from maskrl.policy import tiny_tokenizer
        from maskrl.models.tokenizer import build_char_tokenizer

        t = cfg.model.tiny
        tok = tiny_tokenizer(t.tokenizer) or build_char_tokenizer()
        return ModelShape("tiny", t.hidden_size, t.num_layers, t.num_heads, t.num_heads, t.intermediate_size, len(tok),
                          source="model.tiny", block_size=t.block_size)
    if path in KNOWN_MODELS:
        return ModelShape(**KNOWN_MODELS[path], source=f"{path} config.json (published values, maskrl.plan.KNOWN_MODELS)")
    f = Path(path) / "config.json"
    if not f.is_file():
        raise PlanError(f"model.path: {path!r} is neither a known Hub id ({', '.join(KNOWN_MODELS)}) nor a folder "
                        "with a config.json; download the config or pass a local folder")
    c = json.loads(f.read_text())
    if c.get("num_experts") and c.get("model_type") != "llada2_moe":  # a dense estimate would be wrong, not rough
        raise PlanError(f"model.path: {path!r} is a Mixture-of-Experts checkpoint (model_type "
                        f"{c.get('model_type')!r}, {c['num_experts']} experts); maskrl plan counts the llada2_moe "
                        "MoE family only")
    shape = _folder_shape(c, str(f))
    if c.get("num_experts"):
        shape = dataclasses.replace(
            shape, num_experts=c["num_experts"], num_experts_per_tok=c.get("num_experts_per_tok", 2),
            num_shared_experts=c.get("num_shared_experts") or 0, moe_intermediate_size=c.get("moe_intermediate_size"),
            first_dense_layers=c.get("first_k_dense_replace", 0), n_group=c.get("n_group", 8),
            topk_group=c.get("topk_group", 4))
    return shape


def _folder_shape(c: dict, source: str) -> ModelShape:
    """The shape of a ``config.json`` dict, read by the family that claims it."""
    from maskrl.models.families import detect

    try:
        fam = detect(c, Path(source).parent)
    except ValueError as e:
        raise PlanError(f"model.path: {e}") from None
    if "d_model" in c:  # LLaDA's OLMo-style keys
        return ModelShape(fam.name, c["d_model"], c["n_layers"], c["n_heads"], c.get("n_kv_heads") or c["n_heads"],
                          c["mlp_hidden_size"], c.get("embedding_size") or c["vocab_size"], bool(c.get("weight_tying")),
                          source=source, rope_theta=c.get("rope_theta"))
    from maskrl.models.families import declared_block_size

    block = declared_block_size(c)
    return ModelShape(fam.name, c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
                      c.get("num_key_value_heads") or c["num_attention_heads"], c["intermediate_size"], c["vocab_size"],
                      bool(c.get("tie_word_embeddings")), source=source, head_dim=c.get("head_dim"),
                      block_size=block, rope_theta=c.get("rope_theta"))


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
    if not math.isfinite(v) or v <= 0:
        raise PlanError(f"--gpu-memory: must be a finite number > 0, got {text!r}")
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

    from maskrl.yamlfile import load_yaml

    from maskrl.files import not_utf8

    try:
        c = load_yaml(Path(path).read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise PlanError(f"--accelerate-config: cannot read {not_utf8(path, e)}") from None
    except (OSError, yaml.YAMLError) as e:
        raise PlanError(f"--accelerate-config: cannot read {path} ({' '.join(str(e).split())})") from None
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
        for flag, value in (("--gpu-memory", self.gpu_memory), ("--tflops", self.tflops), ("--bandwidth", self.bandwidth)):
            if not math.isfinite(value) or value <= 0:  # NaN passes `<= 0`; inf plans 0 s of compute
                raise PlanError(f"{flag}: must be a finite number > 0, got {value}")
        if self.strategy not in STRATEGIES:
            raise PlanError(f"strategy: unknown {self.strategy!r}; valid: {', '.join(STRATEGIES)}")
