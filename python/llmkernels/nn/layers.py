"""The layers: :class:`RMSNorm`, :class:`LayerNorm`, :class:`FeedForward` (SwiGLU / GeGLU) and
:class:`MultiHeadAttention` (grouped-query, RoPE, sliding window, soft-capping)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import _core
from .._rope_scaling import rope_attention_factor, rope_inv_freq
from .cache import KVCache, locked_forward
from .module import (
    Module,
    as_f32,
    check_eps,
    check_kv_dtype,
    check_weight_dtype,
    entry_name,
    from_impl,
    group_arg,
    positive_int,
    positive_real,
)
from .positions import RopeSchedule

# ----------------------------------------------------------------------------------------------
# norms and feed-forward
# ----------------------------------------------------------------------------------------------


class RMSNorm(Module):
    """RMSNorm over the last axis, ``x / sqrt(mean(x**2) + eps) * weight``; weight ``(dim,)``.

    Examples:
        >>> import llmkernels as lk, numpy as np
        >>> np.round(lk.RMSNorm(2, eps=0.0)(np.array([[3.0, 4.0]], np.float32)), 4)
        array([[0.8485, 1.1314]], dtype=float32)
    """

    _name = "RMSNorm"

    def __init__(self, dim: int, eps: float = 1e-6, *, unit_offset: bool = False) -> None:
        # unit_offset (Gemma): scales by (1 + weight), weight initialised to zeros
        self._impl = _core.RMSNormImpl(
            positive_int(self._name, "dim", dim), check_eps(self._name, eps), bool(unit_offset)
        )

    dim = from_impl("dim")
    eps = from_impl("eps")

    def __call__(self, x: Any) -> np.ndarray:
        """``(..., dim)`` float32 -> same shape."""
        return self._impl.forward(as_f32(self._name, "x", x, self.dim))

    def __repr__(self) -> str:
        return f"RMSNorm(dim={self.dim}, eps={self.eps})"


class LayerNorm(Module):
    """LayerNorm over the last axis (biased variance); weight and optional bias ``(dim,)``.

    Examples:
        >>> import llmkernels as lk, numpy as np
        >>> np.round(lk.LayerNorm(3, eps=0.0)(np.array([[1.0, 2.0, 3.0]], np.float32)), 4)
        array([[-1.2247,  0.    ,  1.2247]], dtype=float32)
    """

    _name = "LayerNorm"

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True) -> None:
        self._impl = _core.LayerNormImpl(
            positive_int(self._name, "dim", dim), check_eps(self._name, eps), bool(bias)
        )

    dim = from_impl("dim")

    def __call__(self, x: Any) -> np.ndarray:
        return self._impl.forward(as_f32(self._name, "x", x, self.dim))

    def __repr__(self) -> str:
        return f"LayerNorm(dim={self.dim}, eps={self._impl.eps}, bias={self._impl.has_bias})"


def make_norm(kind: str, dim: int, eps: float, unit_offset: bool = False) -> RMSNorm | LayerNorm:
    if kind == "rms":
        return RMSNorm(dim, eps, unit_offset=unit_offset)
    if kind == "layer":
        return LayerNorm(dim, eps)
    raise ValueError(f"[TransformerBlock] norm must be 'rms' or 'layer', got {kind!r}")


class FeedForward(Module):
    """SwiGLU MLP ``down(silu(gate(x)) * up(x))`` with HF keys ``gate_proj``, ``up_proj``,
    ``down_proj`` (weights ``(out, in)``). ``x (..., dim)`` -> ``(..., dim)``.

    Examples:
        >>> import llmkernels as lk, numpy as np
        >>> ffn = lk.FeedForward(8, 16, seed=0)
        >>> ffn(np.ones((2, 8), np.float32)).shape, sorted(ffn.state_dict())
        ((2, 8), ['down_proj.weight', 'gate_proj.weight', 'up_proj.weight'])
    """

    _name = "FeedForward"

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        *,
        bias: bool = False,
        fused_names: bool = False,
        activation: str = "silu",
        dtype: Any = None,
        group_size: int = 32,
        seed: int | None = None,
    ) -> None:
        wdtype = check_weight_dtype(self._name, dtype)
        if activation not in ("silu", "gelu_tanh"):
            raise ValueError(
                f"[{self._name}] activation must be 'silu' (SwiGLU) or 'gelu_tanh' (GeGLU), "
                f"got {str(activation)[:40]!r}"
            )
        dim = positive_int(self._name, "dim", dim)
        hidden_dim = positive_int(self._name, "hidden_dim", hidden_dim)
        impl = _core.FeedForwardImpl(
            dim,
            hidden_dim,
            bool(bias),
            activation == "gelu_tanh",
            wdtype,
            group_arg(self._name, wdtype, group_size),
            fn=entry_name(self._name),  # (the C++ entry checks the group size)
        )
        self._take_layer(impl, fused_names, seed)  # (Phi-3's one gate_up_proj tensor)

    dim = from_impl("dim")
    hidden_dim = from_impl("hidden")
    dtype = from_impl("dtype")

    def _quant_parts(self) -> list[Any]:
        return [self._impl]

    def __call__(self, x: Any) -> np.ndarray:
        arr = as_f32(self._name, "x", x, self.dim)
        return self._impl.forward(arr.reshape(-1, self.dim)).reshape(arr.shape)

    def __repr__(self) -> str:
        return f"FeedForward(dim={self.dim}, hidden_dim={self.hidden_dim})"


class MultiHeadAttention(Module):
    """Causal multi-head attention with q/k/v/o projections, RoPE, grouped-query heads and an
    optional KV cache (HF ``LlamaAttention`` keys: ``q_proj``, ``k_proj``, ``v_proj``,
    ``o_proj``).

    Args:
        dim: model width.
        n_heads: query heads.
        n_kv_heads: key/value heads (``n_heads % n_kv_heads == 0``).
        head_dim: default ``dim // n_heads``.
        rope_theta: RoPE base.
        rope_scaling: HF ``rope_scaling`` dict (see ``rope_inv_freq``).
        bias: biases on q/k/v/o (HF ``attention_bias``).
        o_bias: bias on o (default: ``bias``; Qwen2 has q/k/v biases only).
        causal: bottom-right causal masking (decoder self-attention).
        window: sliding window (Mistral): each query sees only the last ``window`` keys
            (see :func:`llmkernels.attention`); with a KV cache, decode equals the full forward.
        softcap: attention-logit soft-capping ``softcap * tanh(s / softcap)`` (Gemma 2).
        scale: score multiplier, default ``1 / sqrt(head_dim)``.
        sinks: learned per-head attention sinks (parameter ``sinks`` of shape ``(n_heads,)``,
            as gpt-oss).
        fused_names: name the q/k/v weights as one ``qkv_proj`` tensor (Phi-3's layout, which
            is how the module stores them) in the state dict.
        qk_norm: RMSNorm of each head of q and of k before RoPE (Qwen3; parameters
            ``q_norm.weight``, ``k_norm.weight`` of shape ``(head_dim,)``), with ``qk_norm_eps``.

    Examples:
        >>> import llmkernels as lk, numpy as np
        >>> attn = lk.MultiHeadAttention(16, n_heads=4, n_kv_heads=2, seed=0)
        >>> attn(np.ones((2, 5, 16), np.float32)).shape
        (2, 5, 16)
    """

    _name = "MultiHeadAttention"

    def __init__(
        self,
        dim: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        *,
        rope_theta: float = 10000.0,
        rope_scaling: Mapping[str, Any] | None = None,
        bias: bool = False,
        o_bias: bool | None = None,
        causal: bool = True,
        window: int | None = None,
        softcap: float | None = None,
        scale: float | None = None,
        sinks: bool = False,
        fused_names: bool = False,
        qk_norm: bool = False,
        qk_norm_eps: float = 1e-6,
        dtype: Any = None,
        group_size: int = 32,
        seed: int | None = None,
    ) -> None:
        wdtype = check_weight_dtype(self._name, dtype)
        dim = positive_int(self._name, "dim", dim)
        window = 0 if window is None else min(positive_int(self._name, "window", window), 2**62)
        softcap = 0.0 if softcap is None else positive_real(self._name, "softcap", softcap)
        scale = 0.0 if scale is None else positive_real(self._name, "scale", scale)
        n_heads = positive_int(self._name, "n_heads", n_heads)
        n_kv = n_heads if n_kv_heads is None else positive_int(self._name, "n_kv_heads", n_kv_heads)
        if n_heads % n_kv:
            raise ValueError(
                f"[{self._name}] n_heads must be a multiple of n_kv_heads, got {n_heads}, {n_kv}"
            )
        if head_dim is None:
            if dim % n_heads:
                raise ValueError(
                    f"[{self._name}] dim ({dim}) must be divisible by n_heads ({n_heads}) "
                    "when head_dim is not given"
                )
            head_dim = dim // n_heads
        head_dim = positive_int(self._name, "head_dim", head_dim)
        if head_dim % 2:
            raise ValueError(f"[{self._name}] head_dim must be even (RoPE), got {head_dim}")
        group = group_arg(self._name, wdtype, group_size)
        scaling = dict(rope_scaling) if rope_scaling else None
        inv_freq = rope_inv_freq(head_dim, float(rope_theta), scaling)
        factor = rope_attention_factor(scaling) if scaling else 1.0
        self.rope_theta = float(rope_theta)
        self.rope_scaling = scaling
        self._rope = RopeSchedule(head_dim, float(rope_theta), scaling)
        impl = _core.MultiHeadAttentionImpl(
            dim,
            n_heads,
            n_kv,
            head_dim,
            inv_freq.tolist(),
            factor,
            bool(bias),
            bool(bias if o_bias is None else o_bias),
            bool(causal),
            window,
            softcap,
            scale,
            bool(sinks),
            bool(qk_norm),
            check_eps(self._name, qk_norm_eps),
            wdtype,
            group,
            fn=entry_name(self._name),
        )
        self._take_layer(impl, fused_names, seed)  # (Phi-3's one qkv_proj tensor)

    dim = from_impl("dim")
    n_heads = from_impl("n_heads")
    n_kv_heads = from_impl("n_kv_heads")
    head_dim = from_impl("head_dim")
    dtype = from_impl("dtype")

    def _quant_parts(self) -> list[Any]:
        return [self._impl]

    def new_cache(self, batch: int, max_seq_len: int, dtype: Any = None) -> KVCache:
        """An empty KV cache for ``batch`` sequences of up to ``max_seq_len`` tokens (a rolling
        buffer of ``window`` slots for a sliding-window layer), storing keys and values in
        ``dtype``: ``"float32"`` (default), ``"bfloat16"`` or ``"float16"`` (see
        :class:`KVCache`)."""
        kv_dtype = check_kv_dtype("new_cache", "dtype", dtype)
        return KVCache(
            batch, max_seq_len, self.n_kv_heads, self.head_dim, self._impl.window, kv_dtype
        )

    def __call__(
        self,
        x: Any,
        *,
        positions: Any = None,
        mask: Any = None,
        cache: KVCache | None = None,
    ) -> np.ndarray:
        """``x (B, T, dim)`` -> ``(B, T, dim)``. ``mask``: ``(B, T)`` key-padding mask (True =
        real token). With ``cache``, the new keys/values are appended and attention covers every
        cached token; positions continue from the cache."""
        return locked_forward(self, self._rope, x, positions, mask, cache)

    def __repr__(self) -> str:
        return (
            f"MultiHeadAttention(dim={self.dim}, n_heads={self.n_heads}, "
            f"n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim})"
        )
