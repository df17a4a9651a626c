"""One decoder layer, :class:`TransformerBlock`: attention and feed-forward with their norms
(pre-norm, post-norm or sandwich), the whole forward in one C++ call."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .. import _core
from .._config import ModelConfig
from .cache import KVCache, locked_forward
from .layers import FeedForward, LayerNorm, MultiHeadAttention, RMSNorm, make_norm
from .module import Module, check_weight_dtype, entry, seeded_rng

# ----------------------------------------------------------------------------------------------
# block and model
# ----------------------------------------------------------------------------------------------


def block_config(config: Mapping[str, Any] | ModelConfig) -> ModelConfig:
    if isinstance(config, ModelConfig):
        return config
    d = dict(config)
    hf = "hidden_size" in d or "num_attention_heads" in d
    if not hf:  # a block alone needs no vocabulary or layer count
        d.setdefault("n_layers", 1)
        d.setdefault("vocab_size", 1)
    return ModelConfig.from_dict(d)


class TransformerBlock(Module):
    """One decoder layer, composed of modules (HF ``LlamaDecoderLayer`` keys ``self_attn.*``,
    ``mlp.*``, ``input_layernorm.*``, ``post_attention_layernorm.*``).

    Build it from modules you made::

        TransformerBlock(attention=MultiHeadAttention(512, 8), feed_forward=FeedForward(512, 1408),
                         attention_norm=RMSNorm(512), ffn_norm=RMSNorm(512), norm_position="pre")

    or from a config (canonical names or an HF ``LlamaConfig`` dict) with
    :meth:`from_config`. The forward is one C++ call: norm, fused QKV projection, RoPE,
    streaming attention, output projection with the residual folded into the GEMM, norm, fused
    gate/up projection, SwiGLU, down projection with the residual.

    Examples:
        >>> import llmkernels as lk, numpy as np
        >>> config = {"dim": 16, "n_heads": 4, "hidden_dim": 32}
        >>> block = lk.TransformerBlock.from_config(config, seed=0)
        >>> block(np.ones((1, 3, 16), np.float32)).shape
        (1, 3, 16)
    """

    _name = "TransformerBlock"

    def __init__(
        self,
        *,
        attention: MultiHeadAttention,
        feed_forward: FeedForward,
        attention_norm: RMSNorm | LayerNorm,
        ffn_norm: RMSNorm | LayerNorm,
        norm_position: str = "pre",
        post_attention_norm: RMSNorm | LayerNorm | None = None,
        post_ffn_norm: RMSNorm | LayerNorm | None = None,
    ) -> None:
        if not isinstance(attention, MultiHeadAttention):
            raise TypeError(f"[{self._name}] attention must be a MultiHeadAttention")
        if not isinstance(feed_forward, FeedForward):
            raise TypeError(f"[{self._name}] feed_forward must be a FeedForward")
        if norm_position not in ("pre", "post", "sandwich"):
            raise ValueError(
                f"[{self._name}] norm_position must be 'pre', 'post' or 'sandwich', "
                f"got {norm_position!r}"
            )
        sandwich = norm_position == "sandwich"
        if sandwich != (post_attention_norm is not None) or sandwich != (post_ffn_norm is not None):
            raise ValueError(
                f"[{self._name}] post_attention_norm and post_ffn_norm are given exactly when "
                "norm_position='sandwich'"
            )
        norms = [("attention_norm", attention_norm), ("ffn_norm", ffn_norm)]
        if sandwich:
            norms += [
                ("post_attention_norm", post_attention_norm),
                ("post_ffn_norm", post_ffn_norm),
            ]
        for name, norm in norms:
            if not isinstance(norm, (RMSNorm, LayerNorm)):
                raise TypeError(f"[{self._name}] {name} must be an RMSNorm or LayerNorm")
            if norm.dim != attention.dim:
                raise ValueError(
                    f"[{self._name}] {name} has dim {norm.dim}, attention has {attention.dim}"
                )
        if feed_forward.dim != attention.dim:
            raise ValueError(
                f"[{self._name}] feed_forward has dim {feed_forward.dim}, attention has "
                f"{attention.dim}"
            )
        self.attention = attention
        self.feed_forward = feed_forward
        self.attention_norm = attention_norm
        self.ffn_norm = ffn_norm
        self.post_attention_norm = post_attention_norm
        self.post_ffn_norm = post_ffn_norm
        self.norm_position = norm_position
        self._impl = _core.TransformerBlockImpl(
            attention._impl,
            feed_forward._impl,
            attention_norm._impl,
            ffn_norm._impl,
            norm_position == "pre",
            post_attention_norm._impl if sandwich else None,  # type: ignore[union-attr]
            post_ffn_norm._impl if sandwich else None,  # type: ignore[union-attr]
        )

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | ModelConfig,
        *,
        seed: int | None = None,
        layer: int = 0,
        dtype: Any = None,
        group_size: int = 32,
    ) -> TransformerBlock:
        """Build a randomly initialised block (``seed``) from ``dim, n_heads, n_kv_heads,
        head_dim, hidden_dim, norm_eps, rope_theta, rope_scaling, norm, norm_position,
        attention_bias, mlp_bias`` or the HF ``LlamaConfig`` equivalents. ``layer``: which layer
        of the model it is (Gemma 2 alternates sliding-window and full-attention layers).
        ``dtype``: storage of the projection matrices (float32, bfloat16, float16, or int8 /
        int4 in groups of ``group_size`` along the input dimension)."""
        wdtype = check_weight_dtype("TransformerBlock", dtype)
        c = block_config(config)
        norm = functools.partial(make_norm, c.norm, c.dim, c.norm_eps, c.norm_unit_offset)
        sandwich = c.norm_position == "sandwich"
        rng = seeded_rng(seed)
        seeds = rng.integers(0, 2**63 - 1, size=2)
        # both sublayers: the block's weight storage, the fused-projection names
        shared = {"dtype": wdtype, "group_size": group_size, "fused_names": c.fused_projections}
        with entry("TransformerBlock"):  # (its layers' argument errors name it)
            return cls(
                attention=MultiHeadAttention(
                    c.dim,
                    c.n_heads,
                    c.n_kv_heads,
                    c.head_dim,
                    rope_theta=c.rope_theta,
                    rope_scaling=c.rope_scaling_dict(),
                    bias=c.attention_bias,
                    o_bias=c.o_bias,
                    window=c.layer_window(layer),
                    softcap=c.attn_softcap,
                    scale=c.attn_scale,
                    qk_norm=c.qk_norm,
                    qk_norm_eps=c.norm_eps,
                    seed=int(seeds[0]),
                    **shared,
                ),
                feed_forward=FeedForward(
                    c.dim,
                    c.hidden_dim,
                    bias=c.mlp_bias,
                    activation=c.activation,
                    seed=int(seeds[1]),
                    **shared,
                ),
                attention_norm=norm(),
                ffn_norm=norm(),
                post_attention_norm=norm() if sandwich else None,
                post_ffn_norm=norm() if sandwich else None,
                norm_position=c.norm_position,
            )

    def _own_params(self) -> dict[str, np.ndarray]:
        return {}

    def _quant_parts(self) -> list[Any]:
        return self.attention._quant_parts() + self.feed_forward._quant_parts()

    def _children(self) -> Iterator[tuple[str, Module]]:
        yield "self_attn", self.attention
        yield "mlp", self.feed_forward
        yield "input_layernorm", self.attention_norm
        if self.norm_position == "sandwich":  # Gemma 2's names
            yield "post_attention_layernorm", self.post_attention_norm  # type: ignore[misc]
            yield "pre_feedforward_layernorm", self.ffn_norm
            yield "post_feedforward_layernorm", self.post_ffn_norm  # type: ignore[misc]
        else:
            yield "post_attention_layernorm", self.ffn_norm

    @property
    def dim(self) -> int:
        return self.attention.dim

    @property
    def dtype(self) -> str:
        """Storage dtype of the projection matrices (those of the attention)."""
        return str(self.attention.dtype)

    def new_cache(self, batch: int, max_seq_len: int, dtype: Any = None) -> KVCache:
        """The attention's KV cache (see :meth:`MultiHeadAttention.new_cache`)."""
        return self.attention.new_cache(batch, max_seq_len, dtype)

    def __call__(
        self, x: Any, *, positions: Any = None, mask: Any = None, cache: KVCache | None = None
    ) -> np.ndarray:
        """``x (B, T, dim)`` -> ``(B, T, dim)`` (see :class:`MultiHeadAttention` for the
        arguments)."""
        return locked_forward(self, self.attention._rope, x, positions, mask, cache)

    def __repr__(self) -> str:
        return (
            f"TransformerBlock({self.attention!r}, {self.feed_forward!r}, "
            f"norm={self.attention_norm!r}, norm_position={self.norm_position!r})"
        )
