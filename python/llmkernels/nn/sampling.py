"""Choosing the next token: transformers' logits processors in its order (repetition
penalty, temperature, top-k, top-p, min-p) and a seeded draw. The one sampler of every
generation loop."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np


def sample(
    logits: np.ndarray,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    rng: np.random.Generator,
    *,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    seen: np.ndarray | None = None,
) -> np.ndarray:
    """Next token per row of ``logits (B, vocab)``, with transformers' processors in its
    order: repetition penalty (on the raw logits, tokens marked in ``seen (B, vocab)``),
    then greedy argmax when ``temperature == 0``, else temperature, top-k, top-p, min-p and
    a draw from ``rng``. The one sampler of :meth:`Transformer.generate` and
    :func:`llmkernels.generate`.
    """
    z = np.asarray(logits, dtype=np.float64)
    if repetition_penalty is not None and repetition_penalty != 1.0 and seen is not None:
        z = np.where(seen, np.where(z < 0, z * repetition_penalty, z / repetition_penalty), z)
    if temperature == 0:
        return np.argmax(z, axis=-1).astype(np.int64)
    with np.errstate(over="ignore"):
        scaled = z / temperature
        if np.isinf(scaled[np.isfinite(z)]).any():
            # a tiny temperature: logits / t overflow (inf - inf is NaN below); scaled from the
            # max instead, every logit but the max's goes to -inf (probability 0)
            scaled = (z - z.max(axis=-1, keepdims=True)) / temperature
    z = scaled
    if top_k is not None and top_k < z.shape[-1]:
        kth = np.partition(z, -top_k, axis=-1)[:, -top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    z = z - z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=-1)
        keep_sorted = np.cumsum(sorted_p, axis=-1) - sorted_p < top_p  # always keeps the top one
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    if min_p is not None and min_p > 0:
        p = np.where(p >= min_p * p.max(axis=-1, keepdims=True), p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    return np.array([rng.choice(p.shape[-1], p=row) for row in p], dtype=np.int64)


class Sampler:
    """Sampling state of one generation: parameters, generator and the tokens seen so far
    (for the repetition penalty)."""

    def __init__(self, params: Sampling, batch: int, vocab: int) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        penalty = params.repetition_penalty
        self.seen = (
            np.zeros((batch, vocab), bool) if penalty is not None and penalty != 1.0 else None
        )

    def see(self, ids: np.ndarray, mask: Any = None) -> None:
        """Mark the tokens of ``ids (B, T)`` (real ones only when ``mask``) as seen."""
        if self.seen is None:
            return
        ids = np.asarray(ids, dtype=np.int64)
        rows = np.broadcast_to(np.arange(ids.shape[0])[:, None], ids.shape)
        if mask is not None:
            real = np.asarray(mask) != 0
            ids, rows = ids[real], rows[real]
        self.seen[rows, ids] = True

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        q = self.params
        nxt = sample(
            logits,
            q.temperature,
            q.top_k,
            q.top_p,
            self.rng,
            min_p=q.min_p,
            repetition_penalty=q.repetition_penalty,
            seen=self.seen,
        )
        self.see(nxt[:, None])
        return nxt


class Sampling:
    """Validated sampling parameters (errors read ``"[<fn>] <argument> ..."``)."""

    def __init__(
        self,
        temperature: float,
        top_k: int | None,
        top_p: float | None,
        min_p: float | None,
        repetition_penalty: float | None,
        seed: int | None,
    ) -> None:
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.min_p, self.repetition_penalty, self.seed = min_p, repetition_penalty, seed

    @classmethod
    def checked(
        cls,
        fn: str,
        temperature: Any,
        top_k: Any,
        top_p: Any,
        min_p: Any,
        repetition_penalty: Any,
        seed: Any,
    ) -> Sampling:
        t = check_real(fn, "temperature", temperature)
        if not (math.isfinite(t) and t >= 0):
            raise ValueError(f"[{fn}] temperature must be a finite number >= 0, got {t}")
        k = None
        if top_k is not None:
            if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1:
                raise ValueError(f"[{fn}] top_k must be an int >= 1 or None, got {top_k!r}")
            k = int(top_k)
        p = None
        if top_p is not None:
            p = check_real(fn, "top_p", top_p)
            if not 0 < p <= 1:  # NaN fails too
                raise ValueError(f"[{fn}] top_p must be in (0, 1], got {p}")
        m = None
        if min_p is not None:
            m = check_real(fn, "min_p", min_p)
            if not 0 <= m <= 1:
                raise ValueError(f"[{fn}] min_p must be in [0, 1], got {m}")
        r = None
        if repetition_penalty is not None:
            r = check_real(fn, "repetition_penalty", repetition_penalty)
            if not (math.isfinite(r) and r > 0):
                raise ValueError(f"[{fn}] repetition_penalty must be a finite number > 0, got {r}")
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0
        ):
            raise ValueError(f"[{fn}] seed must be an int >= 0 or None, got {seed!r}")
        return cls(t, k, p, m, r, None if seed is None else int(seed))

    def sampler(self, batch: int, vocab: int) -> Sampler:
        return Sampler(self, batch, vocab)


def check_real(fn: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"[{fn}] {name} must be a number, got {value!r}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"[{fn}] {name} is out of range, got {str(value)[:40]}") from None
