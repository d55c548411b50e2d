"""lm-evaluation-harness model ``maskrl``: any maskrl-loadable masked diffusion LM on lm-eval's tasks.

Importing this module registers the model with lm-eval's public API (``lm_eval.api.registry
.register_model``); then::

    import lm_eval, maskrl.lm_eval_model
    lm_eval.simple_evaluate(model="maskrl", model_args="pretrained=runs/demo/model,gen_length=64", tasks=[...])

or from the shell ``python -m maskrl.lm_eval_model run --model maskrl --model_args pretrained=DIR --tasks ...``
(lm-eval's own command line, ``run`` sub-command, with this model registered). Install with ``pip install 'maskrl[eval]'``.

``generate_until``
    The one sampler (:func:`maskrl.sampling.generate` through :func:`maskrl.evaluate.complete`, the
    code ``maskrl eval`` runs): every sampler setting is a ``model_args`` key -- ``gen_length``,
    ``steps``, ``block_length``, ``schedule``, ``threshold``, ``cache``, ``temperature``,
    ``remasking`` -- whose default is the model folder's prompt card (``maskrl_prompt.json``: the
    evaluation sampler of its training run), else :class:`~maskrl.sampling.SamplerConfig`'s defaults
    with ``gen_length`` 256 / ``block_length`` 32 / ``steps`` ``gen_length // 2``. A task's
    ``generation_kwargs`` other than ``until`` do not change the sampler (a warning names them once; they describe an
    autoregressive decoder); ``until`` stop strings are honoured by cutting the completion at the
    first one. Requests run in their order in batches of ``batch_size`` (as ``maskrl eval`` does, so
    greedy completions are the same). A context that tokenises to no tokens (an empty context on a
    tokenizer without bos, Qwen2 / Dream style; with bos it is ``[bos]`` already) is generated after
    the prefix token (``prefix_token_id``, as an empty ``loglikelihood`` context below), so the
    completion is the model's unconditional text rather than an error.
``chat_template``
    An explicit argument (``true`` / ``false``); default: the prompt card's ``chat_template``, else
    whether the tokenizer has a chat template -- never inferred from the model path. When true, each
    context goes through :func:`maskrl.models.chat_prompt` (the tokenizer's template, one user turn).
    With lm-eval's own ``--apply_chat_template`` the template is applied once, by lm-eval: lm-eval
    announces that route through the model's public interface before it builds any request (it reads
    :attr:`~MaskrlLM.tokenizer_name`, calls :meth:`~MaskrlLM.chat_template` and
    :meth:`~MaskrlLM.apply_chat_template`), and from then on contexts reach the model as they are
    (:attr:`~MaskrlLM.harness_templates`; a warning says so when ``chat_template=true`` was given).
``loglikelihood``
    ``log p(continuation | context)`` as a Monte Carlo ELBO (docs/spec.md §1.4 ``elbo``; the convention of
    LLaDA's own lm-eval adapter) through :func:`maskrl.likelihood.elbo.elbo`: ``elbo_nodes``
    Gauss-Legendre nodes × ``elbo_draws`` masks per node (model args; defaults 4 × 8), masks drawn
    from a generator seeded with ``seed`` and the request's own tokens (:func:`request_seed`), each
    request scored on its own: a request's number depends on the request, the model and the model
    args alone, not on the other requests, their order, ``--limit``, the batch or the process.
    ``is_greedy``: every continuation token is the argmax at its position when the whole
    continuation is masked (one forward). Tokens are split as lm-eval's own models split them
    (:meth:`~MaskrlLM.encode_pair`): the context's trailing whitespace moves into the continuation
    and the continuation is what the whole text tokenises to after the context's tokens, so
    ``("... is ", "Paris")`` scores ``' Paris'`` as one word, as ``("... is", " Paris")`` does; an empty
    context is the prefix token (``prefix_token_id``: bos, else eos, as lm-eval's ``hf`` model).
``loglikelihood_rolling``
    Not defined for a masked diffusion LM (no left-to-right factorisation of a whole text);
    raises ``NotImplementedError`` saying so.
Multi-process
    ``accelerate launch -m maskrl.lm_eval_model run --model maskrl ...`` (lm-eval's own ``-m lm_eval``
    does not import maskrl, so the model would not be registered): each process loads the model on its device and lm-eval splits the requests by ``rank`` /
    ``world_size``; gathering uses accelerate (as lm-eval's ``hf`` model does).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from typing import Any

import torch

try:
    import lm_eval.models  # noqa: F401  (lm-eval's own models first: its registry fills itself only when empty)
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError as e:  # pragma: no cover - the optional extra is missing
    raise ImportError("maskrl.lm_eval_model needs lm-evaluation-harness: pip install 'maskrl[eval]'") from e

#: sampler settings that are ``model_args`` keys (docs/spec.md §1.2)
SAMPLER_ARGS = ("gen_length", "steps", "block_length", "schedule", "threshold", "cache", "temperature", "remasking")


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"model_args {name}={value!r}: expected true or false")


def merge_model_args(model_args: dict[str, Any], additional_config: dict[str, Any] | None) -> dict[str, Any]:
    """The constructor's keyword arguments from the user's ``model_args`` and the values lm-eval passes
    every model itself (``additional_config``: its ``--batch_size`` -- default 1 --, ``--max_batch_size``,
    ``--device``; ``None`` values are not passed, as lm-eval's own rule). A key in both is taken from
    ``model_args`` (what the user wrote for this model), with a warning naming both values when they
    differ; lm-eval's ``LM.create_from_arg_string`` passed both and the constructor failed with
    "got multiple values for keyword argument".

    Returns:
        A new dict: ``model_args`` plus the keys of ``additional_config`` it lacks.
    """
    merged = dict(model_args)
    for key, value in (additional_config or {}).items():
        if value is None:
            continue
        if key not in merged:
            merged[key] = value
        elif str(merged[key]) != str(value):
            warnings.warn(f"maskrl lm-eval model: {key} is both in model_args ({merged[key]!r}) and given to lm-eval "
                          f"({value!r}, e.g. --{key}; lm-eval's --batch_size defaults to 1): using model_args' "
                          f"{merged[key]!r}")
    return merged


def request_seed(seed: int, context_ids: list[int], continuation_ids: list[int]) -> int:
    """The ELBO masks' seed of one ``loglikelihood`` request: the first 63 bits of the SHA-256 of
    ``[seed, context ids, continuation ids]`` (as JSON). It depends on the request's tokens and the
    ``seed`` model arg only, the same in every process, session and Python (no ``hash()``)."""
    text = json.dumps([int(seed), [int(t) for t in context_ids], [int(t) for t in continuation_ids]])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") & (2 ** 63 - 1)


def cut_at_stops(text: str, stops: list[str]) -> str:
    """``text`` up to the first occurrence of any stop string (empty strings ignored)."""
    cut = len(text)
    for s in stops:
        if s:
            i = text.find(s)
            if i != -1:
                cut = min(cut, i)
    return text[:cut]


@register_model("maskrl")
class MaskrlLM(LM):
    """A masked diffusion LM behind lm-eval's ``LM`` interface (module docstring).

    Args:
        pretrained: a model folder or Hub id for :func:`maskrl.models.load` (required), or a training
            run folder: its exported ``model/`` (:func:`maskrl.rundir.run_model_folder`; a run that has
            not exported one is a ``FileNotFoundError`` saying so).
        gen_length, steps, block_length, schedule, threshold, cache, temperature, remasking: the
            sampler (:class:`~maskrl.sampling.SamplerConfig`); default: the prompt card's evaluation
            sampler. ``steps`` 0 or absent without a card: ``gen_length // 2``.
        chat_template: apply the tokenizer's chat template to each context (default: prompt card,
            else whether the tokenizer has one).
        batch_size: requests per sampler batch (``"auto"`` is taken as 16); lm-eval's ``--batch_size N``
            or a ``model_args`` key (which wins when both are given, :func:`merge_model_args`).
        max_batch_size: passed by lm-eval's command line to every model; not used (no ``auto`` search).
        elbo_nodes, elbo_draws: Gauss-Legendre nodes and masks per node of the ELBO.
        prefix_token_id: the token an empty context is scored (``loglikelihood``) or generated
            (``generate_until``) after (default: the tokenizer's bos, else its eos, else the model's
            eos id).
        seed: seeds sampled generation (``temperature > 0``) and the ELBO masks.
        dtype, device: where and how the weights are loaded (``device`` default: accelerate's device;
            a CUDA device on a machine without one -- lm-eval's command-line default -- falls back to
            it with a warning).

    Raises:
        ValueError: a bad argument (named), or a model without a tokenizer.
    """

    def __init__(self, pretrained: str, gen_length: int | None = None, steps: int | None = None,
                 block_length: int | None = None, schedule: str | None = None, threshold: float | None = None,
                 cache: str | None = None, temperature: float | None = None, remasking: str | None = None,
                 chat_template: Any = None, batch_size: Any = 16, elbo_nodes: int = 4, elbo_draws: int = 8,
                 seed: int = 0, dtype: str = "float32", device: str | None = None, max_batch_size: Any = None,
                 prefix_token_id: Any = None, **unknown: Any) -> None:
        super().__init__()
        if unknown:
            raise ValueError(f"model_args: unknown key(s) {', '.join(sorted(unknown))}; valid: pretrained, "
                             f"{', '.join(SAMPLER_ARGS)}, chat_template, batch_size, elbo_nodes, elbo_draws, seed, "
                             "dtype, device, prefix_token_id")
        from accelerate import Accelerator

        from maskrl.models import load
        from maskrl.models.loading import parse_dtype
        from maskrl.prompt_card import read_prompt_card
        from maskrl.rundir import run_model_folder
        from maskrl.sampling import SamplerConfig

        pretrained = run_model_folder(pretrained, "model_args pretrained")
        card = read_prompt_card(pretrained)
        given = dict(gen_length=gen_length, steps=steps, block_length=block_length, schedule=schedule,
                     threshold=threshold, cache=cache, temperature=temperature, remasking=remasking)
        from maskrl.models.families import model_block_size, model_decode_rule

        block = model_block_size(pretrained)  # a block model decodes the block way (docs/sampler.md)
        default = ({"gen_length": 256, "block_length": 32} if block is None else
                   {"gen_length": 256, "block_length": block, **model_decode_rule(pretrained)})
        base = dict(card["eval_sampler"]) if card else default
        other_length = gen_length is not None and int(gen_length) != base.get("gen_length")
        if other_length and steps is None:
            base.pop("steps", None)  # a card's steps belong to its gen_length: gen_length // 2 instead
        casts = {"gen_length": int, "steps": int, "block_length": int, "threshold": float, "temperature": float,
                 "schedule": str, "cache": str, "remasking": str}
        settings = {k: v for k, v in base.items() if k in {f.name for f in dataclasses.fields(SamplerConfig)}}
        for k, v in given.items():
            if v is not None:
                try:
                    settings[k] = casts[k](v)
                except (TypeError, ValueError):
                    raise ValueError(f"model_args {k}={v!r}: expected {casts[k].__name__}") from None
        if not settings.get("steps"):  # L/2; a block model: L, one token a step (SDAR's steps per block = b)
            settings["steps"] = max(1, settings["gen_length"] // (1 if block else 2))
        try:
            self.sampler = SamplerConfig(**settings)
        except (TypeError, ValueError) as e:
            raise ValueError(f"model_args ({', '.join(SAMPLER_ARGS)}): {e}") from None
        self.batch_size = 16 if str(batch_size).startswith("auto") else int(batch_size)
        if self.batch_size < 1:
            raise ValueError(f"model_args batch_size={batch_size!r}: must be >= 1")
        self.elbo_nodes, self.elbo_draws, self.seed = int(elbo_nodes), int(elbo_draws), int(seed)
        if self.elbo_nodes < 1 or self.elbo_draws < 1:
            raise ValueError(f"model_args elbo_nodes={elbo_nodes}, elbo_draws={elbo_draws}: must be >= 1")

        acc = Accelerator()
        if acc.num_processes > 1:  # lm-eval splits requests by rank; gathering goes through accelerate
            self.accelerator = acc
            self._rank, self._world_size = acc.process_index, acc.num_processes
        if device and str(device).startswith("cuda") and not torch.cuda.is_available():
            # lm-eval's command line passes --device cuda by default, also on machines without one
            warnings.warn(f"maskrl lm-eval model: device {device!r} unavailable; using {acc.device}")
            device = None
        self._device = torch.device(device) if device else acc.device
        self.adapter = load(pretrained, dtype=parse_dtype(dtype), device=self._device)
        if self.adapter.tokenizer is None:
            raise ValueError(f"model {pretrained!r} has no tokenizer files")
        self.adapter.model.eval()
        has_template = bool(getattr(self.adapter.tokenizer, "chat_template", None))
        self._explicit_template = chat_template is not None and _bool("chat_template", chat_template)
        if chat_template is None:
            self.use_chat_template = bool(card["chat_template"]) if card else has_template
        else:
            self.use_chat_template = _bool("chat_template", chat_template)
        self.harness_templates = False  # set once lm-eval says it applies the chat template itself
        self._custom_prefix = None if prefix_token_id is None else int(prefix_token_id)
        self.pretrained = str(pretrained)
        self._warned: set[str] = set()  # generation_kwargs keys already reported as unused

    # ------------------------------------------------------------------ lm-eval plumbing
    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "MaskrlLM":
        """lm-eval's constructor from ``--model_args`` text (``"pretrained=DIR,batch_size=8"``) and the values
        lm-eval passes every model itself (``additional_config``: ``batch_size``, ``max_batch_size``,
        ``device``; :func:`merge_model_args`)."""
        from lm_eval.utils import simple_parse_args_string

        return cls(**merge_model_args(simple_parse_args_string(arg_string), additional_config))

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> "MaskrlLM":
        """:meth:`create_from_arg_string` for ``model_args`` given as a dict (``simple_evaluate``)."""
        return cls(**merge_model_args(dict(arg_dict), additional_config))

    def _harness_applies_template(self) -> None:
        """lm-eval templates the contexts itself (``--apply_chat_template``): apply no second template."""
        if not self.harness_templates and self.use_chat_template and self._explicit_template:
            warnings.warn("maskrl lm-eval model: lm-eval applies the chat template (--apply_chat_template), so "
                          "model_args chat_template=true adds none of its own (the template is applied once)")
        self.harness_templates = True

    @property
    def tokenizer_name(self) -> str:
        """Fingerprint of the tokenizer for lm-eval's request cache. lm-eval reads it only when it applies
        the chat template itself (``--apply_chat_template``), also when the requests come from its
        cache, so reading it switches maskrl's own template off (:attr:`harness_templates`)."""
        self._harness_applies_template()
        return str(getattr(self.adapter.tokenizer, "name_or_path", "") or self.pretrained).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The tokenizer's chat template, for lm-eval's records (``None`` when ``chat_template`` is false).

        lm-eval calls it with its ``--apply_chat_template`` value; a true value means lm-eval
        templates the contexts (:attr:`harness_templates`). A string names one template of a
        tokenizer holding several (a dict), as in lm-eval's ``hf`` model.

        Raises:
            ValueError: a template name the tokenizer does not have.
        """
        if not chat_template:
            return None
        self._harness_applies_template()
        template = getattr(self.adapter.tokenizer, "chat_template", None)
        if isinstance(template, dict):
            name = chat_template if isinstance(chat_template, str) else "default"
            if name not in template:
                raise ValueError(f"chat template {name!r} not in the tokenizer's templates {sorted(template)}")
            return template[name]
        return template

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """lm-eval's ``--apply_chat_template`` route: the tokenizer's template over the messages (an
        assistant prefill is continued when ``add_generation_prompt`` is false, as in lm-eval's ``hf``
        model). The contexts are then templated: maskrl adds no template of its own."""
        self._harness_applies_template()
        return self.adapter.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                          add_generation_prompt=add_generation_prompt,
                                                          continue_final_message=not add_generation_prompt)

    @property
    def prefix_token_id(self) -> int:
        """The token an empty context is scored and generated after: ``prefix_token_id`` if given, else the
        tokenizer's bos, else its eos, else the model's eos id (lm-eval's ``hf`` rule)."""
        if self._custom_prefix is not None:
            return self._custom_prefix
        tok = self.adapter.tokenizer
        for value in (getattr(tok, "bos_token_id", None), getattr(tok, "eos_token_id", None), self.adapter.eos_id):
            if value is not None:
                return int(value)
        raise ValueError("maskrl lm-eval model: no bos or eos id for an empty context; pass prefix_token_id")

    def _prefix_or_none(self) -> int | None:
        """:attr:`prefix_token_id`, or ``None`` for a model with no bos or eos id (a non-empty context
        that tokenises to nothing then raises in :func:`~maskrl.text.encode_prompts`)."""
        try:
            return self.prefix_token_id
        except ValueError:
            return None

    def all_gather(self, tensor):
        return tensor if self.world_size <= 1 else self.accelerator.gather(tensor)

    def gather_object(self, obj, dst=0):
        if self.world_size <= 1:
            return [obj]
        from accelerate.utils import gather_object

        everything = gather_object([obj])
        return everything if self.rank == dst else None

    def barrier(self) -> None:
        if self.world_size > 1:
            self.accelerator.wait_for_everyone()

    def model_input(self, context: str) -> str:
        """The text the model is given for an lm-eval context: the context through the tokenizer's
        chat template when ``chat_template`` is on and lm-eval has not templated it already
        (:attr:`harness_templates`), else the context itself.

        lm-eval's requests are read as lm-eval's own ``hf`` model reads them: special-token strings in
        contexts and continuations are parsed (a :class:`maskrl.text.ModelInput` that is all template
        text), where maskrl's own prompts keep them as text (:mod:`maskrl.text`)."""
        from maskrl.models import chat_prompt
        from maskrl.text import ModelInput

        if self.use_chat_template and not self.harness_templates:
            return ModelInput.template(chat_prompt(self.adapter.tokenizer, context))
        return ModelInput.template(context)

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Token ids ``(context, continuation)`` of a ``loglikelihood`` request, split as lm-eval's own
        models split them.

        On the model input text (:meth:`model_input`): trailing whitespace of the context is moved to
        the front of the continuation; the context's ids are its prompt ids
        (:func:`maskrl.text.prompt_token_ids`: bos first when the tokenizer has one) and the
        continuation's are the whole text's ids after them -- so a word keeps its leading-space token
        (``'ĠParis'``, not ``'Ġ' + 'Paris'``). When the whole text's ids do not start with the context's
        (a token across the boundary), the continuation is tokenised on its own. An empty context
        (also one of whitespace only) is ``[prefix_token_id]``; if the continuation itself starts with
        that token, its first token is the context instead (lm-eval's rule).

        Returns:
            ``(context ids, continuation ids)``, lists of ints; the continuation may be empty only if
            the request's continuation is (``loglikelihood`` refuses that).
        """
        from maskrl.text import prompt_token_ids

        from maskrl.text import ModelInput

        tok = self.adapter.tokenizer
        text, continuation = self.model_input(context), ModelInput.template(continuation)  # lm-eval's reading
        spaces = len(text) - len(text.rstrip())
        if spaces:
            text, continuation = text[:-spaces], text[-spaces:] + continuation
        if not text:
            cont = tok(continuation, add_special_tokens=False)["input_ids"]
            prefix = self.prefix_token_id
            return (cont[:1], cont[1:]) if cont and cont[0] == prefix else ([prefix], cont)
        ctx = prompt_token_ids(tok, text)
        whole = prompt_token_ids(tok, text + continuation)
        if ctx and whole[:len(ctx)] == ctx:
            return ctx, whole[len(ctx):]
        return ctx or [self.prefix_token_id], tok(continuation, add_special_tokens=False)["input_ids"]

    # ------------------------------------------------------------------ requests
    def generate_until(self, requests) -> list[str]:
        """One completion per ``(context, gen_kwargs)`` request through the one sampler, cut at ``until``;
        a context with no tokens is generated after :attr:`prefix_token_id`."""
        from maskrl.evaluate import complete

        out: list[str] = []
        gen = None
        if self.sampler.temperature > 0:
            gen = torch.Generator(device=self.adapter.device).manual_seed(self.seed)
        for s in range(0, len(requests), self.batch_size):
            batch = requests[s:s + self.batch_size]
            contexts = [self.model_input(r.args[0]) for r in batch]
            empty = self.prefix_token_id if any(not c for c in contexts) else self._prefix_or_none()
            texts = complete(self.adapter, contexts, self.sampler, batch_size=len(batch), generator=gen,
                             empty_id=empty)
            for r, text in zip(batch, texts):
                kwargs = r.args[1] if len(r.args) > 1 and isinstance(r.args[1], dict) else {}
                ignored = sorted(set(kwargs) - {"until"} - self._warned)
                if ignored:  # an autoregressive decoder's settings: said once, never silently
                    warnings.warn(f"maskrl lm-eval model: generation_kwargs {', '.join(ignored)} are not used; the "
                                  f"sampler is set by model_args ({', '.join(SAMPLER_ARGS)}): {self.sampler}")
                    self._warned.update(ignored)
                until = kwargs.get("until") or []
                until = [until] if isinstance(until, str) else list(until)
                text = cut_at_stops(text, until)
                out.append(text)
                self.cache_hook.add_partial("generate_until", r.args, text)
        return out

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        """``(ELBO of continuation | context, is_greedy)`` per ``(context, continuation)`` request, each
        from the request alone (:meth:`score`): the other requests, their order, ``batch_size`` and
        lm-eval's split over processes do not change it.

        Raises:
            ValueError: a continuation with no tokens (its request index named), before any scoring.
        """
        encoded = []
        for i, r in enumerate(requests):
            ctx, cont = self.encode_pair(r.args[0], r.args[1])
            if not cont:
                raise ValueError(f"loglikelihood request {i}: the continuation {r.args[1]!r} has no tokens")
            encoded.append((ctx, cont))
        results = []
        for r, (ctx, cont) in zip(requests, encoded):
            result = self.score(ctx, cont)
            results.append(result)
            self.cache_hook.add_partial("loglikelihood", r.args, result)
        return results

    @torch.no_grad()
    def score(self, context_ids: list[int], continuation_ids: list[int]) -> tuple[float, bool]:
        """One request's ``(ELBO, is_greedy)`` from its token ids alone.

        The ELBO (:func:`maskrl.likelihood.elbo.elbo`, ``elbo_nodes`` × ``elbo_draws`` masks) draws its
        masks from a generator seeded with :func:`request_seed` of ``seed`` and the ids; ``is_greedy``:
        every continuation token is the argmax at its position when the whole continuation is masked
        (one forward of this request alone, no padding). On a block-diffusion model both are the block
        way: the ELBO through the doubled x_t ⊕ x_0 forward (:mod:`maskrl.likelihood.blocks`), and the
        argmax of each block with the block masked and the earlier blocks clean (one doubled forward,
        :func:`~maskrl.likelihood.blocks.block_logits`).

        Args:
            context_ids: ``P >= 1`` token ids (:meth:`encode_pair`).
            continuation_ids: ``L >= 1`` token ids.
        """
        from maskrl.likelihood.elbo import elbo
        from maskrl.types import Rollout

        a = self.adapter
        ids = torch.tensor([context_ids], dtype=torch.long, device=a.device)  # [1, P]
        comp = torch.tensor([continuation_ids], dtype=torch.long, device=a.device)  # [1, L]
        ro = Rollout(prompt_ids=ids, prompt_mask=torch.ones_like(ids, dtype=torch.bool), completion_ids=comp,
                     completion_mask=torch.ones_like(comp, dtype=torch.bool), commit_step=torch.zeros_like(comp),
                     commit_prob=torch.ones(comp.shape, device=a.device),
                     num_steps=torch.ones(1, dtype=torch.long, device=a.device),
                     group_ids=torch.zeros(1, dtype=torch.long, device=a.device))
        gen = torch.Generator(device=a.device).manual_seed(request_seed(self.seed, context_ids, continuation_ids))
        ll = float(elbo(a, ro, gen, nodes=self.elbo_nodes, draws=self.elbo_draws).sum())
        masked = torch.full_like(comp, a.mask_id)
        if a.block_size is not None:
            from maskrl.likelihood.blocks import block_logits

            greedy = block_logits(a, ids, ro.prompt_mask, masked, comp).argmax(-1).eq(comp).all()
            return ll, bool(greedy)
        x = torch.cat([ids, masked], dim=1)  # [1, P + L]
        greedy = a.logits(x, torch.ones_like(x, dtype=torch.bool))[:, ids.shape[1]:].argmax(-1).eq(comp).all()
        return ll, bool(greedy)

    def loglikelihood_rolling(self, requests) -> list[float]:
        raise NotImplementedError(
            "maskrl: loglikelihood_rolling (perplexity tasks such as wikitext) needs a left-to-right "
            "factorisation of a whole text, which a masked diffusion LM does not define; use generate_until "
            "or loglikelihood tasks (the latter are scored with a Monte Carlo ELBO)")


def main() -> None:  # pragma: no cover - lm-eval's own command line with this model registered
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":  # pragma: no cover
    main()
