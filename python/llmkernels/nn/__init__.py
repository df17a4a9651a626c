"""Composable transformer modules backed by C++ (``RMSNorm``, ``LayerNorm``, ``FeedForward``,
``MultiHeadAttention``, ``TransformerBlock``, ``Transformer``) and their KV caches.

Each module holds weights owned by C++ in HF LLaMA layout (projections are ``(out, in)``),
shows them to Python without copying (:meth:`state_dict`), and replaces them with validation
(:meth:`load_state_dict`, strict by default). Projection and embedding matrices are stored in
the module's ``dtype`` -- float32 (default), bfloat16 (``ml_dtypes.bfloat16`` views) or float16
-- and converted to float32 in registers by the kernels; norms, biases and sinks are float32,
and so are activations. Projections (and a model's LM head) may also be group-wise int8 / int4
(``dtype="int8"|"int4"``, or :meth:`quantize` in place): their state-dict entries are then
``<name>.qweight`` (the codes) and ``<name>.scales`` (float16), see docs/quantization.md; the
embedding stays float. Calling a module runs its whole forward in
one C++ call with the GIL released::

    block = TransformerBlock.from_config({"dim": 512, "n_heads": 8, "hidden_dim": 1408}, seed=0)
    y = block(x)                                   # x: (B, T, 512) float32
    block.load_state_dict({k: v.numpy() for k, v in hf_layer.state_dict().items()})

A block is ``h = x + attn(norm1(x)); y = h + ffn(norm2(h))`` (pre-norm, LLaMA) or
``h = norm1(x + attn(x)); y = norm2(h + ffn(h))`` (``norm_position="post"``).
"""

from .block import TransformerBlock
from .cache import KVCache, ModelCache
from .layers import FeedForward, LayerNorm, MultiHeadAttention, RMSNorm
from .model import Transformer

__all__ = [
    "FeedForward",
    "KVCache",
    "LayerNorm",
    "ModelCache",
    "MultiHeadAttention",
    "RMSNorm",
    "Transformer",
    "TransformerBlock",
]
