"""
llmkernels C++ core (xsimd kernels, pybind11 bindings)
"""
from __future__ import annotations
import collections.abc
import numpy
import numpy.typing
import typing
__all__: list[str] = ['FeedForwardImpl', 'KVCacheImpl', 'LayerNormImpl', 'MultiHeadAttentionImpl', 'NormImpl', 'RMSNormImpl', 'StagedWeights', 'TransformerBlockImpl', 'TransformerImpl', 'attention', 'best_simd_arch', 'bf16_dot', 'bf16_dot_names', 'compiler', 'cpu_has_amx', 'cpu_has_avx512_bf16', 'cpu_has_avx512_vnni', 'cpu_splits_512', 'dequantize', 'family_simd_archs', 'get_num_threads', 'int8_dot', 'int8_dot_names', 'isa_names', 'layer_norm', 'max_threads', 'openblas_config', 'quantize', 'quantized_linear', 'rms_norm', 'rope', 'rope_tables', 'set_num_threads', 'set_simd_arch', 'silu', 'simd_arch', 'simd_arch_automatic', 'swiglu', 'swiglu_ffn', 'xsimd_version']
class NormImpl:
    def forward(self, x: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]) -> numpy.typing.NDArray[numpy.float32]:
        ...
    def params(self) -> dict:
        ...
    @property
    def dim(self) -> int:
        ...
    @property
    def kind(self) -> str:
        ...
class RMSNormImpl(NormImpl):
    def __init__(self, dim: typing.SupportsInt | typing.SupportsIndex, eps: typing.SupportsFloat | typing.SupportsIndex, unit_offset: bool = False) -> None:
        ...
    @property
    def eps(self) -> float:
        ...
    @property
    def unit_offset(self) -> bool:
        ...
class LayerNormImpl(NormImpl):
    def __init__(self, dim: typing.SupportsInt | typing.SupportsIndex, eps: typing.SupportsFloat | typing.SupportsIndex, bias: bool) -> None:
        ...
    @property
    def eps(self) -> float:
        ...
    @property
    def has_bias(self) -> bool:
        ...
class StagedWeights:
    pass
class FeedForwardImpl:
    fused_names: bool
    def __init__(self, dim: typing.SupportsInt | typing.SupportsIndex, hidden: typing.SupportsInt | typing.SupportsIndex, bias: bool, gelu_tanh: bool = False, dtype: str = 'float32', group_size: typing.SupportsInt | typing.SupportsIndex = 32, fn: str = 'FeedForward') -> None:
        ...
    def assign(self, staged: StagedWeights) -> None:
        ...
    def converted(self, dtype: str, group_size: typing.SupportsInt | typing.SupportsIndex, fn: str) -> StagedWeights:
        """
        The weight matrices converted to dtype ('int8', 'int4' in groups of group_size, or 'float32'), not yet in use: assign() swaps them in.
        """
    def forward(self, x: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]) -> numpy.typing.NDArray[numpy.float32]:
        ...
    def params(self) -> dict:
        ...
    @property
    def dim(self) -> int:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def gelu_tanh(self) -> bool:
        ...
    @property
    def group_size(self) -> int:
        ...
    @property
    def has_bias(self) -> bool:
        ...
    @property
    def hidden(self) -> int:
        ...
    @property
    def tiled_matrices(self) -> int:
        """
        int8 matrices now stored in AMX's tile layout (a forward keeps them so where the AMX kernel runs; views show the plain layout).
        """
class KVCacheImpl:
    def __init__(self, batch: typing.SupportsInt | typing.SupportsIndex, max_len: typing.SupportsInt | typing.SupportsIndex, n_kv_heads: typing.SupportsInt | typing.SupportsIndex, head_dim: typing.SupportsInt | typing.SupportsIndex, window: typing.SupportsInt | typing.SupportsIndex = 0, dtype: str = 'float32') -> None:
        ...
    def crop(self, n: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def keys(self) -> numpy.ndarray:
        ...
    def reset(self) -> None:
        ...
    def values(self) -> numpy.ndarray:
        ...
    @property
    def batch(self) -> int:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def head_dim(self) -> int:
        ...
    @property
    def length(self) -> int:
        ...
    @property
    def masked(self) -> bool:
        ...
    @property
    def max_len(self) -> int:
        ...
    @property
    def n_kv_heads(self) -> int:
        ...
    @property
    def nbytes(self) -> int:
        ...
    @property
    def slots(self) -> int:
        ...
    @property
    def window(self) -> int:
        ...
class MultiHeadAttentionImpl:
    fused_names: bool
    def __init__(self, dim: typing.SupportsInt | typing.SupportsIndex, n_heads: typing.SupportsInt | typing.SupportsIndex, n_kv_heads: typing.SupportsInt | typing.SupportsIndex, head_dim: typing.SupportsInt | typing.SupportsIndex, inv_freq: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], attention_factor: typing.SupportsFloat | typing.SupportsIndex, qkv_bias: bool, o_bias: bool, causal: bool, window: typing.SupportsInt | typing.SupportsIndex = 0, softcap: typing.SupportsFloat | typing.SupportsIndex = 0.0, scale: typing.SupportsFloat | typing.SupportsIndex = 0.0, sinks: bool = False, qk_norm: bool = False, qk_norm_eps: typing.SupportsFloat | typing.SupportsIndex = 1e-06, dtype: str = 'float32', group_size: typing.SupportsInt | typing.SupportsIndex = 32, fn: str = 'MultiHeadAttention') -> None:
        ...
    def assign(self, staged: StagedWeights) -> None:
        ...
    def converted(self, dtype: str, group_size: typing.SupportsInt | typing.SupportsIndex, fn: str) -> StagedWeights:
        """
        The weight matrices converted to dtype ('int8', 'int4' in groups of group_size, or 'float32'), not yet in use: assign() swaps them in.
        """
    def forward(self, x: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], positions: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], key_mask: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8] | None, cache: KVCacheImpl, inv_freq: typing.Annotated[numpy.typing.ArrayLike, numpy.float64] | None = None) -> numpy.typing.NDArray[numpy.float32]:
        ...
    def params(self) -> dict:
        ...
    @property
    def attention_factor(self) -> float:
        ...
    @property
    def causal(self) -> bool:
        ...
    @property
    def dim(self) -> int:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def group_size(self) -> int:
        ...
    @property
    def head_dim(self) -> int:
        ...
    @property
    def inv_freq(self) -> list[float]:
        ...
    @property
    def n_heads(self) -> int:
        ...
    @property
    def n_kv_heads(self) -> int:
        ...
    @property
    def o_bias(self) -> bool:
        ...
    @property
    def qk_norm(self) -> bool:
        ...
    @property
    def qk_norm_eps(self) -> float:
        ...
    @property
    def qkv_bias(self) -> bool:
        ...
    @property
    def scale(self) -> float:
        ...
    @property
    def sinks(self) -> bool:
        ...
    @property
    def softcap(self) -> float:
        ...
    @property
    def tiled_matrices(self) -> int:
        """
        int8 matrices now stored in AMX's tile layout (a forward keeps them so where the AMX kernel runs; views show the plain layout).
        """
    @property
    def window(self) -> int:
        ...
class TransformerBlockImpl:
    def __init__(self, attention: MultiHeadAttentionImpl, feed_forward: FeedForwardImpl, attention_norm: NormImpl, ffn_norm: NormImpl, pre_norm: bool, post_attention_norm: NormImpl = None, post_ffn_norm: NormImpl = None) -> None:
        ...
    def forward(self, x: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], positions: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], key_mask: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8] | None, cache: KVCacheImpl, inv_freq: typing.Annotated[numpy.typing.ArrayLike, numpy.float64] | None = None) -> numpy.typing.NDArray[numpy.float32]:
        ...
    @property
    def attention(self) -> MultiHeadAttentionImpl:
        ...
    @property
    def attention_norm(self) -> NormImpl:
        ...
    @property
    def feed_forward(self) -> FeedForwardImpl:
        ...
    @property
    def ffn_norm(self) -> NormImpl:
        ...
    @property
    def pre_norm(self) -> bool:
        ...
class TransformerImpl:
    def __init__(self, vocab: typing.SupportsInt | typing.SupportsIndex, dim: typing.SupportsInt | typing.SupportsIndex, blocks: collections.abc.Sequence[TransformerBlockImpl], final_norm: NormImpl, tie_embeddings: bool, embed_scale: typing.SupportsFloat | typing.SupportsIndex = 0.0, final_softcap: typing.SupportsFloat | typing.SupportsIndex = 0.0, dtype: str = 'float32', head_dtype: str | None = None, group_size: typing.SupportsInt | typing.SupportsIndex = 32, fn: str = 'Transformer') -> None:
        ...
    def assign(self, staged: StagedWeights) -> None:
        ...
    def converted(self, dtype: str, group_size: typing.SupportsInt | typing.SupportsIndex, fn: str) -> StagedWeights:
        """
        The weight matrices converted to dtype ('int8', 'int4' in groups of group_size, or 'float32'), not yet in use: assign() swaps them in.
        """
    def forward(self, ids: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], positions: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], key_mask: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8] | None, caches: collections.abc.Sequence[KVCacheImpl], last_only: bool, inv_freq: typing.Annotated[numpy.typing.ArrayLike, numpy.float64] | None = None) -> numpy.typing.NDArray[numpy.float32]:
        ...
    def forward_rows(self, ids: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], positions: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], caches: collections.abc.Sequence[collections.abc.Sequence[KVCacheImpl]], inv_freq: typing.Annotated[numpy.typing.ArrayLike, numpy.float64] | None = None) -> numpy.typing.NDArray[numpy.float32]:
        ...
    def observe(self, ids: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], positions: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], key_mask: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8] | None, last_only: bool, inv_freq: typing.Annotated[numpy.typing.ArrayLike, numpy.float64] | None, weights: bool) -> tuple:
        ...
    def params(self) -> dict:
        ...
    @property
    def blocks(self) -> list[TransformerBlockImpl]:
        ...
    @property
    def dim(self) -> int:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def embed_dtype(self) -> str:
        ...
    @property
    def final_norm(self) -> NormImpl:
        ...
    @property
    def group_size(self) -> int:
        ...
    @property
    def tie_embeddings(self) -> bool:
        ...
    @property
    def tiled_matrices(self) -> int:
        """
        int8 matrices now stored in AMX's tile layout (a forward keeps them so where the AMX kernel runs; views show the plain layout).
        """
    @property
    def vocab(self) -> int:
        ...
def _attention_kv16(q: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], k: numpy.ndarray, v: numpy.ndarray, dtype: str, causal: bool = False, window: typing.SupportsInt | typing.SupportsIndex = 0, scale: typing.SupportsFloat | typing.SupportsIndex = 0.0, key_mask: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8] | None = None) -> numpy.typing.NDArray[numpy.float32]:
    """
    Attention of float32 q over K/V given as the uint16 words of bfloat16 / float16 (dtype), read the way a KV cache of that dtype is (widened in the kernel); for tests.
    """
def _exp(x: numpy.ndarray, out: numpy.ndarray) -> None:
    """
    The vectorized exp the kernels use (subnormal results flushed to 0).
    """
def _fast_attention(q: typing.Any, k: typing.Any, v: typing.Any, causal: typing.Any, scale: typing.Any, out: typing.Any, mask: typing.Any = None, window: typing.Any = None, softcap: typing.Any = None, sinks: typing.Any = None, return_weights: typing.Any = False, return_lse: typing.Any = False) -> typing.Any:
    """
    llmkernels.attention with its arguments, all checked; None when an operand needs the Python layer's conversion (see llmkernels._ops).
    """
def _fast_layer_norm(x: typing.Any, weight: typing.Any, bias: typing.Any, eps: typing.Any, out: typing.Any) -> typing.Any:
    """
    layer_norm's common case in C++, or None.
    """
def _fast_rms_norm(x: typing.Any, weight: typing.Any, eps: typing.Any, out: typing.Any) -> typing.Any:
    """
    rms_norm's common case in C++, or None (see llmkernels._ops).
    """
def _fast_rope(x: typing.Any, positions: typing.Any, theta: typing.Any, inv_freq: typing.Any, interleaved: typing.Any, rotary_dim: typing.Any, attention_factor: typing.Any, out: typing.Any, tables: typing.Any) -> typing.Any:
    """
    rope with llmkernels.rope's arguments, all checked; None when x is not a plain array, positions or inv_freq (float64) not ndarrays, or out overlaps x (see llmkernels._ops). tables(positions, inv_freq, attention_factor, dtype) -> (cos, sin), or None.
    """
def _fast_silu(x: typing.Any, out: typing.Any) -> typing.Any:
    """
    silu's common case in C++, or None.
    """
def _fast_swiglu(gate: typing.Any, up: typing.Any, out: typing.Any) -> typing.Any:
    """
    swiglu's common case in C++, or None.
    """
def _is_simd_arch_name(name: str) -> bool:
    """
    Whether LLMKERNELS_ARCH / set_simd_arch accept this spelling.
    """
def _linear(x: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], w: numpy.ndarray, dtype: str, bias: typing.Annotated[numpy.typing.ArrayLike, numpy.float32] | None = None, y: typing.Annotated[numpy.typing.ArrayLike, numpy.float32] | None = None, scales: numpy.ndarray | None = None, group: typing.SupportsInt | typing.SupportsIndex = 0) -> numpy.typing.NDArray[numpy.float32]:
    """
    y = x . w^T [+ bias] [+ y] through the modules' projection path, w (n, k) float32, the uint16 words of bfloat16 / float16 weights, or int8 / int4 codes with float16 scales and group (dtype); for tests.
    """
def _probe_dot_gops(instruction: str, threads: typing.SupportsInt | typing.SupportsIndex, iterations: typing.SupportsInt | typing.SupportsIndex) -> float:
    ...
def _probe_fma_gflops(threads: typing.SupportsInt | typing.SupportsIndex, iterations: typing.SupportsInt | typing.SupportsIndex) -> float:
    ...
def _probe_read_gbs(threads: typing.SupportsInt | typing.SupportsIndex, n: typing.SupportsInt | typing.SupportsIndex, repeats: typing.SupportsInt | typing.SupportsIndex) -> float:
    ...
def _probe_triad_gbs(threads: typing.SupportsInt | typing.SupportsIndex, n: typing.SupportsInt | typing.SupportsIndex, repeats: typing.SupportsInt | typing.SupportsIndex) -> float:
    ...
def _set_bf16_dot(path: str) -> str:
    """
    Force the path ('auto' restores the default); returns the previous one.
    """
def _set_gemm_route(route: str) -> str:
    ...
def _set_int8_dot(path: str) -> str:
    """
    Force the path ('auto' restores the default); returns the previous one.
    """
def _sigmoid(x: numpy.ndarray, out: numpy.ndarray) -> None:
    """
    The vectorized sigmoid the kernels use.
    """
def attention(q: typing.Any, k: typing.Any, v: typing.Any, causal: typing.Any, scale: typing.Any, out: typing.Any, mask: typing.Any = None, window: typing.Any = None, softcap: typing.Any = None, sinks: typing.Any = None, return_weights: typing.Any = False, return_lse: typing.Any = False) -> typing.Any:
    """
    llmkernels.attention on converted operands (C-contiguous float32/float64 q, k, v, sinks of one dtype; mask bool or of their dtype; out not overlapping them): returns out, then weights and lse if asked for (a tuple).
    """
def best_simd_arch() -> str:
    """
    The best SIMD path this CPU supports.
    """
def bf16_dot() -> str:
    """
    The bf16 dot-product path of the prefill: 'none', 'avx512bf16', 'bf16_simde', 'amx', 'amx_emu' (the native ones on a CPU with AVX512_BF16 or AMX).
    """
def dequantize(q: numpy.ndarray, scales: numpy.ndarray, bits: typing.SupportsInt | typing.SupportsIndex, group_size: typing.SupportsInt | typing.SupportsIndex) -> numpy.ndarray:
    """
    The float32 (rows, k) matrix of quantize's (q, scales) (see llmkernels.dequantize).
    """
def family_simd_archs() -> dict:
    """
    The SIMD path each kernel family runs now ('other': every kernel of no family).
    """
def get_num_threads() -> int:
    """
    Number of threads the kernels use.
    """
def int8_dot() -> str:
    """
    The int8 dot-product path of the prefill: 'none', 'vnni', 'vnni_simde', 'amx', 'amx_emu', 'avx2', 'vnni512', 'vnni512_simde' (the native ones on a CPU with AVX512_VNNI or AMX).
    """
def layer_norm(x: numpy.ndarray, weight: numpy.ndarray | None, bias: numpy.ndarray | None, eps: typing.SupportsFloat | typing.SupportsIndex, out: numpy.ndarray) -> None:
    """
    LayerNorm (biased variance) over the last axis into `out`.
    """
def openblas_config() -> str:
    ...
def quantize(w: numpy.ndarray, bits: typing.SupportsInt | typing.SupportsIndex, group_size: typing.SupportsInt | typing.SupportsIndex) -> tuple:
    """
    Group-wise quantization of w (rows, k) float32: (q, scales float16 (rows, k / group_size)); q int8 (rows, k) for bits=8, uint8 (rows, k / 2) for bits=4 (see llmkernels.quantize).
    """
def quantized_linear(x: numpy.ndarray, q: numpy.ndarray, scales: numpy.ndarray, bits: typing.SupportsInt | typing.SupportsIndex, group_size: typing.SupportsInt | typing.SupportsIndex, bias: numpy.ndarray | None = None, activations: str = 'int8') -> numpy.ndarray:
    """
    x (m, k) float32 times the quantized W (rows, k) transposed, plus bias: (m, rows) float32; activations 'float32' or 'int8' (per token, blocks of 32) for m <= 8 (see llmkernels.quantized_linear).
    """
def rms_norm(x: numpy.ndarray, weight: numpy.ndarray | None, eps: typing.SupportsFloat | typing.SupportsIndex, out: numpy.ndarray) -> None:
    """
    RMSNorm over the last axis into `out` (C-contiguous operands of one float dtype).
    """
def rope(x: numpy.ndarray, table_row: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], cos: numpy.ndarray, sin: numpy.ndarray, rotary_dim: typing.SupportsInt | typing.SupportsIndex, interleaved: bool, out: numpy.ndarray) -> None:
    """
    Rotate rows of x (..., D) using table row table_row[r] for row r.
    """
def rope_tables(positions: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], inv_freq: typing.Annotated[numpy.typing.ArrayLike, numpy.float64], attention_factor: typing.SupportsFloat | typing.SupportsIndex, dtype: numpy.dtype[typing.Any]) -> tuple:
    """
    cos/sin tables (P, len(inv_freq)) for int64 positions (P,), angles in float64.
    """
def set_num_threads(n: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    Set the number of threads the kernels (and OpenBLAS) use.
    """
def set_simd_arch(arch: str) -> None:
    """
    Force a SIMD path (must be supported by the CPU), or 'auto'.
    """
def silu(x: numpy.ndarray, out: numpy.ndarray) -> None:
    """
    out = x * sigmoid(x), elementwise.
    """
def simd_arch() -> str:
    """
    The SIMD path in use (one of isa_names).
    """
def simd_arch_automatic() -> bool:
    """
    Whether the path is the automatic choice (each kernel family on its fastest path).
    """
def swiglu(gate: numpy.ndarray, up: numpy.ndarray, out: numpy.ndarray) -> None:
    """
    out = silu(gate) * up, elementwise.
    """
def swiglu_ffn(x: numpy.ndarray, w_gate: numpy.ndarray, w_up: numpy.ndarray, w_down: numpy.ndarray | None, b_gate: numpy.ndarray | None, b_up: numpy.ndarray | None, b_down: numpy.ndarray | None) -> numpy.ndarray:
    """
    SwiGLU feed-forward of x (..., in), weights (in, out), checked (see llmkernels.swiglu_ffn).
    """
__version__: str = '0.1.0'
bf16_dot_names: tuple = ('none', 'avx512bf16', 'bf16_simde', 'amx', 'amx_emu')
compiler: str = 'GNU 12.2.0'
cpu_has_amx: bool = True
cpu_has_avx512_bf16: bool = True
cpu_has_avx512_vnni: bool = True
cpu_splits_512: bool = False
int8_dot_names: tuple = ('none', 'vnni', 'vnni_simde', 'amx', 'amx_emu', 'avx2', 'vnni512', 'vnni512_simde')
isa_names: tuple = ('sse2', 'avx2', 'avx512')
max_threads: int = 1024
xsimd_version: str = '8.1.0'
