"""KV caches (:class:`KVCache` per layer, :class:`ModelCache` per model), the locked forward
that reads and advances a cache in one step, and what a forked child does with caches another
thread was writing."""

from __future__ import annotations

import contextlib
import numbers
import os
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _core
from .module import as_f32, check_kv_dtype, from_impl, positive_int
from .positions import LIVE_SCHEDULES, RopeSchedule, positions_and_mask

if TYPE_CHECKING:
    from .block import TransformerBlock
    from .layers import MultiHeadAttention


# ----------------------------------------------------------------------------------------------
# attention and caches
# ----------------------------------------------------------------------------------------------


class KVCache:
    """Keys and values of past tokens for one attention layer and one batch of sequences.

    ``length`` tokens are cached (at most ``max_seq_len``); ``next_positions`` is the RoPE
    position the next token of each sequence gets (it only advances on real tokens, so
    left-padded batches keep per-sequence positions).

    ``window`` (a sliding-window layer's, as its ``new_cache`` passes it): the cache is a
    rolling buffer of ``min(window, max_seq_len)`` slots -- memory O(window) for any length,
    since the layer never looks further back -- and only a layer with that window may use it.
    ``keys()`` / ``values()`` then hold the last ``window`` tokens once more were appended.

    Memory: ``nbytes`` is reserved for the capacity, but only the pages of the tokens written
    become resident (the storage is calloc'd zeros), so a cache sized for a long generation
    that stops early costs what it holds.

    ``dtype``: how keys and values are stored -- ``"float32"`` (default), ``"bfloat16"`` or
    ``"float16"`` (half the bytes: ``nbytes``). They are rounded to nearest even as they are
    written (as ``ml_dtypes`` / torch round) and attention reads them widened to float32 inside
    the kernel (no float32 copy of the cache), so the result is float32 attention over the
    rounded keys and values. ``keys()`` / ``values()`` return arrays of that dtype
    (``ml_dtypes.bfloat16``, ``np.float16``).

    Threads: calls that use the same cache from several threads are serialised (each one sees
    the tokens the previous one appended, or raises "KV cache is full"); a cache is never
    appended to by two calls at once.

    Examples:
        >>> import llmkernels as lk, numpy as np
        >>> attn = lk.MultiHeadAttention(16, 4, 2, seed=0)
        >>> cache = attn.new_cache(batch=1, max_seq_len=8)
        >>> _ = attn(np.ones((1, 3, 16), np.float32), cache=cache); cache.length
        3
    """

    def __init__(
        self,
        batch: int,
        max_seq_len: int,
        n_kv_heads: int,
        head_dim: int,
        window: int = 0,
        dtype: Any = None,
    ) -> None:
        for name, v in (("batch", batch), ("max_seq_len", max_seq_len)):
            positive_int("KVCache", name, v)
        kv_dtype = check_kv_dtype("KVCache", "dtype", dtype)
        if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 0:
            raise ValueError(f"[KVCache] window must be an int >= 0 (0: none), got {window!r}")
        window = int(window)
        slots = min(window, max_seq_len) if window else max_seq_len
        if batch * slots * n_kv_heads * head_dim > 1 << 33:
            raise ValueError("[KVCache] batch * max_seq_len * heads * head_dim is too large")
        self._impl = _core.KVCacheImpl(batch, max_seq_len, n_kv_heads, head_dim, window, kv_dtype)
        self._next = np.zeros(batch, np.int64)
        # (length before, next positions) of a call in flight: a call whose C++ forward appended
        # its tokens but was interrupted before it advanced the positions (KeyboardInterrupt
        # lands between the two) is settled by the next use (see _settle)
        self._pending: tuple[int, np.ndarray] | None = None
        # held from reading next_positions to updating them (the C++ call in between holds the
        # cache's own mutex, which also guards direct _core use)
        self._lock = threading.Lock()
        self._torn = False  # see _after_fork_in_child
        LIVE_CACHES.add(self)

    @property
    def next_positions(self) -> np.ndarray:
        """The RoPE position of the next token of each sequence ``(B,)``."""
        self._settle()
        return self._next

    def _settle(self) -> None:
        pending = self._pending
        if pending is not None:
            if self._impl.length != pending[0]:  # the tokens were appended: so are positions
                self._next[:] = pending[1]
            self._pending = None

    def _begin(self, nxt: np.ndarray) -> None:
        """Before the C++ call that appends to the cache (with its lock held)."""
        self._settle()
        self._pending = (self._impl.length, nxt)

    def _commit(self, nxt: np.ndarray) -> None:
        """After it returned."""
        self._next[:] = nxt
        self._pending = None

    batch = from_impl("batch")
    max_seq_len = from_impl("max_len")
    length = from_impl("length")
    window = from_impl("window")
    dtype = from_impl("dtype")  # "float32", "bfloat16" or "float16"
    nbytes = from_impl("nbytes")  # of the key and value storage (all slots)

    def keys(self) -> np.ndarray:
        """``(B, Hkv, length, head_dim)`` view of the cached (rotated) keys, in the cache's
        dtype."""
        return self._impl.keys()

    def values(self) -> np.ndarray:
        """``(B, Hkv, length, head_dim)`` view of the cached values, in the cache's dtype."""
        return self._impl.values()

    def reset(self) -> None:
        check_not_torn(self, "KVCache.reset")
        with self._lock:
            self._pending = None
            self._impl.reset()
            self._next[:] = 0

    def crop(self, n: int) -> None:
        """Keep the first ``n`` cached tokens and drop the rest (``n < 0``: drop the last
        ``-n``), as transformers' ``DynamicCache.crop``: the next token appended goes after
        them, and each sequence's next RoPE position moves back by the tokens dropped -- which
        were consecutive positions, as they are unless a call passed ``positions``. Not past a
        padding token (a left-padded batch) and, once a sliding-window cache has wrapped, by one
        token at most (the slots of older ones were overwritten): ``ValueError``.

        Examples:
            >>> import llmkernels as lk, numpy as np
            >>> attn = lk.MultiHeadAttention(16, 4, 2, seed=0)
            >>> cache = attn.new_cache(batch=1, max_seq_len=8)
            >>> _ = attn(np.ones((1, 5, 16), np.float32), cache=cache)
            >>> cache.crop(3); cache.length, int(cache.next_positions[0])
            (3, 3)
        """
        check_not_torn(self, "KVCache.crop")
        with self._lock:
            self._settle()
            self._crop(self._crop_check(n, "KVCache.crop"))

    def _crop(self, drop: int) -> None:
        """Drop the last ``drop`` tokens (checked by _crop_check; the lock held)."""
        self._impl.crop(self._impl.length - drop)
        self._next -= drop

    def _crop_check(self, n: int, fn: str) -> int:
        """The tokens a crop to ``n`` drops (raises if it cannot)."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(f"[{fn}] n must be an int, got {type(n).__name__}")
        length = self._impl.length
        keep = int(n) if n >= 0 else length + int(n)
        if not 0 <= keep <= length:
            raise ValueError(f"[{fn}] n must be in [-{length}, {length}], got {n}")
        drop = length - keep
        if drop and self._impl.masked:
            raise ValueError(
                f"[{fn}] the cache holds padding (a left-padded batch): the positions of "
                "the tokens to drop are not known; reset it instead"
            )
        if length > self._impl.slots and drop > 1:
            raise ValueError(
                f"[{fn}] the sliding-window cache has wrapped ({length} tokens in "
                f"{self._impl.slots} slots): it can drop its last token only, not {drop}"
            )
        return drop

    def __repr__(self) -> str:
        dt = "" if self.dtype == "float32" else f", dtype={self.dtype}"
        return (
            f"KVCache(batch={self.batch}, length={self.length}, max_seq_len={self.max_seq_len}{dt})"
        )


class ModelCache:
    """One :class:`KVCache` per block of a :class:`Transformer`.

    Examples:
        >>> import llmkernels as lk
        >>> model = lk.Transformer({"dim": 16, "n_layers": 2, "n_heads": 2, "hidden_dim": 32,
        ...                         "vocab_size": 50}, seed=0)
        >>> len(model.new_cache(1, 8).layers)
        2
    """

    def __init__(self, caches: Sequence[KVCache]) -> None:
        self.layers = list(caches)
        self._lock = threading.Lock()  # a Transformer call holds it (see KVCache)
        self._torn = False
        LIVE_CACHES.add(self)

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else 0

    @property
    def next_positions(self) -> np.ndarray:
        return self.layers[0].next_positions

    @property
    def dtype(self) -> str:
        """Storage dtype of the keys and values (see :class:`KVCache`)."""
        return self.layers[0].dtype if self.layers else "float32"

    @property
    def nbytes(self) -> int:
        """Bytes of the key and value storage of every layer."""
        return sum(c.nbytes for c in self.layers)

    def crop(self, n: int) -> None:
        """Keep the first ``n`` tokens of every layer (``n < 0``: drop the last ``-n``): see
        :meth:`KVCache.crop`. Every layer is checked before any is cropped.

        Examples:
            >>> import llmkernels as lk, numpy as np
            >>> model = lk.Transformer({"dim": 16, "n_layers": 2, "n_heads": 2,
            ...                         "hidden_dim": 32, "vocab_size": 50}, seed=0)
            >>> cache = model.new_cache(1, 8)
            >>> _ = model(np.array([[1, 2, 3, 4]]), cache=cache)
            >>> cache.crop(-1); cache.length
            3
        """
        check_not_torn(self, "ModelCache.crop")
        with self._lock:
            for c in self.layers:
                check_not_torn(c, "ModelCache.crop")
            with contextlib.ExitStack() as held:
                for c in self.layers:
                    held.enter_context(c._lock)
                    c._settle()
                drops = [c._crop_check(n, "ModelCache.crop") for c in self.layers]
                for c, drop in zip(self.layers, drops, strict=True):
                    c._crop(drop)

    def reset(self) -> None:
        check_not_torn(self, "ModelCache.reset")
        with self._lock:
            for c in self.layers:
                c.reset()


def holding(cache: KVCache | ModelCache | None, cls: str) -> Any:
    """The cache's lock as a context manager (nothing without a cache)."""
    if cache is None:
        return contextlib.nullcontext()
    check_not_torn(cache, cls)
    return cache._lock


# Caches, so that a forked child can tell the ones another thread of the parent was writing at
# the fork: their lock (and the C++ mutex inside) stays held in the child, where that thread does
# not exist, and their keys and values are half written. They raise there instead of hanging.
LIVE_CACHES: weakref.WeakSet[Any] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for schedule in list(LIVE_SCHEDULES):
        if schedule._lock.locked():
            schedule._lock = threading.Lock()
            schedule.cached_len, schedule.current = schedule.original, None
    for cache in list(LIVE_CACHES):
        if cache._lock.locked():
            cache._lock = threading.Lock()
            cache._torn = True
            for layer in getattr(cache, "layers", ()):
                layer._torn = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def check_not_torn(cache: KVCache | ModelCache, cls: str) -> None:
    if cache._torn:
        raise RuntimeError(
            f"[{cls}] cache: another thread was writing it when this process forked, so its keys "
            "and values are undefined here (and its lock belongs to a thread that does not "
            "exist): make a new cache in this process"
        )


def locked_forward(
    module: MultiHeadAttention | TransformerBlock,
    rope: RopeSchedule,
    x: Any,
    positions: Any,
    mask: Any,
    cache: KVCache | None,
) -> np.ndarray:
    """The forward of :class:`MultiHeadAttention` and :class:`TransformerBlock` (one C++ call,
    ``module._impl.forward``): ``x (B, T, dim)`` checked, the cache held from reading its
    positions to advancing them, the RoPE frequencies of the positions from ``rope``."""
    name = module._name
    arr = check_btd(name, x, module.dim)
    b, t, _ = arr.shape
    check_cache_type(name, cache)
    with holding(cache, name):  # positions continue from the previous call on this cache
        check_cache(name, cache, b)
        pos, key_mask, nxt = positions_and_mask(name, b, t, positions, mask, cache)
        if b == 0 or t == 0:  # nothing to attend from: an empty result, the cache unchanged
            return np.zeros((b, t, module.dim), np.float32)
        freqs = rope.frequencies(pos)
        if cache is not None:
            cache._begin(nxt)
        y = module._impl.forward(
            arr, pos, key_mask, cache._impl if cache is not None else None, freqs
        )
        if cache is not None:
            cache._commit(nxt)
        rope.advance(pos)
    return y


def check_btd(cls: str, x: Any, dim: int) -> np.ndarray:
    arr = as_f32(cls, "x", x, dim)
    if arr.ndim != 3:
        raise ValueError(f"[{cls}] x must have shape (B, T, {dim}), got {arr.shape}")
    return arr


def check_layers_in_step(cls: str, cache: ModelCache) -> None:
    """Every layer of a model's cache holds the same tokens at the same positions (a layer
    reset or run alone, or a ModelCache assembled from unrelated caches, would otherwise
    attend over other tokens than the rest, silently)."""
    first = cache.layers[0]
    for i, c in enumerate(cache.layers[1:], 1):
        if c.length != first.length or not np.array_equal(c.next_positions, first.next_positions):
            raise ValueError(
                f"[{cls}] cache: layer {i} holds {c.length} tokens, layer 0 {first.length} (or "
                "their positions differ): the layers must move together; reset() the cache"
            )


def check_cache_type(cls: str, cache: Any) -> None:
    if cache is not None and not isinstance(cache, KVCache):
        raise TypeError(
            f"[{cls}] cache must be a KVCache (from new_cache), got {type(cache).__name__}"
        )


def check_cache(cls: str, cache: Any, batch: int) -> None:
    """``cache`` holds ``batch`` sequences: their next positions are the input's. (Its room
    for the new tokens is checked once, by the C++ entry under the cache's mutex.)"""
    if cache is None:
        return
    check_cache_type(cls, cache)
    if cache.batch != batch:
        raise ValueError(f"[{cls}] cache holds {cache.batch} sequences, the input has {batch}")
