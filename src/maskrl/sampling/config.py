"""The sampler's settings (docs/spec.md §1.2): :class:`SamplerConfig` and the names of its choices."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

SCHEDULES = ("fixed", "threshold", "dream")
DREAM_REMASKING = ("maskgit_plus", "topk_margin", "entropy", "origin")
#: the block-diffusion families' strategies (SDAR's ``block_diffusion_generate``, the entropy-bounded sampler)
BLOCK_REMASKING = ("sequential", "low_confidence_static", "low_confidence_dynamic", "entropy_bounded")
REMASKING = ("low_confidence", "random") + DREAM_REMASKING + BLOCK_REMASKING
CACHES = ("none", "prefix", "dual", "block")
OBSERVER_LOGITS = ("exact", "refuse")
BLOCK_FIRSTS = ("ranked", "forced")
DREAM_DTYPES = ("float32", "model")


@dataclass(frozen=True)
class SamplerConfig:
    """Sampler settings (docs/spec.md §1.2).

    Attributes:
        gen_length: completion length L in tokens.
        block_length: block size b; ``gen_length`` must be a multiple of it.
        steps: total denoising steps T for the fixed schedule; must be a multiple of ``L/b``.
        temperature: τ of the Gumbel-max candidate draw; 0 = argmax (greedy).
        schedule: ``"fixed"`` (top-k_j per step), ``"threshold"`` (Fast-dLLM) or ``"dream"`` (Dream's
            ``int(m · (1 - s/t))`` per step inside each block, :mod:`maskrl.sampling.dream`).
        threshold: confidence threshold of the threshold schedule.
        remasking: ``"low_confidence"`` (commit the most confident) or ``"random"`` (LLaDA); one of the
            block-diffusion families' strategies (SDAR's ``block_diffusion_generate``; ``schedule="fixed"``,
            whose per-block counts are SDAR's transfer counts, each capped at the masks left in the block):
            ``"sequential"`` (the block's first masks, left to right), ``"low_confidence_static"`` (the most
            confident), ``"low_confidence_dynamic"`` (every mask whose confidence exceeds ``threshold`` when
            they are at least the step's count, else the most confident) or ``"entropy_bounded"`` (the
            lowest-entropy masks while their entropy sum minus its largest term stays <= ``eb_threshold``;
            no count); candidates drawn at ``temperature`` after ``top_k`` / ``top_p``, confidence = the
            candidate's probability under that distribution (:mod:`maskrl.sampling.commit`); or one of
            Dream's algorithms: ``"maskgit_plus"`` (top-1 probability), ``"topk_margin"`` (top-1 minus
            top-2), ``"entropy"`` (negative entropy), each from Dream's softmax with ``[M]`` kept in,
            or ``"origin"`` (each mask revealed with probability ``1 - s/t``; needs
            ``schedule="dream"``). Dream's algorithms need ``schedule`` ``"fixed"`` or ``"dream"``,
            except ``"maskgit_plus"``, which also runs under ``"threshold"`` (Fast-dLLM's Dream
            ``confidence_threshold``: the threshold compares Dream's top-1 probability).
        top_k: keep the ``top_k`` largest logits before Dream's softmax and the candidate draw
            (``None``: off; Dream's README call inherits 50 from transformers' generation defaults).
        top_p: nucleus filter before the softmax and the draw (1.0: off).
        alg_temp: Dream's ``alg_temp``: > 0 draws the committed positions from
            ``softmax(confidence / alg_temp)`` instead of taking the most confident (0: top-k).
        block_first: ``"ranked"`` (default: a block's first position is ranked with the others) or
            ``"forced"`` (Fast-dLLM's Dream block variant, ``generation_utils_block.py``: a block's
            first step is one full forward that commits only the block's first position, unranked,
            and the block's remaining steps rank the rest -- Dream's schedule from its second time
            step, or the threshold; under a cache the window then starts at the block, as Fast-dLLM's
            does). Needs Dream's rule with ``schedule`` ``"dream"`` (at least 2 steps per block) or
            ``"threshold"`` with ``remasking="maskgit_plus"``, and ``suppress_eos`` off. On a block-diffusion
            model with ``schedule="threshold"`` and ``remasking="low_confidence"``: Fast-dLLM v2's rule -- a
            block that starts at a block boundary first commits its first position alone, the argmax (for
            a shifted model the previous block's last position predicts it, autoregressively), then the
            threshold steps, whose threshold is strict and whose confidences keep ``[M]`` in the softmax
            (Fast-dLLM v2's code; :attr:`v2_rule`).
        dream_dtype: the dtype of Dream's softmax, confidences and draws: ``"float32"`` (default; the
            logits upcast, as Dream's code runs on a float32 model) or ``"model"`` (the logits' own
            dtype, as Dream's code runs on the model: token for token equal to it for bf16 models,
            including its fall-back to the greedy candidate whenever torch's ``Categorical`` rejects
            the bf16 probabilities as not summing to 1, which a good share of bf16 sampled steps do).
        eb_threshold: γ of ``remasking="entropy_bounded"`` (nats; SDAR's ``eb_threshold``).
        sub_block_length: Fast-dLLM v2's ``small_block_size``: each step commits only inside the first
            sub-block of this many positions (counted from the block's start) that still holds a mask;
            ``None`` (default): the whole block. Not with Dream's rule.
        edit_threshold: LLaDA2.1's token-to-token editing (M2T + T2T; :mod:`maskrl.sampling.edit`), block-diffusion
            strategies on a block-diffusion model only: besides the strategy's mask commits, each step replaces
            every committed completion token of the row's current block whose candidate differs from it and
            whose confidence exceeds this (strictly; 0 edits every change); ``None`` (default): off. An edited
            position records the step and probability of its last write (docs/sampler.md says which
            objectives and credit modules take such rollouts).
        max_post_steps: with ``edit_threshold``: the edit-only steps a block may take once it has no mask left
            (it ends at the first that edits nothing); LLaDA2.1's default 16.
        early_stop: block-diffusion models only: a row whose completed blocks hold a stop id (eos or a
            stop id) decodes no further block; its later positions are padding (``pad_id``, committed
            at the row's last step with probability 1, outside ``completion_mask``). With full attention
            the tokens after a stop are context of every earlier position, so it is refused there.
        cfg_scale: classifier-free guidance scale (0 = off); the unconditional pass masks the prompt.
        suppress_eos: a stop candidate (eos or any of the adapter's stop ids) is committed only when
            no other candidate is left in the block: it ranks after every other candidate, and is
            committed at a step only if every other candidate of the block is committed by then,
            under either schedule (:func:`~maskrl.sampling.commit.hold_stops`).
        cache: ``"none"`` (every step is a full forward; the exact behaviour of maskrl <= 0.x, bit for
            bit), ``"prefix"`` or ``"dual"`` (Fast-dLLM key/value caches, refreshed at every block
            start; see :mod:`maskrl.sampling.cache`), or ``"block"``: the exact key/value cache of a
            block-diffusion model (``ModelAdapter.block_size``; the complete blocks' keys/values, appended
            once per block; token for token ``"none"``'s decoding). Block models take ``"none"`` or
            ``"block"``; ``"block"`` needs one. Needs ``cfg_scale == 0`` and a 4-D-mask model.
        mismatch_every: trainer only: every this many RL steps log ``rollout/mismatch``, the mean
            ``|log commit_prob - log p_theta|`` over committed tokens with p_theta from a full forward
            at each commit state (:func:`~maskrl.sampling.rollout_mismatch`); 0 = never. Costs one
            forward per distinct commit step of the batch.
        observer_logits: **[choice]** what a cache does to observers that declare ``exact_logits``
            (DPS, DiSPO, RLDF/DTCA's commit probabilities): ``"exact"`` (default) -- at every step
            where such an observer reads a row whose step ran against the cache, the sampler runs one
            extra full forward of that row at the pre-step state and the observer's view comes from
            it (the commits still use the cached logits, so the trajectory is the cached one);
            ``"refuse"`` -- :func:`~maskrl.sampling.generate` (and the trainer's config check)
            raises instead. Ignored with ``cache="none"``, where every step is a full forward. Cost
            of ``"exact"``: an observer that reads every step (DPS, RLDF/DTCA under a cache) adds a
            full forward to every cached step, so rollouts cost more than with ``cache="none"``;
            DiSPO adds one per branched row (plus the last block's steps under the threshold
            schedule).
        merge_lora: **[choice]** with LoRA adapters (``model.lora_rank > 0``): ``true`` (default) samples
            from a copy of the policy with the LoRA update merged into the adapted layers' weights
            (:mod:`maskrl.models.merged`; the trained weights are never written), so each rollout
            forward costs what the plain model's does; ``false`` samples through the peft model (no
            copy: for when memory is short; ``maskrl plan`` lists the copy as ``rollout_merged_copy``,
            one copy of the adapted weights in the model's dtype during the rollout). In bf16 the copy
            rounds ``W + ΔW`` to bf16 (an update below half a bf16 step of its weight is lost there,
            ``rollout.mismatch_every`` measures the gap). Read by the trainer's rollout
            (``rollout.merge_lora``) and its evaluations during training (``eval.merge_lora``); under
            FSDP / DeepSpeed, whose processes hold no whole weights, the peft model samples (logged once).

    Raises:
        ValueError: naming the field, on any setting outside its range or choices, a NaN or infinite
            number included (in ``__post_init__``).
    """

    gen_length: int = 256
    block_length: int = 32
    steps: int = 128
    temperature: float = 0.0
    schedule: str = "fixed"
    threshold: float = 0.9
    remasking: str = "low_confidence"
    cfg_scale: float = 0.0
    suppress_eos: bool = False
    cache: str = "none"
    mismatch_every: int = 0
    observer_logits: str = "exact"
    top_k: int | None = None
    top_p: float = 1.0
    alg_temp: float = 0.0
    block_first: str = "ranked"
    dream_dtype: str = "float32"
    eb_threshold: float = 0.35
    early_stop: bool = False
    sub_block_length: int | None = None
    edit_threshold: float | None = None
    max_post_steps: int = 16
    merge_lora: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):  # NaN passes every `x < 0` check below; inf runs the loop into an error
            v = getattr(self, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"{f.name} (={v}) must be a finite number")
        if self.gen_length <= 0 or self.block_length <= 0:
            raise ValueError(f"gen_length (={self.gen_length}) and block_length (={self.block_length}) must be positive")
        if self.gen_length % self.block_length:
            raise ValueError(f"gen_length (={self.gen_length}) must be a multiple of block_length (={self.block_length})")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r} is not one of {SCHEDULES}")
        if self.remasking not in REMASKING:
            raise ValueError(f"remasking {self.remasking!r} is not one of {REMASKING}")
        if self.schedule in ("fixed", "dream") and (self.steps <= 0 or self.steps % self.num_blocks):
            raise ValueError(f"steps (={self.steps}) must be a positive multiple of the number of blocks "
                             f"gen_length/block_length = {self.num_blocks}")
        if self.schedule == "fixed" and self.steps > self.gen_length:
            raise ValueError(f"steps (={self.steps}) must be <= gen_length (={self.gen_length}): each step commits "
                             "at least one token, so more steps than tokens cannot run")
        if self.remasking == "origin" and self.schedule != "dream":
            raise ValueError(f"remasking 'origin' reveals each mask with Dream's probability 1 - s/t and needs "
                             f"schedule 'dream' (got schedule {self.schedule!r})")
        self._check_block_rules()
        if self.remasking in DREAM_REMASKING[1:] and self.schedule == "threshold":
            raise ValueError(f"remasking {self.remasking!r} needs schedule 'fixed' or 'dream': the threshold schedule "
                             "compares a probability with the threshold (use remasking 'maskgit_plus' for Dream's "
                             "top-1 probability, as Fast-dLLM's Dream confidence_threshold does, or 'low_confidence')")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int)
                                       or self.top_k < 2):
            raise ValueError(f"top_k (={self.top_k!r}) must be an integer >= 2 (topk_margin needs two ids) or None")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p (={self.top_p}) must lie in (0, 1]")
        if (self.schedule == "threshold" and self.remasking != "maskgit_plus"
                and (self.top_k is not None or self.top_p < 1.0)):
            raise ValueError("top_k / top_p are Dream's sampling options: under schedule 'threshold' they need remasking "
                             "'maskgit_plus' (Dream's confidence); the LLaDA threshold compares unfiltered probabilities")
        if self.schedule == "threshold" and self.alg_temp > 0:
            raise ValueError(f"alg_temp (={self.alg_temp}) draws k positions and needs schedule 'fixed' or 'dream' "
                             "(the threshold schedule has no k)")
        self._check_block_first()
        if self.alg_temp < 0:
            raise ValueError(f"alg_temp (={self.alg_temp}) must be >= 0")
        if self.alg_temp > 0 and self.remasking in ("random", "origin"):
            raise ValueError(f"alg_temp (={self.alg_temp}) samples positions by confidence; remasking "
                             f"{self.remasking!r} has none")
        if self.temperature < 0:
            raise ValueError(f"temperature (={self.temperature}) must be >= 0")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold (={self.threshold}) must lie in (0, 1]")
        if self.cache not in CACHES:
            raise ValueError(f"cache {self.cache!r} is not one of {CACHES}")
        if self.cache != "none" and self.cfg_scale > 0:
            raise ValueError(f"cache={self.cache!r} needs cfg_scale == 0 (got {self.cfg_scale}): the unconditional "
                             "pass would need its own cache; use cache='none' with classifier-free guidance")
        if not isinstance(self.merge_lora, bool):
            raise ValueError(f"merge_lora (={self.merge_lora!r}) must be true or false")
        if self.mismatch_every < 0:
            raise ValueError(f"mismatch_every (={self.mismatch_every}) must be >= 0")
        if self.observer_logits not in OBSERVER_LOGITS:
            raise ValueError(f"observer_logits {self.observer_logits!r} is not one of {OBSERVER_LOGITS}")

    def block_model_refusal(self, block_size: int | None) -> str | None:
        """Why these settings cannot decode a model of attention block size ``block_size`` (``None``: full
        attention), or ``None`` when they can: what a block-diffusion model needs of the sampler, and what
        only it takes (:func:`maskrl.sampling.checks.check_blocks`; a run's sections:
        :func:`maskrl.prompts.check_run_samplers`)."""
        if block_size is None:
            if self.block_first == "forced" and not self.dream_rule:
                return ("block_first 'forced' with LLaDA's rule is Fast-dLLM v2's and needs a block-diffusion "
                        "model (ModelAdapter.block_size set); with full attention it is Dream's (remasking "
                        "'maskgit_plus')")
            if self.cache == "block" or self.early_stop:
                return (f"{'cache=block' if self.cache == 'block' else 'early_stop'} needs a block-diffusion "
                        "model (ModelAdapter.block_size set): with full attention every position sees the "
                        "later ones (use cache 'prefix' / 'dual', early_stop false)")
            if self.edit_threshold is not None:
                return ("edit_threshold (LLaDA2.1's token editing of the current block) needs a block-diffusion "
                        "model (ModelAdapter.block_size set)")
            return None
        if self.block_length != block_size:
            return (f"block_length (={self.block_length}) must equal the model's block size ({block_size}): a "
                    "block-diffusion model decodes one of its attention blocks at a time")
        if self.cache in ("prefix", "dual"):
            return (f"cache={self.cache!r} is LLaDA-style approximate caching; a block-diffusion model "
                    "(block_size set) has the exact block cache: use cache 'block' (or 'none')")
        if self.dream_rule:
            return ("Dream's rule (schedule 'dream', its remasking names, top_k / top_p / alg_temp outside the "
                    "block strategies) is not defined on block-diffusion models; use remasking sequential | "
                    "low_confidence_static | low_confidence_dynamic | entropy_bounded, or LLaDA's")
        return None

    def _check_block_rules(self) -> None:
        """The block-diffusion strategies' settings (SDAR's rule runs under the fixed schedule's counts)."""
        if self.eb_threshold <= 0:
            raise ValueError(f"eb_threshold (={self.eb_threshold}) must be > 0")
        sub = self.sub_block_length
        if sub is not None and (isinstance(sub, bool) or not isinstance(sub, int) or sub < 1
                                or self.block_length % sub):
            raise ValueError(f"sub_block_length (={sub!r}) must be a positive divisor of block_length "
                             f"(={self.block_length}) or None")
        if sub is not None and self.dream_rule:
            raise ValueError("sub_block_length (Fast-dLLM v2's sub-blocks) is not defined for Dream's rule")
        self._check_edits()
        if self.remasking not in BLOCK_REMASKING:
            return
        if self.schedule != "fixed":
            raise ValueError(f"remasking {self.remasking!r} (SDAR's rule) needs schedule 'fixed', whose steps per block "
                             f"give its transfer counts (got schedule {self.schedule!r}); for a threshold use "
                             "'low_confidence_dynamic' with threshold")
        if self.alg_temp > 0 or self.suppress_eos or self.block_first != "ranked":
            raise ValueError(f"remasking {self.remasking!r} (SDAR's rule) takes none of alg_temp, suppress_eos, "
                             "block_first 'forced' (Dream's and LLaDA's options)")

    def _check_edits(self) -> None:
        """LLaDA2.1's editing settings (``edit_threshold``, ``max_post_steps``)."""
        mps = self.max_post_steps
        if isinstance(mps, bool) or not isinstance(mps, int) or mps < 0:
            raise ValueError(f"max_post_steps (={mps!r}) must be an integer >= 0")
        e = self.edit_threshold
        if e is None:
            return
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not 0.0 <= e <= 1.0:
            raise ValueError(f"edit_threshold (={e!r}) must lie in [0, 1] or be None (off)")
        if not self.block_rule:
            raise ValueError(f"edit_threshold (LLaDA2.1's token editing) needs a block-diffusion strategy (remasking one "
                             f"of {BLOCK_REMASKING}, schedule 'fixed'; got remasking {self.remasking!r})")
        if self.sub_block_length is not None:
            raise ValueError("edit_threshold edits the whole current block; it is not defined with sub_block_length")

    @property
    def block_rule(self) -> bool:
        """True when a step goes through the block-diffusion families' strategies (:data:`BLOCK_REMASKING`)."""
        return self.remasking in BLOCK_REMASKING

    @property
    def v2_rule(self) -> bool:
        """True for Fast-dLLM v2's rule (LLaDA's threshold rule with ``block_first="forced"``, which only a
        block-diffusion model runs): its threshold is strict (``>``) and its confidence is the candidate's
        probability under the softmax of every output id, ``[M]`` included
        (:meth:`~maskrl.sampling.sampler.Denoising.commits`)."""
        return self.block_first == "forced" and not (self.dream_rule or self.block_rule)

    @property
    def exact_cache(self) -> bool:
        """True when every step's logits are theta's exact ones: ``cache`` ``"none"`` or ``"block"``."""
        return self.cache in ("none", "block")

    def _check_block_first(self) -> None:
        if self.block_first not in BLOCK_FIRSTS:
            raise ValueError(f"block_first {self.block_first!r} is not one of {BLOCK_FIRSTS}")
        if self.dream_dtype not in DREAM_DTYPES:
            raise ValueError(f"dream_dtype {self.dream_dtype!r} is not one of {DREAM_DTYPES}")
        if self.block_first == "ranked":
            return
        if not (self.schedule == "dream" or (self.schedule == "threshold"
                                             and self.remasking in ("maskgit_plus", "low_confidence"))):
            raise ValueError(f"block_first 'forced' (Fast-dLLM's Dream block variant; Fast-dLLM v2's on block models) "
                             f"needs schedule 'dream', or 'threshold' with remasking 'maskgit_plus' or 'low_confidence' "
                             f"(got schedule {self.schedule!r}, remasking {self.remasking!r})")
        if self.schedule == "dream" and self.steps < 2 * self.num_blocks:
            raise ValueError(f"steps (={self.steps}) must be >= 2 per block (= {2 * self.num_blocks}) with block_first "
                             "'forced': the block's first step commits only its first position")
        if self.suppress_eos:
            raise ValueError("block_first 'forced' commits each block's first position unranked, which suppress_eos "
                             "would have to hold back: use block_first 'ranked' with suppress_eos")

    @property
    def num_blocks(self) -> int:
        """``L/b``, the number of blocks decoded left to right."""
        return self.gen_length // self.block_length

    @property
    def dream_rule(self) -> bool:
        """True when a step goes through :func:`maskrl.sampling.dream.dream_step` (Dream's schedule,
        one of Dream's algorithms, ``top_k``/``top_p`` or ``alg_temp``); False keeps LLaDA's rule."""
        if self.block_rule:
            return False
        return (self.schedule == "dream" or self.remasking in DREAM_REMASKING or self.top_k is not None
                or self.top_p < 1.0 or self.alg_temp > 0)

    def commits_per_step(self) -> list[int]:
        """Fixed schedule: tokens committed at each step of a block, ``k_j`` (docs/spec.md §1.2): the block's
        ``b`` masks split evenly over its ``steps/(L/b)`` steps, remainder to the earliest steps."""
        spb = self.steps // self.num_blocks
        base, rem = divmod(self.block_length, spb)
        return [base + (1 if j < rem else 0) for j in range(spb)]
