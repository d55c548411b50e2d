"""Memory of one process: parameters, gradients and optimizer states by sharding strategy, and the
transient activation peaks measured with torch's CPU profiler on narrow real models and fitted to the
full shape (:mod:`maskrl.plan`'s docstring)."""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from typing import Iterator

import torch

from maskrl.plan.flops import _inputs, build_adapter
from maskrl.plan.shapes import GIB, Hardware, ModelShape

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


#: lines torch's profiler writes to stderr by itself on every session, from C++: kineto's start / stop
#: and stage lines (``USDT:<date> <time> <pid>:<tid> SyncActivityProfilerHandler.cpp:52] profiler_start``,
#: ``STAGE:... Completed Stage: Warm Up``) and c10's note that a block allocated before profiling was
#: freed during it (``[W<date> ... CPUAllocator.cpp:245] Memory block of unknown size was allocated
#: before the profiling started ...``), which :func:`profiled_peak` handles by design
PROFILER_LOG = re.compile(r"(?:USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+\.cpp:\d+\] "
                          r"|\[W\d{4} [^\]]*CPUAllocator\.cpp:\d+\] Memory block of unknown size was allocated before")


@contextlib.contextmanager
def quiet_profiler_log() -> Iterator[None]:
    """Hold back :data:`PROFILER_LOG` lines while the block runs: the process's stderr (file
    descriptor 2, which the profiler's C++ side writes to directly) goes to a temporary file, and
    every other line written there is passed on to ``sys.stderr`` afterwards, in order (a warning
    raised inside the block is kept, only later). Without a file descriptor 2 nothing is redirected."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().decode("utf-8", "replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not PROFILER_LOG.match(line))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


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
    ``fn``'s end. The profiler's own log lines are held back (:func:`quiet_profiler_log`).

    Raises:
        RuntimeError: the profiler recorded no marker (memory profiling unavailable).
    """
    from torch.profiler import ProfilerActivity, profile

    with quiet_profiler_log():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            keep = fn()
            mark = torch.empty(_MARK_BYTES, dtype=torch.uint8)
            del keep, mark
        events = _allocation_events(prof)
    live: dict[int, int] = {}
    cur = best = 0
    for _, ptr, b in events:
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
    with an even head size and an integer MLP width, else 2·heads and 4·heads (a stated head size: the
    narrowest such width w >= 2·heads and 2w; ``(d, d)`` when the wider reaches d). A stated head size (Qwen3's 128) shrinks with the width
    (:meth:`~maskrl.plan.shapes.ModelShape.hf_config`), so it, not d / heads, must stay an even integer."""
    d, h = shape.hidden_size, shape.num_heads

    def fits(w: int) -> bool:
        head = shape.head_size * w
        moe = (getattr(shape, "moe_intermediate_size", None) or 0) * w  # an MoE model's expert width too
        return head % d == 0 and (head // d) % 2 == 0 and (shape.intermediate_size * w) % d == 0 and moe % d == 0 and (
            shape.head_dim is not None or w % h == 0)

    picks = [d // f for f in (16, 8) if d % f == 0 and fits(d // f)]
    if len(picks) == 2:
        return picks[0], picks[1]
    if shape.head_dim is None:
        return (2 * h, 4 * h) if 4 * h < d else (d, d)
    w = next((w for w in range(2 * h, d) if fits(w)), d)
    return (w, 2 * w) if 2 * w < d else (d, d)


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
    * ``head(M)`` / ``head_backward(M)`` / ``propose(R)`` / ``stats(M)``: the output layer and
      log-probability of M scored positions without / with backward, the sampler's block proposal
      (float64 Gumbel-max, docs/spec.md §1.2) of R rows, and a credit module's token statistics of M positions
      (probability and entropy over the vocabulary, :func:`maskrl.credit.rldf.token_stats`).

    Peaks: no-grad forward ``max(decoder(R), hidden(R) + head(M))``; θ forward + backward
    ``saved(R, M) + max(backward(R), head_backward(M))``; rollout step ``max(decoder(R), hidden(R) +
    propose(R))``; a credit module's forward (phase ``credit``) ``max(decoder(R), hidden(R) + stats(M))``;
    ``hidden(R)`` = R·S·d bytes of the last hidden state.
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

    def _head_parts(self, scored: int) -> tuple[int, int, int, int, int]:
        """(no-grad head + log-prob peak, saved bytes of the head with grad, its backward peak, the
        sampler's proposal peak, the credit statistics' peak) for ``scored`` positions, at the narrowest
        width (the [M, V] tensors dominate; the [M, d] input is added at full width)."""
        from maskrl.credit.rldf import token_stats
        from maskrl.models.adapter import token_log_probs
        from maskrl.sampling import propose as _propose  # the sampler's own candidate draw

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

        def stats():
            with torch.no_grad():
                logits = head(hid)
                token_stats(logits, tg, entropy=True)  # the entropy's extra [M, V] tensors: the larger case

        sp, _ = profiled_peak(stats)
        return hf, hs, hb, pp, sp

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
        """Transient peak bytes of one call (``forward``, ``train``, ``rollout`` or ``credit``) at the full shape."""
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
        if kind == "credit":
            return int(max(dec(0), hidden + head(4, scored)))
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


def files_gib(cfg, pm: dict, shape: ModelShape | None = None) -> dict:
    """What a run writes and holds outside the training step, in GiB (whole run, not per process):

    * ``checkpoint``: one ``checkpoints/step_K`` folder -- the trainable parameters (LoRA: float32
      adapters, 4 B an entry; full fine-tuning: every weight in the model's dtype) and AdamW's two
      moments (8 B a trainable entry); the frozen base is not in it (:mod:`maskrl.training.checkpoint`);
      a resume reads this much into host memory.
    * ``export_host``: host memory the main process adds at the final export -- LoRA: the float32 merged
      copy, made on the CPU (4 B an entry of the whole model; :func:`maskrl.models.export.cpu_float32_copy`);
      full fine-tuning: the weights as written (the model's dtype). LoRA adds a passing peak of five
      float32 copies of the largest adapted matrix (peft's ``get_delta_weight`` and the update check,
      :func:`maskrl.models.export.update_fidelity`; 0.97 GiB measured at LLaDA's 4,096 × 12,288).
    * ``export_disk``: the ``model/`` folder (LoRA: float32 merged weights, plus the adapter).
    """
    trainable = pm["trainable"]
    lora = cfg.model.lora_rank > 0
    weights = 4.0 * trainable if lora else float(pm["total_bytes"])
    export = 4.0 * pm["params"] if lora else float(pm["total_bytes"])
    largest = shape.hidden_size * max(shape.hidden_size, shape.intermediate_size) if shape is not None else 0
    host = export + (5 * 4.0 * largest if lora else 0.0)
    return {"checkpoint": (weights + 8.0 * trainable) / GIB, "export_host": host / GIB,
            "export_disk": (export + (4.0 * trainable if lora else 0.0)) / GIB}


def memory_gib(cfg, calls: list, shape: ModelShape, dtype: torch.dtype, am: ActivationModel, pm: dict, hw: Hardware,
               prompt_length: int, needs_reference: bool, merged_rollout: bool = False) -> dict:
    """The plan's ``memory_gib`` (GiB per process): the static parts (:func:`_static_memory`), the rollout's
    key/value cache, each phase's largest activation peak over its calls (a cached window step costs
    less than its block's full refresh forward and is skipped), the peaks, and whether they fit.
    ``merged_rollout``: the rollout phase also holds the merged LoRA copy (``rollout_merged_copy``:
    ``pm["merged_copy_bytes"]``, :mod:`maskrl.models.merged`), made before its first forward and freed after it;
    while it is made, peft's merge holds more (``rollout_merge_peak``: the copy, the cloned adapters and float32
    ``ΔW`` of the largest adapted matrix, ``pm["merge_*_bytes"]``), the rollout's peak when no forward exceeds it."""
    static = _static_memory(cfg, pm, hw, dtype, needs_reference)
    merged = float(pm.get("merged_copy_bytes", 0)) if merged_rollout else 0.0
    # the merge's own passing peak (float32 ΔW of the largest adapted matrix, the cloned adapters), before any forward
    merging = merged + float(pm.get("merge_adapter_bytes", 0) + pm.get("merge_delta_bytes", 0)) if merged else 0.0
    static_total = sum(static.values())
    phases: dict[str, float] = {}
    kv = 0.0
    if cfg.rollout.cache != "none":
        hd = shape.head_size
        n_rows = max((c.rows for c in calls if c.phase == "rollout"), default=0)
        seq = prompt_length + cfg.rollout.gen_length
        kv = 2.0 * shape.num_layers * n_rows * shape.num_kv_heads * hd * seq * torch.finfo(dtype).bits / 8
    for c in calls:
        if c.phase == "rollout":
            if c.past:  # cached window steps cost less than the block's full refresh forward
                continue
            act = am.peak("rollout", c.rows, c.seq, c.scored) + kv + merged
        elif c.phase == "theta":
            act = am.peak("train", c.rows, c.seq, c.scored)
        elif c.phase == "credit":
            act = am.peak("credit", c.rows, c.seq, c.scored)
        else:
            act = am.peak("forward", c.rows, c.seq, c.scored)
        phases[c.phase] = max(phases.get(c.phase, 0.0), act)
    if "rollout" in phases:
        phases["rollout"] = max(phases["rollout"], merging)
    peaks = {p: static_total + a for p, a in phases.items()}
    peak = max(peaks.values()) if peaks else static_total
    return {"static": {k: v / GIB for k, v in static.items()},
            "static_total": static_total / GIB,
            "kv_cache": kv / GIB,
            "rollout_merged_copy": merged / GIB, "rollout_merge_peak": merging / GIB,
            "activations": {k: v / GIB for k, v in phases.items()},
            "peak_by_phase": {k: v / GIB for k, v in peaks.items()},
            "peak": peak / GIB, "gpu_memory": hw.gpu_memory / GIB, "fits": peak <= hw.gpu_memory}
