"""FLOPs and parameter bytes on the ``meta`` device: torch's ``FlopCounterMode`` through the adapter's
own calls, accelerate's ``calculate_maximum_sizes`` (:mod:`maskrl.plan`'s docstring)."""
from __future__ import annotations

import contextlib

import torch

from maskrl.plan.shapes import ModelShape
from maskrl.plan.work import Call

def _dtype(name: str) -> torch.dtype:
    from maskrl.models.loading import parse_dtype

    return parse_dtype(name)


def build_adapter(shape: ModelShape, dtype: torch.dtype, lora: dict | None, checkpointing: bool, device="meta",
                  hidden_size: int | None = None, num_layers: int | None = None, seed: int = 0):
    """A :class:`~maskrl.models.ModelAdapter` of ``shape`` (optionally narrowed) on ``device``, with LoRA
    (``{rank, alpha, targets}``) and gradient checkpointing as the recipe has them; the family's logit
    shift and block size (a block-diffusion shape runs block-causal, as the loaded model does)."""
    from transformers import AutoModelForCausalLM

    from maskrl.models import ModelAdapter, apply_lora, enable_gradient_checkpointing

    from maskrl.plan.moe import meta_routing

    config = shape.hf_config(hidden_size, num_layers)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        if shape.num_experts:  # the family's own module (no transformers class runs LLaDA2)
            from maskrl.models.llada2_moe import LLaDA2MoeModelLM

            model = LLaDA2MoeModelLM(config).to(dtype)
        else:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    meta_routing(model)  # a meta MoE model routes its tokens by a fixed balanced rule (maskrl.plan.moe)
    model.eval()
    v = shape.vocab_size
    ad = ModelAdapter(model=model, mask_id=v - 1, eos_id=v - 2, pad_id=v - 2, shift=shape.shift,
                      family=shape.family, block_size=shape.block_size)
    if checkpointing:
        enable_gradient_checkpointing(ad)
    if lora:
        ad = apply_lora(ad, rank=lora["rank"], alpha=lora["alpha"], target_modules=lora["targets"],
                        experts=bool(lora.get("experts")))
    return ad


def first_layers(shape: ModelShape) -> int:
    """Decoder layers at the start that differ from the rest (an MoE model's ``first_k_dense_replace`` dense
    layers; 0 for a dense model)."""
    return int(getattr(shape, "first_dense_layers", 0) or 0)


def _lora(cfg) -> dict | None:
    mc = cfg.model
    if mc.lora_rank <= 0:
        return None
    t = mc.lora_target_modules
    out = {"rank": mc.lora_rank, "alpha": mc.lora_alpha,
           "targets": t if t == "all-linear" else [m.strip() for m in t.split(",") if m.strip()]}
    return out | {"experts": True} if mc.lora_experts else out


def _inputs(ad, rows: int, seq: int, scored: int, device):
    ids = torch.zeros((rows, seq), dtype=torch.long, device=device)
    attn = torch.ones((rows, seq), dtype=torch.bool, device=device)
    r = torch.arange(scored, device=device) % rows
    c = torch.full((scored,), seq - 1, dtype=torch.long, device=device)
    return ids, attn, r, c, torch.zeros(scored, dtype=torch.long, device=device)


class FlopModel:
    """FLOPs of the calls of one model shape, counted by ``FlopCounterMode`` on the meta device (see
    the module docstring); memoised per (kind, sequence length, cached keys)."""

    def __init__(self, shape: ModelShape, dtype: torch.dtype, lora: dict | None, checkpointing: bool,
                 extrapolate: bool = True) -> None:
        self.lora, self.dtype, self.ckpt = lora, dtype, checkpointing
        self.shape = shape
        first = first_layers(shape)
        #: decoder depths counted: every layer past the first ``first`` (dense) ones is the same, so a count is
        #: affine in the depth and two depths give the full one exactly (:meth:`_count`)
        self.depths = (first + 1, first + 2) if extrapolate and shape.num_layers > first + 2 else (shape.num_layers,)
        self._adapters: dict = {}
        self._memo: dict = {}

    def _pair(self, depth: int):
        """``(no-grad adapter, train-mode adapter)`` of ``depth`` decoder layers on the meta device."""
        if depth not in self._adapters:
            from maskrl.models.scale import rl_train_mode

            ad = build_adapter(self.shape, self.dtype, self.lora, self.ckpt, num_layers=depth)
            train = build_adapter(self.shape, self.dtype, self.lora, self.ckpt, num_layers=depth)
            rl_train_mode(train.model)
            self._adapters[depth] = (ad, train)
        return self._adapters[depth]

    @property
    def adapter(self):
        return self._pair(self.depths[0])[0]

    def _count(self, kind: str, rows: int, seq: int, scored: int, past: int) -> int:
        """FLOPs of one call at the full depth: counted at :attr:`depths` and extrapolated in the layer count
        (exact: the layers past the first dense ones are alike, and embedding, final norm and output layer
        are counted once at either depth; ``tests/test_plan.py`` checks it against the full-depth count)."""
        return self._deep([self._count_at(d, kind, rows, seq, scored, past) for d in self.depths])

    def _deep(self, counts: list[int]) -> int:
        """A count at the full depth from the counts at :attr:`depths` (affine in the layer count)."""
        if len(counts) == 1:
            return counts[0]
        return counts[0] + (self.shape.num_layers - self.depths[0]) * (counts[1] - counts[0])

    def _count_at(self, depth: int, kind: str, rows: int, seq: int, scored: int, past: int) -> int:
        from torch.utils.flop_counter import FlopCounterMode

        dev = torch.device("meta")
        if kind == "train":
            ad = self._pair(depth)[1]
            ids, attn, r, c, t = _inputs(ad, rows, seq, scored, dev)
            with FlopCounterMode(display=False) as fc:
                ad.log_probs_at(ids, attn, r, c, t).sum().backward()
            return fc.get_total_flops()
        ad = self._pair(depth)[0]
        # the reference, and a rollout on the merged copy (rollout.merge_lora), run without the LoRA branch
        off = ad.reference() if kind in ("reference", "rollout_merged") and self.lora else contextlib.nullcontext()
        with torch.no_grad(), off, FlopCounterMode(display=False) as fc:
            if kind in ("forward", "reference"):
                ids, attn, r, c, t = _inputs(ad, rows, seq, scored, dev)
                ad.log_probs_at(ids, attn, r, c, t)
            else:  # rollout: decoder against ``past`` cached keys, then the output layer on ``scored`` states
                ids = torch.zeros((rows, seq), dtype=torch.long, device=dev)
                kv = None
                if past:
                    cfg = ad.model.config
                    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
                    kv = [(torch.zeros((rows, cfg.num_key_value_heads, past, hd), dtype=ad.dtype, device=dev),) * 2
                          for _ in range(cfg.num_hidden_layers)]
                pos = torch.arange(past, past + seq, device=dev).expand(rows, seq)
                keys = torch.arange(past + seq, device=dev).expand(rows, past + seq)  # a block model reads them
                hidden, _ = ad.decoder_forward(ids, torch.ones((rows, past + seq), dtype=torch.bool, device=dev), pos,
                                               past=kv, key_positions=keys)
                if scored:
                    ad.head(hidden.reshape(-1, hidden.shape[-1])[:1].expand(scored, -1))
        return fc.get_total_flops()

    def merge_flops(self) -> int:
        """FLOPs of building the rollout's merged LoRA copy once (:func:`maskrl.models.merged.merged_copy`:
        peft's ``B @ A`` of every adapted layer), counted on the meta model; 0 without LoRA."""
        if not self.lora:
            return 0
        if "merge" not in self._memo:
            from torch.utils.flop_counter import FlopCounterMode

            from maskrl.models.merged import merged_copy

            counts = []
            for d in self.depths:  # one B @ A per adapted matrix: affine in the depth as well
                with FlopCounterMode(display=False) as fc:
                    merged_copy(self._pair(d)[0].model)
                counts.append(fc.get_total_flops())
            self._memo["merge"] = self._deep(counts)
        return self._memo["merge"]

    def flops(self, kind: str, rows: int, seq: int, scored: int, past: int = 0) -> int:
        """FLOPs of one call: ``kind`` ``train`` (forward + backward), ``forward`` (no grad, scored
        positions through the output layer), ``reference`` (the same with LoRA adapters disabled, as the
        trainer's reference policy is), ``rollout`` (decoder + output layer) or ``rollout_merged`` (the
        same without the LoRA branch: the merged copy of ``rollout.merge_lora``)."""
        if past > 0:  # affine in the cached length: exact from pasts 1 and 2 (:meth:`past_slope`)
            at1, slope = self.past_slope(kind, seq)
            return self._at(at1, rows, scored) + (past - 1) * self._at(slope, rows, scored)
        return self._at(self._points(kind, seq, 0), rows, scored)

    def past_slope(self, kind: str, seq: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """``(points at past 1, their increase per cached key)`` of a ``kind`` call of ``seq`` queries.

        A call against ``past`` cached keys differs from one against ``past - 1`` only in the attention's
        two matmuls over the key axis (``Q·Kᵀ`` and ``softmax·V``, each ``2 · rows · heads · seq · head``
        FLOPs per key and layer; the projections, MLP and output layer see the ``seq`` queries alone), so
        every point of :meth:`_points` is affine in ``past`` and two counts give all of them exactly
        (``tests/test_plan.py`` checks the interpolation against direct counts). Planning a rollout of
        L tokens in blocks of b then counts 2 pasts instead of about 2L / b."""
        p1, p2 = self._points(kind, seq, 1), self._points(kind, seq, 2)
        return p1, tuple(b - a for a, b in zip(p1, p2))

    def _points(self, kind: str, seq: int, past: int) -> tuple[int, int, int]:
        """``(FLOPs at 1 row and 1 scored position, per extra row, per extra scored position)``, memoised."""
        key = (kind, seq, past)
        if key not in self._memo:
            f11 = self._count(kind, 1, seq, 1, past)
            f21 = self._count(kind, 2, seq, 1, past)
            f12 = self._count(kind, 1, seq, 2, past)
            self._memo[key] = (f11, f21 - f11, f12 - f11)
        return self._memo[key]

    @staticmethod
    def _at(points: tuple[int, int, int], rows: int, scored: int) -> int:
        f11, per_row, per_pos = points
        return int(f11 + (rows - 1) * per_row + (scored - 1) * per_pos)


def param_memory(shape: ModelShape, dtype: torch.dtype, lora: dict | None, extrapolate: bool = True) -> dict:
    """Parameter bytes and counts of the model (:func:`_param_memory_at`), counted at 1 and 2 decoder layers
    (past an MoE model's first dense ones) and extrapolated to the depth: every count is affine in the
    layer count, and the largest layer is one of those the 2-layer model has (``tests/test_plan.py``
    checks the extrapolation against the full-depth count)."""
    first = first_layers(shape)
    if not extrapolate or shape.num_layers <= first + 2:
        return _param_memory_at(shape, dtype, lora, shape.num_layers)
    a, b = (_param_memory_at(shape, dtype, lora, d) for d in (first + 1, first + 2))
    n = shape.num_layers - first - 1
    return b | {k: a[k] + n * (b[k] - a[k]) for k in ("total_bytes", "params", "trainable", "base_params",
                                                      "adapter_params", "merged_copy_bytes", "merge_adapter_bytes")}


def _param_memory_at(shape: ModelShape, dtype: torch.dtype, lora: dict | None, depth: int) -> dict:
    """Parameter bytes and counts of the model (meta device; accelerate's ``calculate_maximum_sizes``):
    ``{total_bytes, largest_layer_bytes, params, trainable, base_params, base_dtypes, adapter_params,
    adapter_dtypes, merged_copy_bytes, merge_adapter_bytes, merge_delta_bytes}``; ``params`` counts the base model and the LoRA adapter (peft's ``lora_``
    parameters) together, ``base_*`` / ``adapter_*`` each apart, with the dtypes they are held in (names,
    sorted); ``merged_copy_bytes``: the rollout's merged LoRA copy (:func:`maskrl.models.merged.merged_copy_bytes`;
    0 without LoRA) and ``merge_*``: what the merge holds above it at its peak
    (:func:`maskrl.models.merged.merge_transient_bytes`; the delta, of the largest matrix, does not grow with
    depth); of the model at ``depth`` decoder layers."""
    from accelerate.utils import calculate_maximum_sizes

    from maskrl.models.merged import merge_transient_bytes, merged_copy_bytes

    ad = build_adapter(shape, dtype, lora, False, num_layers=depth)
    total, largest = calculate_maximum_sizes(ad.model)
    named = list(ad.model.named_parameters())
    adapter = [p for n, p in named if "lora_" in n]
    base = [p for n, p in named if "lora_" not in n]
    dtypes = lambda ps: sorted({str(p.dtype).removeprefix("torch.") for p in ps})  # noqa: E731
    return {"total_bytes": int(total), "largest_layer_bytes": int(largest[0]), "params": sum(p.numel() for _, p in named),
            "trainable": sum(p.numel() for _, p in named if p.requires_grad),
            "base_params": sum(p.numel() for p in base), "base_dtypes": dtypes(base),
            "adapter_params": sum(p.numel() for p in adapter), "adapter_dtypes": dtypes(adapter),
            "merged_copy_bytes": int(merged_copy_bytes(ad.model)),
            **dict(zip(("merge_adapter_bytes", "merge_delta_bytes"), merge_transient_bytes(ad.model)))}


def work_table(calls: list[Call], fm: FlopModel, checkpointing: bool, merged_rollout: bool = False
               ) -> tuple[dict, int, int]:
    """``(by phase/term {forwards, rows, scored_positions, flops}, total FLOPs, weight reads)`` of one RL
    step's :class:`Call` list; weight reads count a checkpointed θ pass twice (its recomputation).
    ``merged_rollout``: the rollout runs on the merged LoRA copy (no LoRA branch, ``rollout.merge_lora``)."""
    work: dict[str, dict] = {}
    total = reads = 0
    rollout = "rollout_merged" if merged_rollout else "rollout"
    for c in calls:
        kind = {"rollout": rollout, "theta": "train", "reference": "reference"}.get(c.phase, "forward")
        f = fm.flops(kind, c.rows, c.seq, c.scored, c.past) * c.count
        key = c.phase if c.phase in ("rollout", "credit") else f"{c.phase}/{c.term}"
        w = work.setdefault(key, {"forwards": 0, "rows": 0, "scored_positions": 0, "flops": 0})
        w["forwards"] += c.count
        w["rows"] += c.rows * c.count
        w["scored_positions"] += c.scored * c.count
        w["flops"] += f
        total += f
        reads += c.count * (2 if kind == "train" and checkpointing else 1)
    if merged_rollout and "rollout" in work:  # the merged copy is built once per rollout
        work["rollout"]["flops"] += fm.merge_flops()
        total += fm.merge_flops()
    return work, total, reads
