"""Generation: input preparation (tokenizer outputs, padding moved to the left), the limits
of a generation's KV cache, the progress bar and the one generation step every loop uses."""

from __future__ import annotations

import numbers
from collections.abc import Generator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .._config import ModelConfig

if TYPE_CHECKING:
    from .cache import ModelCache
    from .model import Transformer
    from .sampling import Sampler


def generate_step(
    model: Transformer,
    prompt: np.ndarray,
    cache: ModelCache,
    sampler: Sampler,
    mask: Any = None,
) -> Generator[np.ndarray, np.ndarray | None, None]:
    """The one generation loop (of :meth:`Transformer.generate`, :func:`llmkernels.generate`,
    :func:`llmkernels.stream_generate` and :class:`llmkernels.ChatSession`): prefill ``prompt
    (B, T)`` (``mask``: its real tokens) into ``cache``, then yield the next token of every
    row, ``(B,)`` int64, and feed it back, one C++ call per step.

    A step runs only when the caller asks for the next token, so stopping after the last one
    needed costs no forward. ``send(tokens)`` feeds ``tokens (B,)`` instead of the sampled
    ones (a batch's finished rows keep decoding a pad token)."""
    logits = model(prompt, mask=mask, cache=cache, last_only=True)[:, -1]
    while True:
        nxt = sampler(logits)
        feed = yield nxt
        fed = nxt if feed is None else feed
        logits = model(fed[:, None], cache=cache, last_only=True)[:, -1]


def check_max_tokens(fn: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"[{fn}] {name} must be an int >= 0, got {str(value)[:40]}")
    return int(value)


_MAX_CACHE_LEN = 1 << 24  # KVCache's limits (max_seq_len and elements per layer)
_MAX_CACHE_ELEMS = 1 << 33


def check_cache_size(fn: str, name: str, cfg: ModelConfig, batch: int, t: int, n: int) -> None:
    """The KV cache ``t + n`` tokens need must be one :class:`KVCache` can hold."""
    total = t + n
    if total > _MAX_CACHE_LEN or batch * total * cfg.n_kv_heads * cfg.head_dim > _MAX_CACHE_ELEMS:
        raise ValueError(
            f"[{fn}] {name} = {n} is too large: the prompt ({t}) plus the new tokens need a KV "
            f"cache of {total} positions for {batch} sequence(s), over the limit "
            f"(2**24 positions, 2**33 elements per layer)"
        )


def model_inputs(fn: str, ids: Any, mask: Any) -> tuple[Any, Any]:
    """Unpack a tokenizer's output (``BatchEncoding`` / dict with ``input_ids`` and
    ``attention_mask``) and torch tensors into arrays; a 1-D mask goes with 1-D ids."""
    if isinstance(ids, Mapping):
        if "input_ids" not in ids:
            raise ValueError(
                f"[{fn}] a mapping given as ids must hold 'input_ids' (a tokenizer's output), "
                f"got keys {list(ids)[:5]}"
            )
        if mask is None:
            mask = ids.get("attention_mask")
        ids = ids["input_ids"]
    if hasattr(ids, "detach"):
        ids = ids.detach().cpu().numpy()
    if hasattr(mask, "detach"):
        mask = mask.detach().cpu().numpy()
    if isinstance(ids, (list, tuple)):
        try:
            ids = np.asarray(ids)
            if ids.size == 0:  # [] or [[]]: no tokens (reported by the caller), not floats
                ids = ids.astype(np.int64)
        except ValueError:
            raise ValueError(
                f"[{fn}] ids must be a rectangular (B, T) batch; pad prompts of different "
                "lengths (e.g. tokenizer(..., padding=True)) and pass the attention mask"
            ) from None
    if mask is not None:
        mask = np.asarray(mask)
        if mask.ndim == 1 and np.ndim(ids) == 1:
            mask = mask[None]
    return ids, mask


def left_align(fn: str, ids: np.ndarray, mask: Any) -> tuple[np.ndarray, Any]:
    """Generation appends at the right: move right padding (transformers' default) to the
    left. Each row's real tokens must be one contiguous run."""
    if mask is None:
        return ids, mask
    m = np.asarray(mask)
    if m.shape != ids.shape:
        return ids, mask  # the model reports the shape error
    real = m != 0
    if not real.any(axis=1).all():
        raise ValueError(f"[{fn}] every sequence needs at least one real token (mask is all 0)")
    if real[:, -1].all():
        return ids, mask
    counts = real.sum(axis=1)
    first = real.argmax(axis=1)
    if not all(real[i, first[i] : first[i] + counts[i]].all() for i in range(len(real))):
        raise ValueError(f"[{fn}] mask: each sequence's real tokens must be contiguous")
    trailing = ids.shape[1] - (first + counts)
    ids = np.stack([np.roll(row, k) for row, k in zip(ids, trailing, strict=True)])
    m = np.stack([np.roll(row, k) for row, k in zip(m, trailing, strict=True)])
    return ids, m


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, show: bool, desc: str = "generate", unit: str = "tok") -> Any:
    if not show:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    if unit == "B":
        return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024)
    return tqdm(total=total, desc=desc, unit=unit)
