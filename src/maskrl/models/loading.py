"""Load published masked-diffusion checkpoints into native transformers classes, without remote code.

``load(path_or_id)`` reads ``config.json``, decides the model family and returns a
:class:`~maskrl.models.adapter.ModelAdapter` (docs/spec.md §1.1). No ``trust_remote_code`` anywhere: the
published checkpoints' own modelling files are never imported or executed.

Families
--------
Each family is one module of :mod:`maskrl.models.families` (config mapping, tensor names, special ids,
attention kind and block size, logit shift, export layout), registered in
:data:`~maskrl.models.families.FAMILIES` and detected from ``config.json`` (:func:`detect_family`):
``llada`` (:mod:`~maskrl.models.families.llada`), ``dream`` (:mod:`~maskrl.models.families.dream`),
``sdar`` / ``sdar_moe`` (:mod:`~maskrl.models.families.sdar`), ``fast_dllm_v2``
(:mod:`~maskrl.models.families.fast_dllm`), ``tiny`` and ``masked_lm``
(:mod:`~maskrl.models.families.maskrl_layout`). A family registered from outside ``maskrl`` (a plug-in)
is detected the same way.

Tied output layers (every family): a config with ``tie_word_embeddings: true`` (LLaDA:
``weight_tying: true``) needs no ``lm_head.weight`` in the checkpoint; the output layer is tied to the
embedding with ``PreTrainedModel.tie_weights()``, as ``from_pretrained`` does (a stored copy is not
read, also as in transformers). ``masked_lm`` and maskrl folders load through ``from_pretrained``,
which ties them itself.

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
from typing import Any, Iterable

import torch

from maskrl.models.dtypes import DTYPE_NAMES, parse_dtype  # noqa: F401  (public here too)
from maskrl.models.adapter import ModelAdapter
from maskrl.models.names import llada_to_checkpoint, llada_to_native  # noqa: F401  (public here too)

# _NO_PADDING_IDX: the native configs get ``pad_token_id=None``. Llama/Qwen2/Qwen3 build their embedding
# with ``padding_idx=config.pad_token_id``, which zeroes that row's gradient; LLaDA, Dream and SDAR pad
# with an end id, so that embedding would silently stop training. The pad id lives on the adapter
# instead (``ModelAdapter.pad_id``).

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
    """Load a checkpoint of a registered family (LLaDA, Dream, SDAR / TraDo, Fast-dLLM v2, maskrl tiny,
    ``*ForMaskedLM``, or a plug-in's) as a :class:`ModelAdapter`.

    The returned adapter's ``logits(input_ids [N, T], attention_mask [N, T]) -> [N, T, V]`` is
    position-aligned for every family (docs/spec.md §1.1). The model is returned in ``eval()`` mode.

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
            from ``tokenizer.json``, or for the Qwen-based families (Dream, SDAR, Fast-dLLM v2) to
            ``Qwen2Tokenizer`` from ``vocab.json`` + ``merges.txt``); ``False`` skips it; any other value
            is used as the tokenizer.
        revision: Hub revision for ``path_or_id`` ids.
        mask_id, eos_id, pad_id, stop_ids: override the ids otherwise taken from ``config.json``,
            then from the family defaults (LLaDA: mask 126336, eos/pad 126081, stop 126348;
            Dream: mask 151666, eos/pad 151643; SDAR: mask 151669, eos 151643, stop 151645;
            Fast-dLLM v2: mask 151665, eos 151645, stop 151643). Every id of a list-valued ``eos_token_id`` (in
            ``config.json`` or ``generation_config.json``, :func:`end_ids`) ends a completion: the
            first is ``eos_id``, the others join ``stop_ids``. A tokenizer without a pad token is
            given the model's pad id (``config.json``'s ``pad_token_id``, else its eos id).

    Returns:
        A :class:`ModelAdapter` whose ``family`` is the family's name (``"llada"``, ``"dream"``,
        ``"sdar"``, ``"sdar_moe"``, ``"fast_dllm_v2"``, ``"tiny"``, ``"masked_lm"``, a plug-in's) and
        whose ``block_size`` is the checkpoint's for block-diffusion families (``None``: full attention).

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
    family = family_of(cfg, folder)()
    if not family.own_tokenizer:
        tokenizer = _load_tokenizer(folder, family) if tokenizer is None else tokenizer
        tokenizer = None if tokenizer is False else tokenizer
    fields = family.adapter_fields(cfg, folder, tokenizer, dtype, device)
    overrides = dict(mask_id=mask_id, eos_id=eos_id, pad_id=pad_id,
                     stop_ids=None if stop_ids is None else tuple(int(s) for s in stop_ids))
    fields.update({name: value for name, value in overrides.items() if value is not None})
    for name in ("mask_id", "eos_id", "pad_id"):
        if fields.get(name) is None:
            raise ValueError(f"load({str(path_or_id)!r}): no {name} in config.json or tokenizer; pass {name}=...")
    return ModelAdapter(**fields)  # checks the special ids (ModelAdapter.check_special_ids)


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


def family_of(cfg: dict, folder: str | os.PathLike | None = None) -> type:
    """The registered family class (:class:`maskrl.models.families.Family`) of a ``config.json`` dict
    (:func:`maskrl.models.families.detect`: marker key, then ``model_type``, then ``architectures``).

    Raises:
        ValueError: no registered family claims it (``model_type`` and ``architectures`` named).
    """
    from maskrl.models.families import detect

    return detect(cfg, folder)


def detect_family(cfg: dict, folder: str | os.PathLike | None = None) -> str:
    """The name of the family of a ``config.json`` dict (``"llada"``, ``"dream"``, ``"sdar"``, ...; :func:`family_of`).

    Raises:
        ValueError: none of them (the message lists ``model_type`` and ``architectures``).
    """
    return family_of(cfg, folder).name


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


def listing(names: Iterable[str]) -> str:
    names = sorted(names)
    more = f" ... and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else ""
    return ", ".join(names[:_MAX_LISTED]) + more


def build_and_load(config, model_cls: type, folder: Path, layout, dtype: torch.dtype, device) -> torch.nn.Module:
    """Build ``model_cls(config)`` (a transformers decoder class) without allocating weights, check the
    checkpoint's tensor names and shapes against it, and attach the tensors
    (``load_state_dict(strict=True, assign=True)``); returned in ``eval()`` mode on ``device``.

    ``layout`` (a :class:`~maskrl.models.families.NativeFamily`) names the tensors: ``to_native(name)``
    (checkpoint -> native name, ``None``: none), ``to_checkpoint(native)`` (for messages), and
    ``unfused(shapes)`` / ``fused(state)`` for native parameters stored as several checkpoint tensors
    (Qwen3-MoE's experts): the native names and shapes the checkpoint holds, and their assembly.

    Raises:
        ValueError: missing or unexpected tensors, or tensors of the wrong shape (named, in the
            checkpoint's names: ``to_checkpoint``).
    """
    from accelerate import init_empty_weights

    config.dtype = dtype
    with init_empty_weights(include_buffers=False):  # parameters on "meta", RoPE buffers real
        model = model_cls(config)
    to_native, to_checkpoint = layout.to_native, layout.to_checkpoint
    expected = layout.unfused({k: tuple(v.shape) for k, v in model.state_dict().items()})
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
            parts.append(f"missing tensors: {listing(to_checkpoint(k) for k in missing)}")
        if unexpected:
            parts.append(f"unexpected tensors: {listing(unexpected)}")
        raise ValueError(f"checkpoint {str(folder)!r} does not match {type(model).__name__} "
                         f"({config.num_hidden_layers} layers): " + "; ".join(parts))

    state = _read_tensors(files, native, dtype, device)
    wrong = [f"{to_checkpoint(k)} {tuple(v.shape)} (expected {expected[k]})" for k, v in state.items()
             if tuple(v.shape) != expected[k]]
    if wrong:
        raise ValueError(f"checkpoint {str(folder)!r}: tensors of the wrong shape for the config: {listing(wrong)}")
    result = model.load_state_dict(layout.fused(state), strict=False, assign=True)
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


# ----------------------------------------------------------------------------------------------
# tokenizer and ids
# ----------------------------------------------------------------------------------------------
def _load_tokenizer(folder: Path, family):
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
        if family.qwen_tokenizer and (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
            from transformers import Qwen2Tokenizer  # Qwen-based families: Qwen2's byte-level BPE

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
    ``eos_id``; all of them end a completion (``ModelAdapter.stop_ids``, docs/spec.md §1.1)."""
    ids = list(_ids(cfg.get("eos_token_id")))
    gen = Path(folder) / "generation_config.json" if folder is not None else None
    if gen is not None and gen.is_file():
        try:
            ids += _ids(json.loads(gen.read_text()).get("eos_token_id"))
        except (ValueError, TypeError, AttributeError) as e:
            raise ValueError(f"{gen}: eos_token_id is not an id or a list of ids ({e})") from None
    return tuple(dict.fromkeys(ids))
