"""Tiny Hugging Face LLaMA configurations and helpers shared by the test modules.

One place builds the ``LlamaConfig`` of the HF peers (test_modules, test_reference_block,
test_text, test_peers, test_rope_scaling), so the RoPE parameters are passed the way the
installed transformers reads them: ``rope_parameters`` (with ``rope_theta`` inside) in 5.x,
``rope_theta`` and ``rope_scaling`` in 4.x.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import transformers
from transformers import LlamaConfig

HF_MAJOR = int(transformers.__version__.split(".")[0])
# the defaults of hf_llama_config: one small layer (the comparisons of single ops set the rest)
TINY = {"num_hidden_layers": 1, "vocab_size": 16, "intermediate_size": 8}
# the shape of the small two-layer models of the loading, precision and family tests (each with
# its own vocabulary): 4 query heads of 16 features over 2 KV heads, an MLP of 96
TWO_LAYERS = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def llama3_scaling(original_max_position_embeddings: int) -> dict[str, Any]:
    """HF ``rope_scaling`` of LLaMA 3.x: factor 8, low/high frequency factors 1 and 4."""
    return {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": original_max_position_embeddings,
    }


def hf_llama_config(
    *,
    theta: float = 10000.0,
    scaling: Mapping[str, Any] | None = None,
    attn: str | None = None,
    **fields: Any,
) -> LlamaConfig:
    """A ``LlamaConfig`` of the HF ``fields``, RoPE base ``theta`` and ``rope_scaling`` dict
    ``scaling`` (None: plain RoPE) in this transformers version's form. ``attn``: the attention
    implementation a standalone ``LlamaDecoderLayer`` reads from its config (left None it falls
    back to eager, which with ``attention_mask=None`` is *not* causal). Fields not given are
    those of a one-layer toy (``TINY``)."""
    fields = {**TINY, **fields}
    if HF_MAJOR >= 5:
        params = {"rope_type": "default"} if scaling is None else dict(scaling)
        params.setdefault("rope_theta", theta)
        config = LlamaConfig(rope_parameters=params, **fields)
    else:  # pragma: no cover - transformers 4.x
        rope = None if scaling is None else dict(scaling)
        config = LlamaConfig(rope_theta=theta, rope_scaling=rope, **fields)
    if attn is not None:
        config._attn_implementation = attn
    return config


def hf_rope_config(
    scaling: Mapping[str, Any] | None,
    *,
    head_dim: int,
    theta: float,
    max_position_embeddings: int,
    n_heads: int = 4,
    **fields: Any,
) -> LlamaConfig:
    """The ``LlamaConfig`` of a rotary-embedding comparison: ``n_heads`` heads of ``head_dim``,
    RoPE ``theta`` and ``scaling`` (``rope_scaling`` dict) over ``max_position_embeddings``."""
    return hf_llama_config(
        theta=theta,
        scaling=scaling,
        hidden_size=head_dim * n_heads,
        num_attention_heads=n_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        **fields,
    )


def hf_block_config(
    geometry: tuple[int, int, int, int],
    n_kv_heads: int,
    rope: tuple[float, Mapping[str, Any] | None],
    *,
    vocab_size: int,
    n_layers: int = 1,
    tie: bool = False,
    bias: bool = False,
    attn: str = "sdpa",
) -> LlamaConfig:
    """The ``LlamaConfig`` of the block/model comparisons: ``geometry`` is ``(hidden size,
    heads, head_dim, intermediate size)``, ``rope`` is ``(theta, scaling)``; RMSNorm eps 1e-5,
    no BOS/EOS/PAD ids (generate() must not stop early on a random "end" token)."""
    dim, n_heads, head_dim, hidden = geometry
    fields = {
        "hidden_size": dim,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv_heads,
        "head_dim": head_dim,
        "intermediate_size": hidden,
        "num_hidden_layers": n_layers,
        "vocab_size": vocab_size,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 256,
        "attention_bias": bias,
        "mlp_bias": bias,
        "tie_word_embeddings": tie,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }
    theta, scaling = rope
    return hf_llama_config(theta=theta, scaling=scaling, attn=attn, **fields)


def t(a: np.ndarray) -> torch.Tensor:
    """A tensor sharing a contiguous copy of ``a`` (no copy when already contiguous)."""
    return torch.from_numpy(np.ascontiguousarray(a))


def numpy_state(module: torch.nn.Module) -> dict[str, np.ndarray]:
    """The module's state dict as NumPy copies."""
    return {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}


def hf_greedy(model: transformers.PreTrainedModel, ids: np.ndarray, steps: int) -> np.ndarray:
    """HF greedy decoding of the unpadded prompts ``ids (B, T)``: ``(B, T + steps)`` ids."""
    with torch.no_grad():
        return model.generate(
            t(ids),
            attention_mask=torch.ones(ids.shape, dtype=torch.int64),
            max_new_tokens=steps,
            do_sample=False,
        ).numpy()
