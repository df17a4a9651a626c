"""Token positions and key masks of a forward (from a cache's next positions or given), and
the RoPE frequency schedule a layer applies at them (dynamic NTK kept per schedule)."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .._rope_scaling import rope_inv_freq

if TYPE_CHECKING:
    from .cache import KVCache, ModelCache


# RoPE schedules with state (dynamic NTK), whose lock another thread of the parent may hold at
# the fork: in the child a new lock and the state it guarded (perhaps half updated) reset
LIVE_SCHEDULES: weakref.WeakSet[Any] = weakref.WeakSet()


# Positions are bounded so that a cache's next position (max + 1) never wraps int64.
MAX_POSITION = 2**62


@functools.lru_cache(maxsize=64)
def default_positions(batch: int, seq: int) -> np.ndarray:
    pos = np.ascontiguousarray(np.broadcast_to(np.arange(seq, dtype=np.int64), (batch, seq)))
    pos.flags.writeable = False
    return pos


def positions_and_mask(
    cls: str, batch: int, seq: int, positions: Any, mask: Any, cache: KVCache | ModelCache | None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(B, T) int64 positions, (B, T) uint8 key mask or None, and the next positions for the
    cache. Default positions: the cache's next position per sequence + the count of real tokens
    before each one (HF's cumsum(attention_mask) - 1 convention for padded batches)."""
    if mask is None and positions is None and cache is None:
        # the stateless forward: arange(T) per sequence, shared read-only between calls
        return default_positions(batch, seq), None, None
    key_mask = None
    if mask is not None:
        m = np.asarray(mask)
        if m.shape != (batch, seq):
            raise ValueError(f"[{cls}] mask must have shape (B, T) = {(batch, seq)}, got {m.shape}")
        if m.dtype.kind not in "biu":
            raise TypeError(f"[{cls}] mask must be boolean or 0/1 integers, got dtype {m.dtype}")
        key_mask = np.ascontiguousarray(m != 0, dtype=np.uint8)
    start = cache.next_positions if cache is not None else np.zeros(batch, np.int64)
    if positions is None:
        if key_mask is None:
            pos = start[:, None] + np.arange(seq, dtype=np.int64)[None, :]
        else:
            pos = start[:, None] + np.maximum(np.cumsum(key_mask, axis=1, dtype=np.int64) - 1, 0)
    else:
        p = np.asarray(positions)
        if p.dtype.kind not in "iu":
            raise TypeError(f"[{cls}] positions must be integers, got dtype {p.dtype}")
        try:
            pos = np.broadcast_to(p, (batch, seq))
        except ValueError:
            raise ValueError(
                f"[{cls}] positions must have shape (T,) or (B, T) = {(batch, seq)}, got {p.shape}"
            ) from None
        # by value, before any cast: uint64 2**64-1 must not become -1
        if pos.size and pos.min() < 0:
            raise ValueError(f"[{cls}] positions must be >= 0")
        if pos.size and pos.max() > MAX_POSITION:
            raise ValueError(f"[{cls}] positions must be <= 2**62, got {pos.max()}")
    pos = np.ascontiguousarray(pos, dtype=np.int64)
    if positions is None and pos.size and pos.max() > MAX_POSITION:
        raise ValueError(f"[{cls}] the cache's positions would pass 2**62")
    if key_mask is None:
        nxt = pos[:, -1] + 1 if seq else start.copy()
    else:
        counts = key_mask.sum(axis=1, dtype=np.int64)
        nxt = (
            start + counts
            if positions is None
            else np.where(counts > 0, pos.max(axis=1) + 1, start)
        )
    return pos, key_mask, nxt


class RopeSchedule:
    """RoPE frequencies per call, for the scaling types whose frequencies depend on the sequence
    length, as HF's rotary embedding computes them:

    * ``dynamic`` (NTK): with ``seq_len = max(position) + 1``, frequencies grow to that length when
      it exceeds what was seen so far, and reset when it drops below the pre-training length
      (HF's ``dynamic_rope_update``, stateful).
    * ``longrope``: long factors when ``seq_len`` exceeds ``original_max_position_embeddings``.

    Other types are static: ``frequencies()`` returns ``None`` (use the module's own).
    """

    def __init__(self, head_dim: int, theta: float, scaling: Mapping[str, Any] | None) -> None:
        self.head_dim, self.theta = head_dim, theta
        self.scaling = dict(scaling) if scaling else None
        kind = (self.scaling or {}).get("rope_type", (self.scaling or {}).get("type", "default"))
        self.kind = kind if kind in ("dynamic", "longrope") else "static"
        if self.kind == "dynamic":
            sc = self.scaling or {}
            self.original = int(
                sc.get("original_max_position_embeddings", sc.get("max_position_embeddings", 0))
            )
            self.cached_len = self.original
            self.current: np.ndarray | None = None
            self._lock = threading.Lock()
            LIVE_SCHEDULES.add(self)

    def frequencies(self, positions: np.ndarray) -> np.ndarray | None:
        """The frequencies of a forward over ``positions`` (``None``: the module's own). The
        state does not move here: :meth:`advance` moves it once that forward has run, so a call
        the C++ entry refuses (a full cache, an id out of range) leaves it as it was."""
        if self.kind == "static" or positions.size == 0:
            return None
        seq_len = int(positions.max()) + 1
        if self.kind == "longrope":
            return rope_inv_freq(self.head_dim, self.theta, self.scaling, seq_len=seq_len)
        with self._lock:
            return self._next(seq_len)[1]

    def advance(self, positions: np.ndarray) -> None:
        """After a forward over ``positions`` ran: the dynamic state as that forward left it."""
        if self.kind != "dynamic" or positions.size == 0:
            return
        with self._lock:
            self.cached_len, self.current = self._next(int(positions.max()) + 1)

    def _next(self, seq_len: int) -> tuple[int, np.ndarray | None]:
        """(cached length, frequencies) after a forward of ``seq_len`` (dynamic, lock held)."""
        if seq_len > self.cached_len:  # grow
            return seq_len, rope_inv_freq(self.head_dim, self.theta, self.scaling, seq_len=seq_len)
        if seq_len < self.original < self.cached_len:  # back to the original frequencies
            return self.original, None
        return self.cached_len, self.current
