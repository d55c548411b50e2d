"""Load published masked-diffusion checkpoints into native transformers classes, without remote code.

``load(path_or_id)`` reads ``config.json``, decides the model family and returns a
:class:`~maskrl.models.adapter.ModelAdapter` (SPEC §1.1). No ``trust_remote_code`` anywhere: the
published checkpoints' own modelling files are never imported or executed.

Families and what is converted
------------------------------
``llada`` (``model_type: "llada"``, e.g. ``GSAI-ML/LLaDA-8B-Instruct``; remote class ``LLaDAModelLM``)
    OLMo-style config keys are converted to a :class:`~transformers.LlamaConfig` and the weights are
    renamed into :class:`~transformers.LlamaForCausalLM`, which the adapter runs with an all-attend 4-D
    mask (no causal mask) and no logit shift. Facts relied on (published ``config.json`` and
    ``modeling_llada.py`` of LLaDA-8B-Instruct, read from public mirrors):

    * config keys ``d_model`` 4096, ``n_heads`` 32, ``n_kv_heads`` 32, ``n_layers`` 32,
      ``mlp_hidden_size`` 12288, ``vocab_size`` = ``embedding_size`` 126464, ``rope_theta`` 500000,
      ``rms_norm_eps`` 1e-5, ``max_sequence_length`` 4096, ``activation_type: "silu"``,
      ``block_type: "llama"``, ``layer_norm_type: "rms"``, ``weight_tying: false``,
      ``include_bias: false``, ``include_qkv_bias: false``, ``attention_layer_norm: false``,
      ``alibi: false``, ``rope: true``, ``input_emb_norm: false``, ``scale_logits: false``,
      ``mask_token_id`` 126336, ``eos_token_id`` = ``pad_token_id`` 126081;
    * the Llama block computes ``ff_out(act(ff_proj(x)) * up_proj(x))``: **ff_proj is the gate**
      (SiLU applied), ``up_proj`` the up projection, the block's ``ff_out`` the down projection;
    * RMSNorm ``w * x / sqrt(mean(x²) + eps)`` (no bias), RoPE with the rotate-half convention
      (``cat(-x2, x1)`` over the two halves of the head dim, frequencies ``θ^(-2i/d)`` duplicated),
      computed in float32 (``rope_full_precision``), attention scale ``1/sqrt(head_dim)``;
    * the model-level ``model.transformer.ff_out`` is the (untied) output projection.

    Weight names::

        model.transformer.wte.weight                    -> model.embed_tokens.weight
        model.transformer.blocks.{i}.q_proj.weight      -> model.layers.{i}.self_attn.q_proj.weight
        model.transformer.blocks.{i}.k_proj.weight      -> model.layers.{i}.self_attn.k_proj.weight
        model.transformer.blocks.{i}.v_proj.weight      -> model.layers.{i}.self_attn.v_proj.weight
        model.transformer.blocks.{i}.attn_out.weight    -> model.layers.{i}.self_attn.o_proj.weight
        model.transformer.blocks.{i}.ff_proj.weight     -> model.layers.{i}.mlp.gate_proj.weight
        model.transformer.blocks.{i}.up_proj.weight     -> model.layers.{i}.mlp.up_proj.weight
        model.transformer.blocks.{i}.ff_out.weight      -> model.layers.{i}.mlp.down_proj.weight
        model.transformer.blocks.{i}.attn_norm.weight   -> model.layers.{i}.input_layernorm.weight
        model.transformer.blocks.{i}.ff_norm.weight     -> model.layers.{i}.post_attention_layernorm.weight
        model.transformer.ln_f.weight                   -> model.norm.weight
        model.transformer.ff_out.weight                 -> lm_head.weight

    Refused (``NotImplementedError`` naming the key): any config value above that the Llama class
    cannot express (biases, QK-norm, ALiBi, non-SiLU / non-Llama blocks, ...). ``weight_tying: true``
    becomes ``tie_word_embeddings=True``: the output layer is the embedding and no ``ff_out`` is read.

Tied output layers (every family): a config with ``tie_word_embeddings: true`` (LLaDA:
``weight_tying: true``) needs no ``lm_head.weight`` in the checkpoint; the output layer is tied to the
embedding with ``PreTrainedModel.tie_weights()``, as ``from_pretrained`` does (a stored copy is not
read, also as in transformers). ``masked_lm`` and maskrl folders load through ``from_pretrained``,
which ties them itself.

``dream`` (``model_type: "Dream"``, e.g. ``Dream-org/Dream-v0-Instruct-7B``)
    Qwen2 config keys and Qwen2 weight names (q/k/v with bias, o_proj without), loaded into
    :class:`~transformers.Qwen2ForCausalLM` with the 4-D all-attend mask; logits are shifted by one
    (``logits[i]`` predicts token ``i+1``), which the adapter re-aligns. A ``rope_scaling`` of ``None``
    or of type ``"default"`` (a form transformers 5 no longer accepts from remote code) becomes
    ``rope_parameters = {"rope_type": "default", "rope_theta": θ}``; other scalings are refused.

``tiny`` (a folder written by :func:`maskrl.models.save_model`; ``maskrl_family`` key, and
    ``model_type: "maskrl_tiny"`` so that no plain transformers load passes silently)
    Loaded with :func:`maskrl.models.load_tiny`. LLaDA / Dream exports of :func:`~maskrl.models.save_model`
    are in their family's own layout and load as ``llada`` / ``dream`` (their ``maskrl_stop_ids`` kept).

``masked_lm`` (``architectures`` ending in ``ForMaskedLM``, a ``model_type`` transformers knows)
    Loaded with ``AutoModelForMaskedLM.from_pretrained`` (no remote code) and run with a 2-D mask.
    Missing tensors are refused; tensors transformers drops for that class (e.g. BERT's pooler and
    next-sentence head) are ignored. Needs a mask token (config ``mask_token_id`` or the tokenizer's).

Weights are read only from safetensors: a sharded folder with ``model.safetensors.index.json`` or a
single ``model.safetensors``, streamed tensor by tensor with ``safetensors.safe_open`` into a model
built without allocating its parameters (``accelerate.init_empty_weights``), then attached with
``load_state_dict(strict=True, assign=True)``; peak memory is about one copy of the weights.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from maskrl.models.dtypes import DTYPE_NAMES, parse_dtype  # noqa: F401  (public here too)
from maskrl.models.adapter import ModelAdapter
from maskrl.models.names import NAME_MAPS, llada_to_checkpoint, llada_to_native  # noqa: F401  (public here too)

# _NO_PADDING_IDX: the native configs get ``pad_token_id=None``. Llama/Qwen2 build their embedding
# with ``padding_idx=config.pad_token_id``, which zeroes that row's gradient; LLaDA and Dream pad
# with their eos id, so the eos embedding would silently stop training. The pad id lives on the
# adapter instead (``ModelAdapter.pad_id``).

# Family defaults (SPEC §1.1); config values win when present.
LLADA_MASK_ID, LLADA_EOS_ID, LLADA_EOT_ID = 126336, 126081, 126348
DREAM_MASK_ID, DREAM_EOS_ID = 151666, 151643

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]  # never *.py
_MAX_LISTED = 20


# ----------------------------------------------------------------------------------------------
# public entry point
# ----------------------------------------------------------------------------------------------
def load(path_or_id: str | os.PathLike, dtype: torch.dtype | str = torch.float32,
         device: str | torch.device | None = None, *, tokenizer: Any = None, revision: str | None = None,
         mask_id: int | None = None, eos_id: int | None = None, pad_id: int | None = None,
         stop_ids: Iterable[int] | None = None) -> ModelAdapter:
    """Load a LLaDA, Dream, maskrl tiny or ``*ForMaskedLM`` checkpoint as a :class:`ModelAdapter`.

    The returned adapter's ``logits(input_ids [N, T], attention_mask [N, T]) -> [N, T, V]`` is
    position-aligned for every family (SPEC §1.1). The model is returned in ``eval()`` mode.

    Args:
        path_or_id: a local folder (``config.json`` + safetensors weights, tokenizer files optional)
            or a Hugging Face Hub id, resolved with ``huggingface_hub.snapshot_download`` (only
            ``*.json``, ``*.safetensors`` and tokenizer files are fetched, never ``*.py``).
        dtype: parameter dtype (``torch.float32`` default, ``torch.bfloat16`` for 7-8B models; a
            string such as ``"bfloat16"`` is accepted). Checkpoint tensors are cast to it -- except
            in a LoRA export of :func:`maskrl.models.save_model` (float32 merged weights and the
            adapter in ``adapter/``), which in any other dtype is loaded as its training policy:
            base weights in ``dtype`` plus the float32 adapter
            (:func:`maskrl.models.export.base_plus_adapter`; ``model`` is then a ``peft.PeftModel``).
        device: where the weights are read to (``None``: CPU).
        tokenizer: ``None`` loads the folder's tokenizer when tokenizer files exist
            (``AutoTokenizer``, ``trust_remote_code=False``; falls back to the plain fast tokenizer
            from ``tokenizer.json``, or for Dream to ``Qwen2Tokenizer`` from ``vocab.json`` +
            ``merges.txt``); ``False`` skips it; any other value is used as the tokenizer.
        revision: Hub revision for ``path_or_id`` ids.
        mask_id, eos_id, pad_id, stop_ids: override the ids otherwise taken from ``config.json``,
            then from the family defaults (LLaDA: mask 126336, eos/pad 126081, stop 126348;
            Dream: mask 151666, eos/pad 151643). Every id of a list-valued ``eos_token_id`` (in
            ``config.json`` or ``generation_config.json``, :func:`end_ids`) ends a completion: the
            first is ``eos_id``, the others join ``stop_ids``. A tokenizer without a pad token is
            given the model's pad id (``config.json``'s ``pad_token_id``, else its eos id).

    Returns:
        A :class:`ModelAdapter` with ``family`` in ``{"llada", "dream", "tiny", "masked_lm"}``.

    Raises:
        FileNotFoundError: no folder at the path and it is not a Hub id, or no ``config.json`` /
            safetensors weights in the folder.
        OSError: the Hub download failed (e.g. offline); the message says how to pass a folder.
        ValueError: unknown family, a checkpoint with missing or unexpected tensors (named), a
            tensor of the wrong shape (named), no mask token for a masked LM, or special ids that
            collide (named; :class:`ModelAdapter`, :meth:`~ModelAdapter.check_special_ids`).
        NotImplementedError: a config value the native class cannot express (the key is named).
    """
    dtype = parse_dtype(dtype)
    folder = resolve(path_or_id, revision=revision)
    cfg = read_config(folder)
    lora = cfg.get("maskrl_lora")  # a LoRA export (maskrl.models.export): float32 merged weights + adapter/
    if isinstance(lora, dict) and lora.get("merged_dtype") == "float32" and dtype != torch.float32:
        from maskrl.models.export import base_plus_adapter

        merged = load(folder, torch.float32, "cpu", tokenizer=tokenizer, mask_id=mask_id, eos_id=eos_id,
                      pad_id=pad_id, stop_ids=stop_ids)
        return base_plus_adapter(merged, folder / str(lora.get("adapter", "adapter")), dtype, device)
    family = detect_family(cfg, folder)
    if tokenizer is None and family != "tiny":  # load_tiny reads its own tokenizer
        tokenizer = _load_tokenizer(folder, family)
    tok = None if tokenizer is False else tokenizer

    fields = _adapter_fields(family, cfg, folder, tokenizer, tok, dtype, device)
    overrides = dict(mask_id=mask_id, eos_id=eos_id, pad_id=pad_id,
                     stop_ids=None if stop_ids is None else tuple(int(s) for s in stop_ids))
    fields.update({name: value for name, value in overrides.items() if value is not None})
    for name in ("mask_id", "eos_id", "pad_id"):
        if fields.get(name) is None:
            raise ValueError(f"load({str(path_or_id)!r}): no {name} in config.json or tokenizer; pass {name}=...")
    return ModelAdapter(**fields)  # checks the special ids (ModelAdapter.check_special_ids)


def _adapter_fields(family: str, cfg: dict, folder: Path, tokenizer: Any, tok: Any, dtype: torch.dtype, device) -> dict:
    """The model and :class:`ModelAdapter` fields of a checkpoint (ids: config.json, then family defaults)."""
    if family == "tiny":
        from maskrl.models.tiny import load_tiny

        tiny = load_tiny(folder, dtype=dtype)
        tiny.model.to(device or "cpu").eval()
        fields = dict(vars(tiny))  # the dataclass's fields
        if tokenizer is not None:  # an explicit tokenizer, or False for none
            fields["tokenizer"] = tok
        return fields
    if family in ("llada", "dream"):
        return _native_fields(family, cfg, folder, tok, dtype, device)
    return _masked_lm_fields(cfg, folder, tok, dtype, device)


def _native_fields(family: str, cfg: dict, folder: Path, tok: Any, dtype: torch.dtype, device) -> dict:
    """A LLaDA or Dream checkpoint in its native transformers class, with the family's ids."""
    if family == "llada":
        config = llada_config(cfg)
        mask, eos, stops = LLADA_MASK_ID, LLADA_EOS_ID, (LLADA_EOT_ID,)
    else:
        config = dream_config(cfg)
        mask, eos, stops = DREAM_MASK_ID, DREAM_EOS_ID, ()
    to_native, to_checkpoint = NAME_MAPS[family]
    model = _build_and_load(config, folder, to_native, to_checkpoint, dtype, device)
    ends = end_ids(cfg, folder)
    cfg_eos = ends[0] if ends else None
    end = _first(cfg_eos, eos)
    fields = dict(model=model, mask_id=_first(cfg.get("mask_token_id"), mask), eos_id=end,
                  pad_id=_first(cfg.get("pad_token_id"), cfg_eos, eos), shift=(family == "dream"), family=family,
                  attention="4d", tokenizer=tok, stop_ids=_stops(stops + ends, end))
    if cfg.get("maskrl_stop_ids") is not None:  # a maskrl export (maskrl.models.export) keeps its stop ids
        fields["stop_ids"] = _stops(tuple(cfg["maskrl_stop_ids"]) + ends, end)
    return fields


def _masked_lm_fields(cfg: dict, folder: Path, tok: Any, dtype: torch.dtype, device) -> dict:
    """A ``*ForMaskedLM`` checkpoint (2-D attention mask, no shift) with its config's or tokenizer's ids."""
    model = _load_masked_lm(folder, dtype, device)
    c = model.config
    ends = end_ids(cfg, folder)
    end = _first(ends[0] if ends else None, getattr(c, "sep_token_id", None),
                 getattr(tok, "eos_token_id", None), getattr(tok, "sep_token_id", None))
    return dict(model=model, shift=False, family="masked_lm", attention="2d", tokenizer=tok,
                mask_id=_first(getattr(c, "mask_token_id", None), getattr(tok, "mask_token_id", None)),
                eos_id=end, pad_id=_first(getattr(c, "pad_token_id", None), getattr(tok, "pad_token_id", None)),
                stop_ids=_stops(ends, end))


# ----------------------------------------------------------------------------------------------
# folders, configs, families
# ----------------------------------------------------------------------------------------------
def looks_like_path(text: str) -> bool:
    """Whether a model argument is meant as a local path rather than a Hub id (``owner/name``): it
    starts with ``.``, ``/`` or ``~``, holds a backslash or more than one ``/``, or its first part is
    an existing local folder (``runs/does-not-exist`` while ``runs/`` exists)."""
    if text.startswith((".", "/", "~")) or "\\" in text or text.count("/") != 1:
        return True
    return Path(text.split("/", 1)[0]).is_dir()


def is_hub_id(text: str) -> bool:
    """Whether a model argument names a Hub repository: shaped ``owner/name`` (letters, digits, ``_``,
    ``.``, ``-``) and not meant as a local path (:func:`looks_like_path`)."""
    return bool(re.fullmatch(r"[\w.\-]+/[\w.\-]+", text)) and not looks_like_path(text)


def resolve(path_or_id: str | os.PathLike, revision: str | None = None) -> Path:
    """Local folder for ``path_or_id``: the folder itself, or a Hub snapshot download.

    Raises:
        FileNotFoundError: not a folder, and path-like (:func:`looks_like_path`) or not shaped like a
            Hub id (``owner/name``); the message names the nearest existing parent folder.
        OSError: the download failed (offline, unknown repo, gated model, ...); a one-line message.
    """
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        return path
    text = str(path_or_id)
    if path.exists():
        raise FileNotFoundError(f"model {text!r} is a file, not a model folder (config.json + safetensors weights)")
    if not is_hub_id(text):
        parent = path.absolute().parent
        while not parent.is_dir():
            parent = parent.parent
        raise FileNotFoundError(f"no model folder at {text!r} (nearest existing folder: {parent}); a Hub id "
                                "looks like 'owner/name', with no local folder named 'owner'")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=text, revision=revision, allow_patterns=_HUB_PATTERNS))
    except Exception as err:  # network errors, missing repo, gated repo, offline mode, ...
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise OSError(f"{text!r} is not a local folder and downloading it from the Hugging Face Hub failed "
                      f"({type(err).__name__}: {first}). Download it where the Hub is reachable, e.g. "
                      f"`hf download {text} --local-dir DIR`, and pass DIR.") from None


def read_config(folder: str | os.PathLike) -> dict:
    """The folder's ``config.json`` as a dict. Raises ``FileNotFoundError`` when absent."""
    file = Path(folder) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"no config.json in {str(folder)!r}")
    return json.loads(file.read_text())


def detect_family(cfg: dict, folder: str | os.PathLike | None = None) -> str:
    """``"tiny"`` | ``"llada"`` | ``"dream"`` | ``"masked_lm"`` from a ``config.json`` dict.

    Raises:
        ValueError: none of them (the message lists ``model_type`` and ``architectures``).
    """
    model_type = str(cfg.get("model_type", ""))
    archs = [str(a) for a in cfg.get("architectures") or []]
    if "maskrl_family" in cfg:
        return "tiny"
    if model_type.lower() == "llada" or "LLaDAModelLM" in archs:
        return "llada"
    if model_type.lower() == "dream" or any(a.startswith("Dream") for a in archs):
        return "dream"
    if any(a.endswith("ForMaskedLM") for a in archs):
        return "masked_lm"
    raise ValueError(f"cannot load {str(folder or '')!r}: model_type={model_type!r}, architectures={archs}; "
                     "supported: LLaDA (model_type 'llada'), Dream (model_type 'Dream'), maskrl tiny folders "
                     "('maskrl_family' key) and *ForMaskedLM models with a mask token")


def llada_config(cfg: dict):
    """:class:`~transformers.LlamaConfig` equivalent to a LLaDA (OLMo-style) ``config.json`` dict.

    Raises:
        NotImplementedError: a setting the Llama class cannot express, naming the key and value.
        ValueError: a required key (``d_model``, ``n_heads``, ``n_layers``, vocabulary size) is absent.
    """
    from transformers import LlamaConfig

    expected = {"block_type": "llama", "activation_type": "silu", "layer_norm_type": "rms", "rope": True,
                "alibi": False, "include_bias": False, "include_qkv_bias": False,
                "attention_layer_norm": False, "input_emb_norm": False, "scale_logits": False,
                "bias_for_layer_norm": False, "layer_norm_with_affine": True, "clip_qkv": None,
                "multi_query_attention": None}
    off = (False, None)  # a missing key, null and false all mean "feature off"
    bad = [f"{k}={cfg[k]!r} (supported: {v!r})" for k, v in expected.items()
           if k in cfg and cfg[k] != v and not (v in off and cfg[k] in off)]
    if bad:
        raise NotImplementedError("LLaDA config not expressible as a Llama model: " + ", ".join(bad))
    for key in ("d_model", "n_heads", "n_layers"):
        if key not in cfg:
            raise ValueError(f"LLaDA config.json lacks {key!r}")
    vocab = cfg.get("embedding_size") or cfg.get("vocab_size")
    if not vocab:
        raise ValueError("LLaDA config.json lacks 'embedding_size' / 'vocab_size'")
    d, heads = int(cfg["d_model"]), int(cfg["n_heads"])
    return LlamaConfig(
        vocab_size=int(vocab), hidden_size=d, num_hidden_layers=int(cfg["n_layers"]), num_attention_heads=heads,
        num_key_value_heads=int(cfg.get("n_kv_heads") or heads), head_dim=d // heads,
        intermediate_size=int(cfg.get("mlp_hidden_size") or cfg.get("mlp_ratio", 4) * d), hidden_act="silu",
        rms_norm_eps=float(cfg.get("rms_norm_eps", cfg.get("layer_norm_eps", 1e-5))),
        rope_parameters={"rope_type": "default", "rope_theta": float(cfg.get("rope_theta", 10000.0))},
        max_position_embeddings=int(cfg.get("max_sequence_length", 4096)), attention_bias=False, mlp_bias=False,
        attention_dropout=float(cfg.get("attention_dropout", 0.0)), use_cache=False,
        tie_word_embeddings=bool(cfg.get("weight_tying")),  # OLMo: logits = h @ wte.weight^T, no ff_out
        mask_token_id=cfg.get("mask_token_id", LLADA_MASK_ID), eos_token_id=cfg.get("eos_token_id", LLADA_EOS_ID),
        pad_token_id=None, bos_token_id=cfg.get("bos_token_id"),  # pad: see _NO_PADDING_IDX
    )


def dream_config(cfg: dict):
    """:class:`~transformers.Qwen2Config` equivalent to a Dream ``config.json`` dict.

    ``rope_scaling`` ``None`` or ``{"type"/"rope_type": "default"}`` maps to transformers 5's
    ``rope_parameters = {"rope_type": "default", "rope_theta": θ}``.

    Raises:
        NotImplementedError: a RoPE scaling other than default, sliding-window attention, or a
            non-SiLU activation (the key is named).
    """
    from transformers import Qwen2Config

    scaling = cfg.get("rope_scaling")
    rope_type = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if rope_type not in (None, "default"):
        raise NotImplementedError(f"Dream config rope_scaling={scaling!r}: only default RoPE is supported")
    if cfg.get("use_sliding_window"):
        raise NotImplementedError("Dream config use_sliding_window=True is not supported (full attention only)")
    if cfg.get("hidden_act", "silu") != "silu":
        raise NotImplementedError(f"Dream config hidden_act={cfg['hidden_act']!r}: only 'silu' is supported")
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
            "attention_dropout", "head_dim", "bos_token_id", "eos_token_id")  # no pad: see _NO_PADDING_IDX
    kwargs = {k: cfg[k] for k in keep if cfg.get(k) is not None}
    return Qwen2Config(**kwargs, hidden_act="silu", use_sliding_window=False, use_cache=False,
                       rope_parameters={"rope_type": "default", "rope_theta": float(cfg.get("rope_theta", 10000.0))},
                       mask_token_id=cfg.get("mask_token_id", DREAM_MASK_ID))


# ----------------------------------------------------------------------------------------------
# safetensors
# ----------------------------------------------------------------------------------------------
def checkpoint_files(folder: str | os.PathLike) -> dict[str, Path]:
    """Map each checkpoint tensor name to the safetensors file holding it.

    Uses ``model.safetensors.index.json`` (``weight_map``) when present, else ``model.safetensors``.

    Raises:
        FileNotFoundError: neither exists (``*.bin`` weights are not read), or a shard named in the
            index is absent.
    """
    folder = Path(folder)
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {name: folder / shard for name, shard in weight_map.items()}
        for shard in sorted(set(files.values())):
            if not shard.is_file():
                raise FileNotFoundError(f"shard {shard.name!r} named in {INDEX_FILE} is missing from {str(folder)!r}")
        return files
    single = folder / SINGLE_FILE
    if single.is_file():
        from safetensors import safe_open

        with safe_open(single, framework="pt") as f:
            return {name: single for name in f.keys()}
    raise FileNotFoundError(f"no {INDEX_FILE} or {SINGLE_FILE} in {str(folder)!r} (only safetensors weights are read)")


def _read_tensors(files: dict[str, Path], names: dict[str, str], dtype: torch.dtype,
                  device: str | torch.device | None) -> dict[str, torch.Tensor]:
    """Stream the tensors ``names`` (checkpoint name -> native name) shard by shard, cast to ``dtype``."""
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(files[name], []).append(name)
    out = {}
    for file, file_names in by_file.items():
        with safe_open(file, framework="pt", device=str(device or "cpu")) as f:
            present = set(f.keys())
            for name in file_names:
                if name not in present:
                    raise ValueError(f"tensor {name!r} is listed in {INDEX_FILE} but absent from {file.name!r}")
                out[names[name]] = f.get_tensor(name).to(dtype)
    return out


def _listing(names: Iterable[str]) -> str:
    names = sorted(names)
    more = f" ... and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else ""
    return ", ".join(names[:_MAX_LISTED]) + more


def _build_and_load(config, folder: Path, to_native: Callable[[str], str | None], to_checkpoint: Callable[[str], str],
                    dtype: torch.dtype, device) -> torch.nn.Module:
    """Build the native ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` for ``config`` without allocating weights, check the checkpoint's
    names and shapes against it, and attach the tensors (``load_state_dict(strict=True, assign=True)``)."""
    from accelerate import init_empty_weights
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2ForCausalLM

    config.dtype = dtype
    model_cls = LlamaForCausalLM if isinstance(config, LlamaConfig) else Qwen2ForCausalLM
    with init_empty_weights(include_buffers=False):  # parameters on "meta", RoPE buffers real
        model = model_cls(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    # tied output layer (config tie_word_embeddings / LLaDA weight_tying): transformers' state_dict lists
    # lm_head.weight although it *is* the embedding; the checkpoint need not hold it (small Qwen2
    # conversions do not) and, as in transformers, a stored copy is not used
    tied = _tied_keys(model)
    for k in tied:
        expected.pop(k, None)

    files = checkpoint_files(folder)
    native = {name: to_native(name) for name in files}
    files = {name: f for name, f in files.items() if native[name] not in tied}
    native = {name: n for name, n in native.items() if n not in tied}
    unexpected = [name for name, n in native.items() if n is None or n not in expected]
    missing = [k for k in expected if k not in set(native.values())]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensors: {_listing(to_checkpoint(k) for k in missing)}")
        if unexpected:
            parts.append(f"unexpected tensors: {_listing(unexpected)}")
        raise ValueError(f"checkpoint {str(folder)!r} does not match {type(model).__name__} "
                         f"({config.num_hidden_layers} layers): " + "; ".join(parts))

    state = _read_tensors(files, native, dtype, device)
    wrong = [f"{to_checkpoint(k)} {tuple(v.shape)} (expected {expected[k]})" for k, v in state.items()
             if tuple(v.shape) != expected[k]]
    if wrong:
        raise ValueError(f"checkpoint {str(folder)!r}: tensors of the wrong shape for the config: {_listing(wrong)}")
    result = model.load_state_dict(state, strict=False, assign=True)
    left = [k for k in result.missing_keys if k not in tied]
    if left or result.unexpected_keys:  # pragma: no cover - excluded by the name check above
        raise ValueError(f"checkpoint {str(folder)!r}: missing {left}, unexpected {result.unexpected_keys}")
    if tied:
        model.tie_weights()  # transformers' public API: lm_head.weight is embed_tokens.weight again
    return model.to(device or "cpu").eval()


def _tied_keys(model: torch.nn.Module) -> set[str]:
    """State-dict names that the model ties to the input embedding: ``{"lm_head.weight"}`` when its
    config says ``tie_word_embeddings`` (Llama / Qwen2 name the output layer ``lm_head``), else empty."""
    if not getattr(model.config, "tie_word_embeddings", False):
        return set()
    return {"lm_head.weight"} & set(model.state_dict())


def _load_masked_lm(folder: Path, dtype: torch.dtype, device) -> torch.nn.Module:
    from transformers import AutoModelForMaskedLM

    model, info = AutoModelForMaskedLM.from_pretrained(folder, dtype=dtype, trust_remote_code=False,
                                                       output_loading_info=True)
    if info.get("missing_keys"):
        raise ValueError(f"checkpoint {str(folder)!r} lacks tensors of {type(model).__name__}: "
                         f"{_listing(info['missing_keys'])}")
    if info.get("mismatched_keys"):
        raise ValueError(f"checkpoint {str(folder)!r}: tensors of the wrong shape: "
                         f"{_listing(str(k) for k in info['mismatched_keys'])}")
    return model.to(device or "cpu").eval()


# ----------------------------------------------------------------------------------------------
# tokenizer and ids
# ----------------------------------------------------------------------------------------------
def _load_tokenizer(folder: Path, family: str):
    """The folder's tokenizer, or ``None`` when it has no tokenizer files; never runs remote code.

    Raises:
        ValueError: tokenizer files exist but no loader without remote code can read them.
    """
    if not any((folder / f).is_file() for f in _TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except (ValueError, OSError, KeyError, TypeError) as err:
        first = err
    try:  # e.g. a custom tokenizer class in tokenizer_config.json's auto_map (Dream's DreamTokenizer)
        if (folder / "tokenizer.json").is_file():
            return PreTrainedTokenizerFast.from_pretrained(folder)
        if family == "dream" and (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
            from transformers import Qwen2Tokenizer  # Dream's tokenizer is Qwen2's byte-level BPE

            return Qwen2Tokenizer.from_pretrained(folder)
    except (ValueError, OSError, KeyError, TypeError) as err:
        raise ValueError(f"could not load the tokenizer in {str(folder)!r} without remote code ({err}); "
                         "pass tokenizer=<tokenizer> or tokenizer=False") from first
    raise ValueError(f"could not load the tokenizer in {str(folder)!r} without remote code ({first}); "
                     "pass tokenizer=<tokenizer> or tokenizer=False") from first


def _ids(value) -> tuple[int, ...]:
    """The ids of a config field that may be ``None``, an int or a list of ints."""
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value if v is not None)
    return (int(value),)


def end_ids(cfg: dict, folder: str | os.PathLike | None = None) -> tuple[int, ...]:
    """Every end-of-completion id a checkpoint declares, in order, without repeats: ``config.json``'s
    ``eos_token_id`` (an int or a list, as instruct checkpoints write ``[eos, end_of_turn]``), then
    those of ``generation_config.json`` when the folder has one. The first is the adapter's
    ``eos_id``; all of them end a completion (``ModelAdapter.stop_ids``, SPEC §1.1)."""
    ids = list(_ids(cfg.get("eos_token_id")))
    gen = Path(folder) / "generation_config.json" if folder is not None else None
    if gen is not None and gen.is_file():
        try:
            ids += _ids(json.loads(gen.read_text()).get("eos_token_id"))
        except (ValueError, TypeError, AttributeError) as e:
            raise ValueError(f"{gen}: eos_token_id is not an id or a list of ids ({e})") from None
    return tuple(dict.fromkeys(ids))


def _stops(ids: Iterable[int], eos_id: int | None) -> tuple[int, ...]:
    """``ids`` without repeats and without ``eos_id`` (which ends a completion anyway)."""
    return tuple(i for i in dict.fromkeys(int(i) for i in ids) if i != eos_id)


def _first(*values):
    for v in values:
        if v is not None:
            return int(v)
    return None
