"""Checks of recorded references that hold on every x86-64 CPU (the *twins* of the bit-exact pins).

A value recorded on one processor is reproduced bit for bit only under the same float kernels
(:mod:`maskrl.machine`). Elsewhere, the last bits of every logit differ, and a decision between two
candidates whose scores lie within that noise of each other (a *tie*) may go either way: the token,
or the ranking of two positions, flips, and every later step of that row follows the flip. So a
twin compares

- tokens where the row's decisions are clear of the dtype's noise. A row that differs from the
  recording is a tie when the machine at hand itself decodes it differently once its logits are
  perturbed by a few ulps of their dtype (:func:`logit_noise`, :func:`noise_sensitive`): the
  recorded row then lies within reach of float noise, and the twin reports it instead of failing.
  A row that differs and stays put under that noise is a real change, and fails;
- floats (probabilities, log-probabilities, metrics, weights) within tolerances that follow the
  dtype's ``eps`` and the quantity's scale (:func:`close`).

The sensitivity probe is the empirical form of "the top two candidates differ by less than the
dtype's noise": it makes no assumption about the decoding rule (confidence, margin, entropy,
Gumbel draws at any temperature, the threshold schedule), so it holds for every sampler the pins
cover, Dream's rules included.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterator

import torch

#: amplitude of the probe's logit noise in ulps of the logits' dtype, of the scale ``max(|z|, rms(row))``
#: of each logit z: above the last-bit differences of other kernels. Measured on the tests' tiny
#: models (logits of AVX-512 against the portable and the AVX2 kernels, 1 to 3 threads): float32 at
#: most 3.5 eps of the row's largest |logit| and 21 eps of a small logit's own size, bfloat16 2 ulps.
#: float32's 64 is larger still because the probe's noise is independent per logit, and a decision
#: on a sum over the vocabulary (Dream's entropy confidence) averages it down: at 16, a row of Dream's
#: block entropy setting that the portable kernels decode differently did not move in 8 probes; at 64 it did.
NOISE_ULPS = {torch.float32: 64, torch.float64: 64, torch.bfloat16: 2, torch.float16: 2}
#: independent noise draws per probe; a tie flips under each with probability about 1/2
PROBES = 8
#: at least this fraction of the recorded rows must be compared (not ties), or the twin proves
#: too little and fails
MIN_COMPARED = 0.75


@contextlib.contextmanager
def logit_noise(model: torch.nn.Module, seed: int) -> Iterator[None]:
    """Within the block, every output of ``model``'s output layer (``get_output_embeddings()``) is
    moved by ``a · max(|z|, rms) · u``, ``u ~ U(-1, 1)`` elementwise from a ``torch.Generator`` seeded
    ``seed``, ``a = NOISE_ULPS[dtype] · eps(dtype)``, ``rms`` the root mean square of the finite
    logits of z's row: the float noise of another processor's kernels, somewhat larger. Uses
    ``register_forward_hook`` (removed on exit)."""
    gen = torch.Generator().manual_seed(seed)

    def hook(_module, _inputs, out):
        z = out.double()
        a = NOISE_ULPS.get(out.dtype, 64) * torch.finfo(out.dtype).eps
        fin = z.isfinite()
        rms = (z.where(fin, 0.0).square().sum(-1, keepdim=True) / fin.sum(-1, keepdim=True).clamp(min=1)).sqrt()
        u = torch.rand(out.shape, generator=gen, dtype=torch.float64) * 2 - 1
        return (z + a * torch.maximum(z.abs(), rms) * u).to(out.dtype)

    handle = model.get_output_embeddings().register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def noise_sensitive(model: torch.nn.Module, run: Callable[[], torch.Tensor], clean: torch.Tensor,
                    rows: list[int]) -> set[int]:
    """Which of ``rows`` decode differently under :func:`logit_noise` (any of :data:`PROBES` seeds).

    Args:
        model: the module whose output layer is perturbed.
        run: decodes the setting again, returning ``[N, L]`` long tokens (or any ``[N, ...]`` tensor).
        clean: ``run()``'s unperturbed result.
        rows: the rows to probe (those that differ from the recording).

    Returns:
        The probed rows whose result moved under some probe: ties.
    """
    moved: set[int] = set()
    for seed in range(PROBES):
        with logit_noise(model, seed):
            got = run()
        moved |= {r for r in rows if not torch.equal(got[r], clean[r])}
        if moved == set(rows):
            break
    return moved


def differing_rows(got: torch.Tensor, want: torch.Tensor) -> list[int]:
    """Rows of ``got`` and ``want`` (``[N, ...]``, same shape) that are not equal."""
    if got.shape != want.shape:
        raise AssertionError(f"shape {tuple(got.shape)} != recorded {tuple(want.shape)}")
    return [r for r in range(got.shape[0]) if not torch.equal(got[r], want[r])]


def float_tol(dtype: torch.dtype, scale: float, ulps: float) -> float:
    """``ulps · eps(dtype) · max(scale, 1)``: a tolerance that follows the dtype and the quantity's scale."""
    return ulps * torch.finfo(dtype).eps * max(float(scale), 1.0)


def close(got: torch.Tensor, want: torch.Tensor, tol: float) -> torch.Tensor:
    """Elementwise ``|got - want| <= tol`` (NaN equal to NaN, an infinity to itself), as bool of their shape."""
    got, want = got.double(), want.double()
    return (got.isnan() & want.isnan()) | (got == want) | ((got - want).abs() <= tol)


class Tally:
    """Counts of a twin's rows: compared (equal to the recording), ties (reported), failures."""

    def __init__(self):
        self.compared = 0
        self.ties: list[str] = []
        self.failures: list[str] = []
        self.not_run: list[str] = []  # settings this machine's torch cannot run (reported, with the reason)

    @property
    def total(self) -> int:
        return self.compared + len(self.ties) + len(self.failures)

    def summary(self) -> str:
        return (f"{self.compared}/{self.total} rows compared, {len(self.ties)} ties reported"
                + (f": {', '.join(self.ties[:12])}{' ...' if len(self.ties) > 12 else ''}" if self.ties else "")
                + (f"; not run here: {'; '.join(self.not_run)}" if self.not_run else ""))

    def check(self) -> None:
        """Fail on any failure, or when fewer than :data:`MIN_COMPARED` of the rows were compared."""
        assert not self.failures, "; ".join(self.failures[:20])
        assert self.total and self.compared >= math.ceil(MIN_COMPARED * self.total), \
            f"too many ties to prove anything: {self.summary()}"
