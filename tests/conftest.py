"""Shared fixtures: tiny models built in milliseconds, never downloaded."""
from __future__ import annotations

import contextlib
import os

import pytest
import torch

from maskrl.config import load_config
from maskrl.models import build_tiny
from maskrl.tasks.base import Task


#: torch threads per test: 1, or $MASKRL_TEST_THREADS (``make test``'s second, ``numerics`` pass)
TEST_THREADS = int(os.environ.get("MASKRL_TEST_THREADS", "1"))


#: the longest a test waits for the event it is about (a process's or thread's end): far above any real
#: duration on any machine, however loaded, so that only a hang reaches it ($MASKRL_TEST_WAIT_CAP_S)
WAIT_CAP_S = float(os.environ.get("MASKRL_TEST_WAIT_CAP_S", "3600"))


def wait_for(what: str, worker, cap_s: float = WAIT_CAP_S):
    """Wait until ``worker`` ends -- a ``threading.Thread``, ``multiprocessing.Process`` or
    ``subprocess.Popen`` -- and return its exit code (None for a thread). The wait is for the event,
    not for a time: ``cap_s`` only stops a hang, and then fails naming ``what`` was waited for."""
    if hasattr(worker, "poll"):  # subprocess.Popen
        try:
            return worker.wait(timeout=cap_s)
        except __import__("subprocess").TimeoutExpired as err:
            raise AssertionError(f"{what}: still running after {cap_s:.0f} s (a hang)") from err
    worker.join(cap_s)
    if worker.is_alive():
        raise AssertionError(f"{what}: still running after {cap_s:.0f} s (a hang)")
    return getattr(worker, "exitcode", None)


def roomy_limits(**over):
    """Sandbox limits (``maskrl.sandbox.Limits``) for programs that must finish: a CPU limit of 10 s per
    process (CPU time does not grow with the machine's load) stops a spinning program, and the wall
    clock of 300 s -- far above the well under a second a good program takes -- only a hang. ``over``
    replaces fields."""
    from maskrl.sandbox import Limits

    return Limits(**{"timeout_s": 300.0, "cpu_s": 10, **over})


def communicate_for(what: str, proc, cap_s: float = WAIT_CAP_S) -> tuple:
    """``proc.communicate()`` (a ``subprocess.Popen`` with pipes) until it ends: ``(stdout, stderr)``;
    ``cap_s`` only stops a hang, and then fails naming ``what`` was waited for."""
    import subprocess

    try:
        return proc.communicate(timeout=cap_s)
    except subprocess.TimeoutExpired as err:
        raise AssertionError(f"{what}: still running after {cap_s:.0f} s (a hang)") from err


def benchmark_script(rel: str, name: str | None = None):
    """The module of ``benchmarks/<rel>`` (a script, not a package), loaded once and kept in ``sys.modules``
    under ``name`` (default: the file's stem), so tests reuse a recorder's models and rules."""
    import importlib.util
    import sys
    from pathlib import Path

    name = name or Path(rel).stem
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "benchmarks" / rel
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def cli_sets(*overrides: str) -> list[str]:
    """``--set`` arguments for the CLI: ``cli_sets("a=1", "b=2")`` -> ``["--set", "a=1", "--set", "b=2"]``."""
    return [arg for o in overrides for arg in ("--set", o)]


#: the CLI tests' model: 1 layer, 32 wide (seconds to train on a CPU)
TINY_MODEL = ("model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
              "model.tiny.intermediate_size=64")
#: the tiny model on 64 training rows, evaluated on 8
TINY_CLI = cli_sets(*TINY_MODEL, "task.train_size=64", "task.eval_limit=8")
#: a two-step RL run of 2 prompts x 2 completions, 4 denoising steps in blocks of 8
TINY_RL = ("train.prompts_per_step=2", "train.group_size=2", "train.inner_iterations=1", "rollout.steps=4",
           "rollout.block_length=8")


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(TEST_THREADS)
    yield


def _registries():
    from maskrl.credit import CREDITS
    from maskrl.likelihood import LIKELIHOODS
    from maskrl.models.families import FAMILIES
    from maskrl.objectives import OBJECTIVES
    from maskrl.tasks import TASKS

    return (CREDITS, LIKELIHOODS, OBJECTIVES, TASKS, FAMILIES)


@contextlib.contextmanager
def registrations_undone():
    """Undo what the block registered from outside ``maskrl`` (its plug-ins, ``plugins:`` / ``--plugin``, or
    classes of its own), so test order does not matter: afterwards, every registry entry it added
    whose module is not ``maskrl``'s is unregistered, and each module of those the block imported is
    dropped from ``sys.modules`` with every plug-in file it loaded (so the next ``load_plugins`` of it
    imports, and registers, afresh). Built-in entries registered by a lazy import of a ``maskrl``
    module stay, as their module stays imported."""
    import sys

    registries = _registries()
    before = [set(r.names()) for r in registries]
    modules = set(sys.modules)
    try:
        yield
    finally:
        _undo(registries, before, modules)


def _undo(registries, before: list[set[str]], modules: set[str]) -> None:
    """Unregister the entries of ``registries`` not in ``before`` whose module is not maskrl's; drop
    those modules, and plug-in files, not in ``modules`` from ``sys.modules``."""
    import sys

    def ours(module: str) -> bool:
        return module == "maskrl" or module.startswith("maskrl.")

    owners = set()
    for registry, names in zip(registries, before):
        for name in set(registry.names()) - names:
            module = getattr(registry.get(name), "__module__", None) or ""
            if not ours(module):
                registry.unregister(name)
                owners.add(module)
    new = set(sys.modules) - modules
    for name in new & owners | {m for m in new if m.startswith("maskrl_plugin_")}:  # load_plugins' file names
        del sys.modules[name]


@pytest.fixture(autouse=True)
def _plugin_registrations():
    """Every test runs in :func:`registrations_undone`: no test sees another's plug-ins."""
    with registrations_undone():
        yield


def fresh_tiny():
    """A randomly initialised tiny bidirectional Llama (fp32, eval mode, seed 0)."""
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    a.model.eval()
    return a


@pytest.fixture
def tiny():
    """:func:`fresh_tiny` as a fixture."""
    return fresh_tiny()


class OddChars(Task):
    """Toy task: reward = fraction of the completion's characters with an odd code point (varies a lot
    across random samples, so advantages are non-zero)."""

    name = "odd_chars"

    def reward(self, prompts, completions, **_):
        return [sum(ord(ch) % 2 for ch in c) / max(1, len(c)) for c in completions]


def small_cfg(tmp_path, **over):
    """A trainer config for the tiny model: L = 8 in blocks of 4, 2 prompts x 3, mu = 2; ``over``
    adds ``key=value`` overrides."""
    sets = [f"output_dir={tmp_path}", "rollout.gen_length=8", "rollout.block_length=4", "rollout.steps=4",
            "rollout.temperature=1.0", "train.prompts_per_step=2", "train.group_size=3",
            "train.inner_iterations=2", "train.lr=1e-3", "likelihood.p_mask_prompt=0.5"]
    sets += [f"{k}={v}" for k, v in over.items()]
    return load_config([], sets)


def tiny_dream(scale: float = 1.0, max_positions: int = 256, mask_logit: float | None = None):
    """A tiny Dream-style model (Qwen2 class, 4-D all-attend mask, logits shifted by one), seed 1, fp32,
    eval mode; ``scale`` multiplies the output layer (sharper distributions). ``max_positions`` sets
    RoPE's limit only: the weights are the same for every value. ``mask_logit``: the ``[M]`` id's logit
    is this constant (its output row zeroed, the output layer given a bias that is 0 except there), as a
    trained Dream's ``[M]`` logit lies far below the top one; ``None``: the random row."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from maskrl.models.adapter import ModelAdapter
    from maskrl.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=max_positions,
                      use_sliding_window=False, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = Qwen2ForCausalLM(cfg).eval()
    if scale != 1.0:
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(scale)
    if mask_logit is not None:
        head = model.get_output_embeddings()
        biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
        with torch.no_grad():
            biased.weight.copy_(head.weight)
            biased.weight[tok.mask_token_id] = 0.0
            biased.bias.zero_()
            biased.bias[tok.mask_token_id] = mask_logit
        model.lm_head = biased.eval()
    return ModelAdapter(model=model, mask_id=tok.mask_token_id, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                        shift=True, family="dream", tokenizer=tok)


def sharp_tiny():
    """The tiny model with a 40x output layer: confident enough that the threshold schedule commits
    several tokens in some steps, so rows take different numbers of steps."""
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    with torch.no_grad():
        a.model.get_output_embeddings().weight.mul_(40.0)
    a.model.eval()
    return a


def write_sudoku_csv(path, n: int, seed: int):
    """A d1-format Sudoku file (``Puzzle,Solution``) of ``n`` generated puzzles at ``path``; returns ``path``."""
    import csv

    from maskrl.tasks import get_task

    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["Puzzle", "Solution"])
        for ex in get_task("sudoku4x4").generate(n, seed=seed):
            w.writerow([ex.fields["puzzle"], ex.fields["solution"]])
    return path


def assert_batch_equals_single(adapter, prompts, cfg, batch=None, commit_prob_tol=None):
    """Invariance: each prompt sampled alone (``maskrl.sampling.generate``, greedy ``cfg``) gives the
    completion, commit steps and step count it gets in the batch of all ``prompts`` (``batch``: that
    batch's rollout, else sampled here). ``commit_prob_tol``: ``(rtol, atol)`` to compare the committed
    probabilities too. Returns the batch rollout."""
    import torch

    from maskrl.sampling import generate
    from maskrl.text import encode_prompts

    if batch is None:
        batch = generate(adapter, *encode_prompts(adapter.tokenizer, prompts), cfg)
    for i, prompt in enumerate(prompts):
        one = generate(adapter, *encode_prompts(adapter.tokenizer, [prompt]), cfg)
        assert torch.equal(one.completion_ids[0], batch.completion_ids[i]), f"row {i} ({prompt!r}): completion"
        assert torch.equal(one.commit_step[0], batch.commit_step[i]), f"row {i} ({prompt!r}): commit steps"
        assert one.num_steps[0] == batch.num_steps[i], f"row {i} ({prompt!r}): steps"
        if commit_prob_tol is not None:
            torch.testing.assert_close(one.commit_prob[0], batch.commit_prob[i], rtol=commit_prob_tol[0],
                                       atol=commit_prob_tol[1])
    return batch


def keyed_gumbel_max(logits: torch.Tensor, temperature: float, generator=None) -> torch.Tensor:
    """Gumbel-max whose float64 noise of each ``[V]`` row of ``logits [..., V]`` is seeded by the row's
    own bytes, not drawn from ``generator`` (which it leaves untouched): a position gets the same
    candidate however many other positions are drawn with it, and in whichever order. With it in
    place of :func:`maskrl.sampling.commit.gumbel_max`, a sampler that draws only the still-masked
    positions and one that draws the whole block decode alike exactly when no path reads a candidate
    at a position it did not draw. ``[...]`` long; ``temperature == 0``: the argmax."""
    import hashlib

    if temperature == 0:
        return logits.argmax(-1)
    flat = logits.detach().reshape(-1, logits.shape[-1]).contiguous()
    noise = torch.empty(flat.shape, dtype=torch.float64)
    for r in range(flat.shape[0]):
        seed = int.from_bytes(hashlib.blake2b(flat[r].cpu().numpy().tobytes(), digest_size=7).digest(), "little")
        noise[r] = torch.rand(flat.shape[1], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    g = -torch.log(-torch.log(noise)).to(flat.device)
    return (flat.double() / temperature + g).argmax(-1).view(logits.shape[:-1])
