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

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import numbers
import os
import sys
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from . import _core
from ._config import ModelConfig
from ._rope_scaling import rope_attention_factor, rope_inv_freq

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

_INIT_STD = 0.02  # HF's initializer_range

# Set while a model is built only to be overwritten by a checkpoint: the weights are allocated
# (by C++) but not randomly filled, which would cost as much time as the load itself.
_SKIP_INIT: contextvars.ContextVar[bool] = contextvars.ContextVar("_SKIP_INIT", default=False)


@contextlib.contextmanager
def _no_random_init() -> Iterator[None]:
    token = _SKIP_INIT.set(True)
    try:
        yield
    finally:
        _SKIP_INIT.reset(token)


def _to_numpy(value: Any) -> np.ndarray:
    """An array-like or torch tensor as a NumPy array; a torch bfloat16 tensor becomes an
    ``ml_dtypes.bfloat16`` array (same bits, no widening), other torch dtypes NumPy lacks
    (float8) are widened to float32 first, as a transformers user expects them to load."""
    if hasattr(value, "detach") and hasattr(value, "is_floating_point"):
        t = value.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            import ml_dtypes

            return np.asarray(t.contiguous().view(_torch_int16()).numpy()).view(ml_dtypes.bfloat16)
        if t.is_floating_point() and str(t.dtype) not in (
            "torch.float16",
            "torch.float32",
            "torch.float64",
        ):
            t = t.float()
        return np.asarray(t.numpy())
    return np.asarray(value)


def _torch_int16() -> Any:
    import torch

    return torch.int16


#: weight storage dtypes by name (what the C++ modules take), and the aliases accepted
_FLOAT_WEIGHT_DTYPES = ("float32", "bfloat16", "float16")
#: group-wise quantized storage (docs/quantization.md): name -> bits. Only these strings name
#: them: NumPy's int8 dtype object is not a quantization request.
_QUANT_DTYPES = {"int8": 8, "int4": 4}
_WEIGHT_DTYPES = _FLOAT_WEIGHT_DTYPES + tuple(_QUANT_DTYPES)
_GROUP_SIZES = (32, 64, 128)
_DTYPE_ALIASES = {
    "f32": "float32",
    "fp32": "float32",
    "bf16": "bfloat16",
    "f16": "float16",
    "fp16": "float16",
    "half": "float16",
}


def _weight_dtype(fn: str, dtype: Any, allow_none: bool = False) -> str | None:
    """``dtype`` (a name, a NumPy / ml_dtypes dtype or a torch dtype) as one of
    ``_WEIGHT_DTYPES``; None stays None when ``allow_none`` (the checkpoint's dtype), else
    float32."""
    if dtype is None:
        return None if allow_none else "float32"
    name = str(dtype).removeprefix("torch.") if not isinstance(dtype, str) else dtype
    if not isinstance(dtype, str):
        try:
            name = np.dtype(dtype).name
        except TypeError:
            pass
    name = _DTYPE_ALIASES.get(name, name)
    if name not in _WEIGHT_DTYPES or (name in _QUANT_DTYPES and not isinstance(dtype, str)):
        raise ValueError(
            f"[{fn}] dtype must be None, 'float32', 'bfloat16', 'float16', 'int8' or 'int4', "
            f"got {str(dtype)[:40]!r}"
        )
    return name


_KV_DTYPES = ("float32", "bfloat16", "float16")


def _kv_dtype(fn: str, arg: str, dtype: Any) -> str:
    """A KV cache dtype (a name, a NumPy / ml_dtypes dtype or a torch dtype; None: float32) as
    one of ``_KV_DTYPES``."""
    try:
        name = _weight_dtype(fn, dtype)
    except ValueError:
        name = None
    if name not in _KV_DTYPES:
        raise ValueError(
            f"[{fn}] {arg} must be None, 'float32', 'bfloat16' or 'float16', got "
            f"{str(dtype)[:40]!r}"
        )
    return str(name)


def _check_quant_args(fn: str, bits: Any, group_size: Any) -> tuple[int, int]:
    """``bits`` (8 or 4) and ``group_size`` (32, 64 or 128) of a quantization, checked."""
    if isinstance(bits, bool) or not isinstance(bits, numbers.Integral) or bits not in (8, 4):
        raise ValueError(f"[{fn}] bits must be 8 or 4, got {str(bits)[:40]}")
    if (
        isinstance(group_size, bool)
        or not isinstance(group_size, numbers.Integral)
        or group_size not in _GROUP_SIZES
    ):
        raise ValueError(f"[{fn}] group_size must be 32, 64 or 128, got {str(group_size)[:40]}")
    return int(bits), int(group_size)


def _check_group(fn: str, dtype: str, group_size: Any, dims: Mapping[str, int]) -> int:
    """The group size of a ``dtype`` storage (checked, 0 for float dtypes): every input
    dimension of the quantized matrices (``dims``: name -> size) must be a multiple of it."""
    if dtype not in _QUANT_DTYPES:
        return 0
    _, group = _check_quant_args(fn, _QUANT_DTYPES[dtype], group_size)
    for name, size in dims.items():
        if size % group:
            raise ValueError(
                f"[{fn}] group_size={group} does not divide {name}={size}: every projection's "
                "input dimension must be a multiple of group_size (try 32)"
            )
    return group


def _fill_matrix(own: Mapping[str, np.ndarray], base: str, w: np.ndarray, group: int) -> None:
    """Write the float matrix ``w`` into the storage of ``base`` in ``own`` (a state dict):
    ``base.weight`` (converted to its dtype), or ``base.qweight`` / ``base.scales`` quantized
    with ``group`` (the bits of :func:`llmkernels.quantize`)."""
    if base + ".weight" in own:
        np.copyto(own[base + ".weight"], w, casting="unsafe")
        return
    q, sc = _core.quantize(np.ascontiguousarray(w, dtype=np.float32), _qbits(own, base), group)
    own[base + ".qweight"][...] = q
    own[base + ".scales"][...] = sc


def _qbits(own: Mapping[str, np.ndarray], base: str) -> int:
    """The bits of the quantized matrix ``base`` of a state dict (int8 codes or uint8 pairs)."""
    return 8 if own[base + ".qweight"].dtype == np.int8 else 4


def _quant_sources(
    fn: str, own: Mapping[str, np.ndarray], given: Mapping[str, Any], group: int
) -> tuple[dict[str, Any], list[str]]:
    """For a module storing quantized matrices: the entries of ``given`` (a state dict being
    loaded) with each float ``X.weight`` of a quantized matrix replaced by its quantized
    ``X.qweight`` / ``X.scales`` (so an HF float state dict loads into an int8 / int4 module),
    and the keys so produced."""
    out: dict[str, Any] = {}
    made: list[str] = []
    for key, value in given.items():
        base = key[: -len(".weight")] if key.endswith(".weight") else None
        if base is None or key in own or base + ".qweight" not in own:
            out[key] = value
            continue
        if base + ".qweight" in given or base + ".scales" in given:
            raise KeyError(
                f"[{fn}] {key} and {base}.qweight / {base}.scales are the same matrix: give one "
                "of them"
            )
        try:
            w = np.ascontiguousarray(_to_numpy(value), dtype=np.float32)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(f"[{fn}] {key}: cannot read as an array ({exc})") from None
        rows = own[base + ".qweight"].shape[0]
        k = own[base + ".scales"].shape[1] * group
        if w.shape != (rows, k):
            raise ValueError(f"[{fn}] {key}: expected shape {(rows, k)}, got {w.shape}")
        try:
            q, sc = _core.quantize(w, _qbits(own, base), group)
        except ValueError as exc:
            raise ValueError(f"[{fn}] {key}: {exc}") from None
        out[base + ".qweight"], out[base + ".scales"] = q, sc
        made += [base + ".qweight", base + ".scales"]
    return out, made


def _convert_parts(
    fn: str, parts: Sequence[tuple[Any, dict[str, int]]], dtype: str, group: int
) -> None:
    """Convert the matrices of C++ modules ``parts`` ((impl, input dims) pairs) to ``dtype``
    ('int8' / 'int4' in groups of ``group``, or 'float32'), all or none: every new matrix is
    made (and checked) before any replaces the old ones, so bad weights (NaN, Inf, beyond
    float16 scales) raise ``ValueError("[fn] ...")`` and change nothing. Modules already in
    ``dtype`` are left as they are; an int8 module is not re-quantized to int4 (or to another
    group size): quantize the float module."""
    if dtype in _QUANT_DTYPES:
        for _, dims in parts:
            _check_group(fn, dtype, group, dims)
    todo = []
    for impl, _ in parts:
        cur = str(impl.dtype)
        if cur == dtype and (dtype not in _QUANT_DTYPES or impl.group_size == group):
            continue
        if cur in _QUANT_DTYPES and dtype in _QUANT_DTYPES:
            raise ValueError(
                f"[{fn}] the weights are already {cur} (group_size {impl.group_size}): "
                f"quantize the float model to {dtype} (group_size {group}) instead"
            )
        todo.append(impl)
    staged = [impl.converted(dtype, group, fn) for impl in todo]
    for impl, new in zip(todo, staged, strict=True):
        impl.assign(new)


def _rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(seed)


def _positive_int(cls: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"[{cls}] {name} must be a positive int, got {value!r}")
    if value > 1 << 24:
        raise ValueError(f"[{cls}] {name} = {value} is too large (limit 2**24)")
    return int(value)


def _positive_real(cls: str, name: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not (0 < value < float("inf"))
    ):
        raise ValueError(f"[{cls}] {name} must be a finite number > 0, got {str(value)[:40]}")
    try:
        return float(value)
    except OverflowError:  # an int like 10**400
        raise ValueError(f"[{cls}] {name} is too large, got {str(value)[:40]}") from None


def _check_eps(cls: str, eps: Any) -> float:
    # compared before float(): an int like 10**400 has no float (OverflowError)
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not (0 <= eps < 1):
        raise ValueError(f"[{cls}] eps must be a number in [0, 1), got {str(eps)[:40]}")
    return float(eps)


def _from_impl(attr: str) -> Any:
    """A read-only property that reads ``attr`` of the module's C++ object (``self._impl``)."""
    return property(lambda self: getattr(self._impl, attr), doc=f"``{attr}`` of the C++ module.")


class _Module:
    """State-dict plumbing shared by the modules: ``_impl.params()`` gives zero-copy views."""

    _name = "Module"

    def _own_params(self) -> dict[str, np.ndarray]:
        return dict(self._impl.params())  # type: ignore[attr-defined]

    def _children(self) -> Iterator[tuple[str, _Module]]:
        return iter(())

    def _quant_parts(self) -> list[tuple[Any, dict[str, int]]]:
        """The C++ modules holding this module's projection matrices, with the input
        dimensions of those matrices (what a quantization group must divide)."""
        return []

    def _group_size(self) -> int:
        """The group size of the quantized matrices (0: float weights)."""
        parts = self._quant_parts()
        return int(parts[0][0].group_size) if parts else 0

    def quantize(self, bits: int = 8, group_size: int = 32) -> Any:
        """Quantize the projection matrices in place, group-wise along the input dimension
        (docs/quantization.md): ``bits=8`` (int8) or ``4`` (int4, llama.cpp's Q4_0 layout),
        ``group_size`` 32, 64 or 128 (it must divide every projection's input dimension). A
        model's LM head is quantized too; embeddings, norms and biases stay float. All matrices
        are converted, or none (a ``ValueError`` for NaN / Inf weights). State-dict views taken
        before stay valid (they show the old float matrices). Returns the module.

        Examples:
            >>> import llmkernels as lk, numpy as np
            >>> ffn = lk.FeedForward(64, 128, seed=0).quantize(bits=8, group_size=32)
            >>> ffn.dtype, sorted(ffn.state_dict())[:2]
            ('int8', ['down_proj.qweight', 'down_proj.scales'])
        """
        fn = f"{self._name}.quantize"
        bits, group = _check_quant_args(fn, bits, group_size)
        _convert_parts(fn, self._quant_parts(), f"int{bits}", group)
        return self

    def state_dict(self, prefix: str = "") -> dict[str, np.ndarray]:
        """Parameters by HF name, as NumPy views of the C++ storage in its dtype (no copy:
        writing to them changes the module): float32, or the module's ``dtype`` for projection
        and embedding matrices (``ml_dtypes.bfloat16`` or ``np.float16``)."""
        out = {prefix + k: v for k, v in self._own_params().items()}
        for name, child in self._children():
            out.update(child.state_dict(prefix + name + "."))
        return out

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        """Copy weights in (any array-likes, e.g. ``{k: v.numpy() for k, v in hf.items()}``).

        Every given tensor is checked for its expected shape before anything is copied, so a
        failed call changes nothing. ``strict``: missing and unexpected keys are errors.
        """
        own = self.state_dict()
        group = self._group_size()
        if group:  # float X.weight entries quantized into X.qweight / X.scales
            state_dict, _ = _quant_sources(f"{self._name}.load_state_dict", own, state_dict, group)
        unexpected = [k for k in state_dict if k not in own]
        missing = [k for k in own if k not in state_dict]
        if strict and (unexpected or missing):
            parts = []
            if missing:
                parts.append(f"missing keys {missing}")
            if unexpected:
                parts.append(f"unexpected keys {unexpected}")
            raise KeyError(f"[{self._name}.load_state_dict] " + "; ".join(parts))
        staged: list[tuple[np.ndarray, np.ndarray]] = []
        for key, value in state_dict.items():
            if key not in own:
                continue
            try:
                arr = _to_numpy(value)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise TypeError(
                    f"[{self._name}.load_state_dict] {key}: cannot read as an array ({exc})"
                ) from None
            if arr.dtype.kind not in "fiu" and arr.dtype.name != "bfloat16":
                raise TypeError(
                    f"[{self._name}.load_state_dict] {key}: dtype {arr.dtype} is not a real number"
                )
            if arr.shape != own[key].shape:
                raise ValueError(
                    f"[{self._name}.load_state_dict] {key}: expected shape {own[key].shape}, "
                    f"got {arr.shape}"
                )
            if key.endswith((".qweight", ".scales")) and arr.dtype != own[key].dtype:
                # quantized codes and scales are bits: copied as they are, never cast
                raise TypeError(
                    f"[{self._name}.load_state_dict] {key}: dtype {arr.dtype}, expected "
                    f"{own[key].dtype} (quantized layout, docs/quantization.md)"
                )
            if key.endswith(".scales") and not np.isfinite(arr).all():
                row, group = (int(i) for i in np.argwhere(~np.isfinite(arr))[0])
                raise ValueError(
                    f"[{self._name}.load_state_dict] {key} holds {arr[row, group]} at row {row}, "
                    f"group {group}: quantization scales must be finite"
                )
            staged.append((own[key], arr))
        for dst, src in staged:
            np.copyto(dst, src, casting="unsafe")

    def _init_random(self, rng: np.random.Generator) -> None:
        if _SKIP_INIT.get():
            return
        own = self.state_dict()
        group = self._group_size()
        for key, arr in own.items():
            if key.endswith("layernorm.weight") or key.endswith("norm.weight") or key == "weight":
                continue  # the C++ norms start as the identity (1, or 0 for a 1 + weight norm)
            elif key.endswith("bias"):
                arr[...] = 0.0
            elif key.endswith(".scales"):
                continue  # written with its .qweight
            elif key.endswith(".qweight"):
                # the float matrix the float module would draw (same numbers, same order),
                # quantized: Module(..., dtype="int8", seed=s) == Module(..., seed=s).quantize()
                base = key[: -len(".qweight")]
                shape = (arr.shape[0], own[base + ".scales"].shape[1] * group)
                w = rng.standard_normal(shape, dtype=np.float32) * _INIT_STD
                _fill_matrix(own, base, w, group)
            else:
                arr[...] = rng.standard_normal(arr.shape, dtype=np.float32) * _INIT_STD


_F32 = np.dtype(np.float32)


def _as_f32(cls: str, name: str, x: Any, last: int) -> np.ndarray:
    # the common case first: a C-contiguous native float32 array is passed on as is (the C++
    # forward checks its shape again)
    if (
        type(x) is np.ndarray
        and x.dtype == _F32
        and x.flags.c_contiguous
        and x.ndim >= 1
        and x.shape[-1] == last
    ):
        return x
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"[{cls}] {name} has unsupported dtype {arr.dtype}")
    if arr.ndim < 1 or arr.shape[-1] != last:
        raise ValueError(f"[{cls}] {name} must have shape (..., {last}), got {arr.shape}")
    return np.ascontiguousarray(arr, dtype=np.float32)


# ----------------------------------------------------------------------------------------------
# norms and feed-forward
# ----------------------------------------------------------------------------------------------


class RMSNorm(_Module):
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
            _positive_int(self._name, "dim", dim), _check_eps(self._name, eps), bool(unit_offset)
        )

    dim = _from_impl("dim")
    eps = _from_impl("eps")

    def __call__(self, x: Any) -> np.ndarray:
        """``(..., dim)`` float32 -> same shape."""
        return self._impl.forward(_as_f32(self._name, "x", x, self.dim))

    def __repr__(self) -> str:
        return f"RMSNorm(dim={self.dim}, eps={self.eps})"


class LayerNorm(_Module):
    """LayerNorm over the last axis (biased variance); weight and optional bias ``(dim,)``.

    Examples:
        >>> import llmkernels as lk, numpy as np
        >>> np.round(lk.LayerNorm(3, eps=0.0)(np.array([[1.0, 2.0, 3.0]], np.float32)), 4)
        array([[-1.2247,  0.    ,  1.2247]], dtype=float32)
    """

    _name = "LayerNorm"

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True) -> None:
        self._impl = _core.LayerNormImpl(
            _positive_int(self._name, "dim", dim), _check_eps(self._name, eps), bool(bias)
        )

    dim = _from_impl("dim")

    def __call__(self, x: Any) -> np.ndarray:
        return self._impl.forward(_as_f32(self._name, "x", x, self.dim))

    def __repr__(self) -> str:
        return f"LayerNorm(dim={self.dim}, eps={self._impl.eps}, bias={self._impl.has_bias})"


def _make_norm(kind: str, dim: int, eps: float, unit_offset: bool = False) -> RMSNorm | LayerNorm:
    if kind == "rms":
        return RMSNorm(dim, eps, unit_offset=unit_offset)
    if kind == "layer":
        return LayerNorm(dim, eps)
    raise ValueError(f"[TransformerBlock] norm must be 'rms' or 'layer', got {kind!r}")


class FeedForward(_Module):
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
        wdtype = _weight_dtype(self._name, dtype)
        if activation not in ("silu", "gelu_tanh"):
            raise ValueError(
                f"[{self._name}] activation must be 'silu' (SwiGLU) or 'gelu_tanh' (GeGLU), "
                f"got {str(activation)[:40]!r}"
            )
        dim = _positive_int(self._name, "dim", dim)
        hidden_dim = _positive_int(self._name, "hidden_dim", hidden_dim)
        group = _check_group(self._name, wdtype, group_size, {"dim": dim, "hidden_dim": hidden_dim})
        self._impl = _core.FeedForwardImpl(
            dim, hidden_dim, bool(bias), activation == "gelu_tanh", wdtype, group or 32
        )
        # Phi-3 names the [gate; up] weight as one tensor, gate_up_proj: the module's storage
        self._impl.fused_names = bool(fused_names)
        self._init_random(_rng(seed))

    dim = _from_impl("dim")
    hidden_dim = _from_impl("hidden")
    dtype = _from_impl("dtype")

    def _quant_parts(self) -> list[tuple[Any, dict[str, int]]]:
        return [(self._impl, {"dim": self.dim, "hidden_dim": self.hidden_dim})]

    def __call__(self, x: Any) -> np.ndarray:
        arr = _as_f32(self._name, "x", x, self.dim)
        return self._impl.forward(arr.reshape(-1, self.dim)).reshape(arr.shape)

    def __repr__(self) -> str:
        return f"FeedForward(dim={self.dim}, hidden_dim={self.hidden_dim})"


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
            _positive_int("KVCache", name, v)
        kv_dtype = _kv_dtype("KVCache", "dtype", dtype)
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
        _LIVE_CACHES.add(self)

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

    batch = _from_impl("batch")
    max_seq_len = _from_impl("max_len")
    length = _from_impl("length")
    window = _from_impl("window")
    dtype = _from_impl("dtype")  # "float32", "bfloat16" or "float16"
    nbytes = _from_impl("nbytes")  # of the key and value storage (all slots)

    def keys(self) -> np.ndarray:
        """``(B, Hkv, length, head_dim)`` view of the cached (rotated) keys, in the cache's
        dtype."""
        return self._impl.keys()

    def values(self) -> np.ndarray:
        """``(B, Hkv, length, head_dim)`` view of the cached values, in the cache's dtype."""
        return self._impl.values()

    def reset(self) -> None:
        _check_not_torn(self, "KVCache.reset")
        with self._lock:
            self._pending = None
            self._impl.reset()
            self._next[:] = 0

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
        _LIVE_CACHES.add(self)

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

    def reset(self) -> None:
        _check_not_torn(self, "ModelCache.reset")
        with self._lock:
            for c in self.layers:
                c.reset()


def _holding(cache: KVCache | ModelCache | None, cls: str) -> Any:
    """The cache's lock as a context manager (nothing without a cache)."""
    if cache is None:
        return contextlib.nullcontext()
    _check_not_torn(cache, cls)
    return cache._lock


# Caches, so that a forked child can tell the ones another thread of the parent was writing at
# the fork: their lock (and the C++ mutex inside) stays held in the child, where that thread does
# not exist, and their keys and values are half written. They raise there instead of hanging.
_LIVE_CACHES: weakref.WeakSet[Any] = weakref.WeakSet()


# RoPE schedules with state (dynamic NTK), whose lock another thread of the parent may hold at
# the fork: in the child a new lock and the state it guarded (perhaps half updated) reset
_LIVE_SCHEDULES: weakref.WeakSet[Any] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for schedule in list(_LIVE_SCHEDULES):
        if schedule._lock.locked():
            schedule._lock = threading.Lock()
            schedule.cached_len, schedule.current = schedule.original, None
    for cache in list(_LIVE_CACHES):
        if cache._lock.locked():
            cache._lock = threading.Lock()
            cache._torn = True
            for layer in getattr(cache, "layers", ()):
                layer._torn = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _check_not_torn(cache: KVCache | ModelCache, cls: str) -> None:
    if cache._torn:
        raise RuntimeError(
            f"[{cls}] cache: another thread was writing it when this process forked, so its keys "
            "and values are undefined here (and its lock belongs to a thread that does not "
            "exist): make a new cache in this process"
        )


# Positions are bounded so that a cache's next position (max + 1) never wraps int64.
_MAX_POSITION = 2**62


@functools.lru_cache(maxsize=64)
def _default_positions(batch: int, seq: int) -> np.ndarray:
    pos = np.ascontiguousarray(np.broadcast_to(np.arange(seq, dtype=np.int64), (batch, seq)))
    pos.flags.writeable = False
    return pos


def _positions_and_mask(
    cls: str, batch: int, seq: int, positions: Any, mask: Any, cache: KVCache | ModelCache | None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(B, T) int64 positions, (B, T) uint8 key mask or None, and the next positions for the
    cache. Default positions: the cache's next position per sequence + the count of real tokens
    before each one (HF's cumsum(attention_mask) - 1 convention for padded batches)."""
    if mask is None and positions is None and cache is None:
        # the stateless forward: arange(T) per sequence, shared read-only between calls
        return _default_positions(batch, seq), None, None
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
        if pos.size and pos.max() > _MAX_POSITION:
            raise ValueError(f"[{cls}] positions must be <= 2**62, got {pos.max()}")
    pos = np.ascontiguousarray(pos, dtype=np.int64)
    if positions is None and pos.size and pos.max() > _MAX_POSITION:
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


class _RopeSchedule:
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
            _LIVE_SCHEDULES.add(self)

    def frequencies(self, positions: np.ndarray) -> np.ndarray | None:
        if self.kind == "static" or positions.size == 0:
            return None
        seq_len = int(positions.max()) + 1
        if self.kind == "longrope":
            return rope_inv_freq(self.head_dim, self.theta, self.scaling, seq_len=seq_len)
        with self._lock:  # the state and the frequencies returned change together
            if seq_len > self.cached_len:  # dynamic: grow
                self.cached_len = seq_len
                self.current = rope_inv_freq(
                    self.head_dim, self.theta, self.scaling, seq_len=seq_len
                )
            elif seq_len < self.original < self.cached_len:  # back to the original frequencies
                self.cached_len = self.original
                self.current = None
            return self.current


class MultiHeadAttention(_Module):
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
        wdtype = _weight_dtype(self._name, dtype)
        dim = _positive_int(self._name, "dim", dim)
        window = 0 if window is None else min(_positive_int(self._name, "window", window), 2**62)
        softcap = 0.0 if softcap is None else _positive_real(self._name, "softcap", softcap)
        scale = 0.0 if scale is None else _positive_real(self._name, "scale", scale)
        n_heads = _positive_int(self._name, "n_heads", n_heads)
        n_kv = (
            n_heads if n_kv_heads is None else _positive_int(self._name, "n_kv_heads", n_kv_heads)
        )
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
        head_dim = _positive_int(self._name, "head_dim", head_dim)
        if head_dim % 2:
            raise ValueError(f"[{self._name}] head_dim must be even (RoPE), got {head_dim}")
        group = _check_group(
            self._name, wdtype, group_size, {"dim": dim, "n_heads * head_dim": n_heads * head_dim}
        )
        scaling = dict(rope_scaling) if rope_scaling else None
        inv_freq = rope_inv_freq(head_dim, float(rope_theta), scaling)
        factor = rope_attention_factor(scaling) if scaling else 1.0
        self.rope_theta = float(rope_theta)
        self.rope_scaling = scaling
        self._rope = _RopeSchedule(head_dim, float(rope_theta), scaling)
        self._impl = _core.MultiHeadAttentionImpl(
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
            _check_eps(self._name, qk_norm_eps),
            wdtype,
            group or 32,
        )
        self._impl.fused_names = bool(fused_names)
        self._init_random(_rng(seed))

    dim = _from_impl("dim")
    n_heads = _from_impl("n_heads")
    n_kv_heads = _from_impl("n_kv_heads")
    head_dim = _from_impl("head_dim")
    dtype = _from_impl("dtype")

    def _quant_parts(self) -> list[tuple[Any, dict[str, int]]]:
        return [(self._impl, {"dim": self.dim, "n_heads * head_dim": self.n_heads * self.head_dim})]

    def new_cache(self, batch: int, max_seq_len: int, dtype: Any = None) -> KVCache:
        """An empty KV cache for ``batch`` sequences of up to ``max_seq_len`` tokens (a rolling
        buffer of ``window`` slots for a sliding-window layer), storing keys and values in
        ``dtype``: ``"float32"`` (default), ``"bfloat16"`` or ``"float16"`` (see
        :class:`KVCache`)."""
        kv_dtype = _kv_dtype("new_cache", "dtype", dtype)
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
        return _locked_forward(self, self._rope, x, positions, mask, cache)

    def __repr__(self) -> str:
        return (
            f"MultiHeadAttention(dim={self.dim}, n_heads={self.n_heads}, "
            f"n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim})"
        )


def _locked_forward(
    module: MultiHeadAttention | TransformerBlock,
    rope: _RopeSchedule,
    x: Any,
    positions: Any,
    mask: Any,
    cache: KVCache | None,
) -> np.ndarray:
    """The forward of :class:`MultiHeadAttention` and :class:`TransformerBlock` (one C++ call,
    ``module._impl.forward``): ``x (B, T, dim)`` checked, the cache held from reading its
    positions to advancing them, the RoPE frequencies of the positions from ``rope``."""
    name = module._name
    arr = _check_btd(name, x, module.dim)
    b, t, _ = arr.shape
    _check_cache(name, cache, b, t)
    with _holding(cache, name):  # positions continue from the previous call on this cache
        _check_cache(name, cache, b, t)
        pos, key_mask, nxt = _positions_and_mask(name, b, t, positions, mask, cache)
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
    return y


def _check_btd(cls: str, x: Any, dim: int) -> np.ndarray:
    arr = _as_f32(cls, "x", x, dim)
    if arr.ndim != 3:
        raise ValueError(f"[{cls}] x must have shape (B, T, {dim}), got {arr.shape}")
    return arr


def _check_layers_in_step(cls: str, cache: ModelCache) -> None:
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


def _check_cache(cls: str, cache: Any, batch: int, seq: int) -> None:
    if cache is None:
        return
    if not isinstance(cache, KVCache):
        raise TypeError(
            f"[{cls}] cache must be a KVCache (from new_cache), got {type(cache).__name__}"
        )
    if cache.batch != batch:
        raise ValueError(f"[{cls}] cache holds {cache.batch} sequences, the input has {batch}")
    if cache.length + seq > cache.max_seq_len:
        raise ValueError(
            f"[{cls}] KV cache is full: {cache.length} cached + {seq} new tokens > "
            f"max_seq_len {cache.max_seq_len}"
        )


# ----------------------------------------------------------------------------------------------
# block and model
# ----------------------------------------------------------------------------------------------


def _input_dims(c: ModelConfig) -> dict[str, int]:
    """The input dimensions of a model's projections (a quantization group must divide them)."""
    return {"dim": c.dim, "n_heads * head_dim": c.n_heads * c.head_dim, "hidden_dim": c.hidden_dim}


def _block_config(config: Mapping[str, Any] | ModelConfig) -> ModelConfig:
    if isinstance(config, ModelConfig):
        return config
    d = dict(config)
    hf = "hidden_size" in d or "num_attention_heads" in d
    if not hf:  # a block alone needs no vocabulary or layer count
        d.setdefault("n_layers", 1)
        d.setdefault("vocab_size", 1)
    return ModelConfig.from_dict(d)


class TransformerBlock(_Module):
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
        wdtype = _weight_dtype("TransformerBlock", dtype)
        c = _block_config(config)
        _check_group("TransformerBlock", wdtype, group_size, _input_dims(c))
        norm = functools.partial(_make_norm, c.norm, c.dim, c.norm_eps, c.norm_unit_offset)
        sandwich = c.norm_position == "sandwich"
        rng = _rng(seed)
        seeds = rng.integers(0, 2**63 - 1, size=2)
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
                fused_names=c.fused_projections,
                qk_norm=c.qk_norm,
                qk_norm_eps=c.norm_eps,
                dtype=wdtype,
                group_size=group_size,
                seed=int(seeds[0]),
            ),
            feed_forward=FeedForward(
                c.dim,
                c.hidden_dim,
                bias=c.mlp_bias,
                fused_names=c.fused_projections,
                activation=c.activation,
                dtype=wdtype,
                group_size=group_size,
                seed=int(seeds[1]),
            ),
            attention_norm=norm(),
            ffn_norm=norm(),
            post_attention_norm=norm() if sandwich else None,
            post_ffn_norm=norm() if sandwich else None,
            norm_position=c.norm_position,
        )

    def _own_params(self) -> dict[str, np.ndarray]:
        return {}

    def _quant_parts(self) -> list[tuple[Any, dict[str, int]]]:
        return self.attention._quant_parts() + self.feed_forward._quant_parts()

    def _children(self) -> Iterator[tuple[str, _Module]]:
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
        return _locked_forward(self, self.attention._rope, x, positions, mask, cache)

    def __repr__(self) -> str:
        return (
            f"TransformerBlock({self.attention!r}, {self.feed_forward!r}, "
            f"norm={self.attention_norm!r}, norm_position={self.norm_position!r})"
        )


def _token_ids(config_path: str) -> dict[str, Any]:
    """bos / eos / pad token ids of an HF config.json (ints, lists of ints or null), for
    save_pretrained to write back; {} when the file has none (or cannot be read again)."""
    import json

    try:
        with open(config_path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return {}
    out: dict[str, Any] = {}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = d.get(key, ...) if isinstance(d, dict) else ...
        ok = v is None or (isinstance(v, int) and not isinstance(v, bool))
        ok = ok or (isinstance(v, list) and all(type(i) is int for i in v))
        if v is not ... and ok:
            out[key] = v
    return out


class _QuantizingSink:
    """Where :meth:`Transformer.from_pretrained` puts a float checkpoint matrix stored as
    int8 / int4: the loader hands it the matrix a few rows at a time (``write_rows``), each
    slice widened to float32 and quantized into the module's codes and scales (the bits of
    :func:`llmkernels.quantize`) -- never a float32 copy of the matrix."""

    def __init__(self, key: str, qweight: np.ndarray, scales: np.ndarray, group: int) -> None:
        self.key, self.qweight, self.scales, self.group = key, qweight, scales, group
        self.bits = 8 if qweight.dtype == np.int8 else 4
        self.shape = (qweight.shape[0], scales.shape[1] * group)

    def write_rows(self, r0: int, piece: np.ndarray) -> None:
        rows = np.ascontiguousarray(piece, dtype=np.float32).reshape(-1, self.shape[1])
        try:
            q, sc = _core.quantize(rows, self.bits, self.group)
        except ValueError as exc:
            msg = str(exc).removeprefix("[quantize] ")
            raise ValueError(f"[from_pretrained] {self.key} (from row {r0}): {msg}") from None
        self.qweight[r0 : r0 + len(rows)] = q
        self.scales[r0 : r0 + len(rows)] = sc


class Transformer(_Module):
    """A LLaMA-style decoder: token embedding, ``n_layers`` blocks, final norm, LM head (tied to
    the embedding when ``tie_embeddings``). State-dict keys are HF ``LlamaForCausalLM``'s.

    Examples:
        >>> import llmkernels as lk, numpy as np
        >>> model = lk.Transformer({"dim": 16, "n_layers": 2, "n_heads": 2, "hidden_dim": 32,
        ...                         "vocab_size": 50}, seed=0)
        >>> model(np.array([[1, 2, 3]])).shape, model.generate([1, 2, 3], 4, progress=False).shape
        ((1, 3, 50), (1, 7))
    """

    _name = "Transformer"
    # bos / eos / pad ids of the checkpoint loaded (from_pretrained), written by save_pretrained
    _token_ids: dict[str, Any] = {}  # noqa: RUF012 - replaced, never mutated

    def __init__(
        self,
        config: Mapping[str, Any] | ModelConfig,
        *,
        seed: int | None = None,
        dtype: Any = None,
        group_size: int = 32,
        embed_dtype: Any = None,
    ) -> None:
        """``dtype``: storage of the projection and embedding matrices (float32, bfloat16,
        float16), or ``"int8"`` / ``"int4"``: projections and LM head quantized in groups of
        ``group_size`` (32, 64, 128) along the input dimension, the embedding stored as
        ``embed_dtype`` (default float32; a float ``dtype`` is used for both)."""
        wdtype = _weight_dtype(self._name, dtype)
        c = config if isinstance(config, ModelConfig) else ModelConfig.from_dict(config)
        quantized = wdtype in _QUANT_DTYPES
        group = _check_group(self._name, str(wdtype), group_size, _input_dims(c))
        edtype = _weight_dtype(self._name, embed_dtype) if quantized else wdtype
        if edtype in _QUANT_DTYPES:
            raise ValueError(f"[{self._name}] embed_dtype must be a float dtype, got {edtype!r}")
        self.config = c
        rng = _rng(seed)
        self.blocks = [
            TransformerBlock.from_config(
                c, seed=int(s), layer=i, dtype=wdtype, group_size=group or 32
            )
            for i, s in enumerate(rng.integers(0, 2**63 - 1, size=c.n_layers))
        ]
        self.norm = _make_norm(c.norm, c.dim, c.norm_eps, c.norm_unit_offset)
        self._impl = _core.TransformerImpl(
            c.vocab_size,
            c.dim,
            [b._impl for b in self.blocks],
            self.norm._impl,
            c.tie_embeddings,
            float(np.float32(np.sqrt(c.dim))) if c.embed_scale else 0.0,
            c.final_softcap or 0.0,
            edtype,
            wdtype,
            group or 32,
        )
        if not _SKIP_INIT.get():
            own = self._own_params()
            emb = rng.standard_normal((c.vocab_size, c.dim), dtype=np.float32) * _INIT_STD
            np.copyto(own["model.embed_tokens.weight"], emb, casting="unsafe")
            if c.tie_embeddings:
                if quantized:  # the quantized LM head is a quantized copy of the embedding
                    self._impl.assign(self._impl.converted(wdtype, group, self._name))
            else:
                w = rng.standard_normal((c.vocab_size, c.dim), dtype=np.float32) * _INIT_STD
                _fill_matrix(own, "lm_head", w, group)
        # one rotary schedule for the whole model, as HF's LlamaModel.rotary_emb
        self._rope = _RopeSchedule(c.head_dim, c.rope_theta, c.rope_scaling_dict())

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        """As :meth:`_Module.load_state_dict`; with tied embeddings ``lm_head.weight`` (which HF
        lists too) is optional and, when given, must equal ``model.embed_tokens.weight``.

        A quantized model takes its own layout (``X.qweight`` / ``X.scales``, copied bit for
        bit) or float ``X.weight`` matrices, which are quantized as they are loaded (with tied
        embeddings the quantized LM head is then made from the embedding)."""
        sd = dict(state_dict)
        if self.config.tie_embeddings and self.dtype in _QUANT_DTYPES:
            fn = "Transformer.load_state_dict"
            head = sd.pop("lm_head.weight", None)
            emb = sd.get("model.embed_tokens.weight")
            if head is not None and emb is not None:
                if not np.array_equal(_to_numpy(head), _to_numpy(emb)):
                    raise ValueError(
                        f"[{fn}] lm_head.weight: embeddings are tied, so it must equal "
                        "model.embed_tokens.weight"
                    )
            # the quantized head follows a new embedding unless its own codes are given
            remake = emb is not None and "lm_head.qweight" not in sd and "lm_head.scales" not in sd
            own = self.state_dict()
            sd, _ = _quant_sources(fn, own, sd, self._group_size())
            derived = {"lm_head.qweight", "lm_head.scales"} if remake else set()
            missing = [k for k in own if k not in sd and k not in derived]
            unexpected = [k for k in sd if k not in own]
            if strict and (missing or unexpected):
                raise KeyError(f"[{fn}] missing keys {missing}; unexpected keys {unexpected}")
            if remake:  # the head is made from the new embedding: check that it can be, first
                stored = own["model.embed_tokens.weight"].dtype  # as the model will hold it
                with np.errstate(over="ignore"):
                    e = np.asarray(_to_numpy(emb)).astype(stored).astype(np.float32)
                try:
                    _core.quantize(e, _QUANT_DTYPES[self.dtype], self._group_size())
                except ValueError as exc:
                    raise ValueError(
                        f"[{fn}] lm_head (the tied embedding) cannot be quantized: "
                        f"{str(exc).removeprefix('[quantize] ')}"
                    ) from None
            super().load_state_dict(sd, strict=False)
            if remake:
                self._impl.assign(self._impl.converted(self.dtype, self._group_size(), fn))
            return
        if self.config.tie_embeddings:
            head = sd.pop("lm_head.weight", None)
            emb = sd.get("model.embed_tokens.weight")
            if head is not None:
                head_arr = _to_numpy(head)
                emb_arr = (
                    _to_numpy(emb)
                    if emb is not None
                    else self.state_dict()["model.embed_tokens.weight"]
                )
                if head_arr.shape != emb_arr.shape or not np.array_equal(head_arr, emb_arr):
                    raise ValueError(
                        "[Transformer.load_state_dict] lm_head.weight: embeddings are tied, so it "
                        "must equal model.embed_tokens.weight"
                    )
            own = self.state_dict()
            own.pop("lm_head.weight")
            missing = [k for k in own if k not in sd]
            unexpected = [k for k in sd if k not in own]
            if strict and (missing or unexpected):
                raise KeyError(
                    f"[Transformer.load_state_dict] missing keys {missing}; unexpected keys "
                    f"{unexpected}"
                )
            super().load_state_dict(
                sd | {"lm_head.weight": sd["model.embed_tokens.weight"]}
                if "model.embed_tokens.weight" in sd
                else sd,
                strict=False,
            )
            return
        super().load_state_dict(sd, strict=strict)

    def _children(self) -> Iterator[tuple[str, _Module]]:
        for i, block in enumerate(self.blocks):
            yield f"model.layers.{i}", block
        yield "model.norm", self.norm

    def _quant_parts(self) -> list[tuple[Any, dict[str, int]]]:
        parts = [p for block in self.blocks for p in block._quant_parts()]
        return parts + [(self._impl, {"dim": self.config.dim})]

    def _group_size(self) -> int:
        return int(self._impl.group_size)

    @property
    def quantization(self) -> dict[str, int] | None:
        """``{"bits": 8 | 4, "group_size": 32 | 64 | 128}`` for a quantized model, else None."""
        if self.dtype not in _QUANT_DTYPES:
            return None
        return {"bits": _QUANT_DTYPES[self.dtype], "group_size": self._group_size()}

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        dtype: Any = None,
        group_size: int | None = None,
        progress: bool | None = None,
    ) -> Transformer:
        """Load an HF LLaMA checkpoint directory: ``config.json`` and ``model.safetensors`` (or
        shards with ``model.safetensors.index.json``). Never unpickles; the config and every
        tensor (key, dtype, shape, offsets) are checked from the headers before the model is
        built, so a bad file raises a clear error and nothing is allocated for a config the
        files do not back. The model is then built without random initialisation and each
        tensor is read straight into its storage (bf16/f16 widened chunk by chunk): peak memory
        is the model plus a few MiB.

        ``dtype``: storage of the projection and embedding matrices. ``None`` (default) keeps
        the checkpoint's: bf16 stays bf16 and f16 stays f16 (when every such matrix has that
        dtype; otherwise float32) -- no widened copy. ``"float32"``, ``"bfloat16"`` or
        ``"float16"`` converts while loading, tensor by tensor (round to nearest even).
        ``"int8"`` / ``"int4"`` quantizes the projections and the LM head while loading, a few
        rows at a time (never a float32 copy of a matrix, let alone of the model), in groups of
        ``group_size`` (default 32); the embedding keeps the checkpoint's float dtype. The
        result is bit-identical to loading in float32 and calling :meth:`quantize`. A
        checkpoint written by :meth:`save_pretrained` from a quantized model (its config has
        a ``quantization_config``) loads as it was saved (``dtype`` None or its own).
        Norms and biases are float32 in every case. ``progress``: a tqdm bar over the bytes read
        (default: on for checkpoints over 256 MiB when stderr is a terminal).
        """
        from ._safetensors import (
            DTYPE_NAMES,
            check_finite_scales,
            checkpoint_weight_dtype,
            is_quantized_key,
            load_into,
            read_pretrained,
        )

        fn = "from_pretrained"
        wdtype = _weight_dtype(fn, dtype, allow_none=True)
        if group_size is not None:
            _check_quant_args(fn, 8, group_size)
        path = _checkpoint_dir(path)
        # config and every tensor's key/shape are checked against the headers before any data
        # is read or any weights are allocated
        config, located, quant = read_pretrained(path, with_quantization=True)
        group = 0
        edtype = None
        if quant is not None:  # a quantized checkpoint (save_pretrained of an int8/int4 model)
            saved = f"int{quant.bits}"
            if wdtype not in (None, saved) or group_size not in (None, quant.group_size):
                raise ValueError(
                    f"[{fn}] {path} holds an {saved} model (group_size {quant.group_size}): load "
                    f"it with dtype=None or {saved!r} and no other group_size (a quantized "
                    "checkpoint is not converted)"
                )
            wdtype, group = saved, quant.group_size
        elif wdtype is None:
            wdtype = checkpoint_weight_dtype(located)
        if group_size is not None and wdtype not in _QUANT_DTYPES:
            raise ValueError(
                f"[{fn}] group_size is the quantization group of dtype='int8' / 'int4', got "
                f"dtype={wdtype!r}"
            )
        if wdtype in _QUANT_DTYPES:
            group = group or (group_size or 32)
            _check_group(fn, wdtype, group, _input_dims(config))
            emb = located["model.embed_tokens.weight"][1].dtype
            edtype = DTYPE_NAMES.get(emb, "float32")
        with _no_random_init():
            model = cls(config, dtype=wdtype, group_size=group or 32, embed_dtype=edtype)
        own = model.state_dict()
        dests: dict[str, Any] = {}
        for key in located:
            if key in own:
                dests[key] = own[key]
            elif is_quantized_key(key):  # a float matrix into int8 / int4 storage
                base = key[: -len(".weight")]
                dests[key] = _QuantizingSink(
                    key, own[base + ".qweight"], own[base + ".scales"], group
                )
        covered = set(dests)
        for key in list(dests):
            if isinstance(dests[key], _QuantizingSink):
                base = key[: -len(".weight")]
                covered |= {base + ".qweight", base + ".scales"}
        # the weights were allocated uninitialised: every one must come from the files
        tied = config.tie_embeddings
        derived = {"lm_head.weight"} if tied else set()
        remake_head = tied and wdtype in _QUANT_DTYPES and "lm_head.qweight" not in located
        if remake_head:
            derived |= {"lm_head.qweight", "lm_head.scales"}
        unread = [k for k in own if k not in covered and k not in derived]
        if unread:
            raise ValueError(f"[{fn}] {path}: no tensor for {unread[:5]}")
        total = sum(info.offsets[1] - info.offsets[0] for _, info in located.values())
        show = (sys.stderr.isatty() and total > 256 << 20) if progress is None else progress
        bar = _progress(total, show, desc="load", unit="B")
        try:
            load_into(located, dests, bar.update)
        finally:
            bar.close()
        for key, (file, _) in located.items():
            if key.endswith(".scales"):  # (a NaN / Inf scale: NaN logits)
                check_finite_scales(file, key, own[key])
        if remake_head:  # tied: the quantized head is made from the embedding just read
            model._impl.assign(model._impl.converted(wdtype, group, fn))
        model._token_ids = _token_ids(os.path.join(path, "config.json"))
        return model

    @property
    def dtype(self) -> str:
        """Storage dtype of the projection matrices and LM head: ``"float32"``,
        ``"bfloat16"``, ``"float16"``, ``"int8"`` or ``"int4"`` (quantized: the embedding
        keeps a float dtype, :attr:`embed_dtype`)."""
        return str(self._impl.dtype)

    @property
    def embed_dtype(self) -> str:
        """Storage dtype of the embedding (a float dtype; :attr:`dtype` unless quantized)."""
        return str(self._impl.embed_dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the weights (a tied LM head counted once; a quantized model: codes and
        scales, plus the float embedding, and with tied embeddings the quantized head too)."""
        return sum(
            v.nbytes
            for k, v in self.state_dict().items()
            if not (k == "lm_head.weight" and self.config.tie_embeddings)
        )

    def to(self, dtype: Any) -> Transformer:
        """Convert the weight storage to ``dtype`` (``"float32"``, ``"bfloat16"``,
        ``"float16"``) in place, and return the model. The new storage is filled tensor by
        tensor from the old one, then replaces it (peak memory: both copies). ``"int8"`` /
        ``"int4"`` is :meth:`quantize` with ``bits`` 8 / 4 and group size 32; from int8 / int4
        to a float dtype the matrices are dequantized (exactly: ``code * scale``)."""
        fn = "Transformer.to"
        wdtype = _weight_dtype(fn, dtype)
        parts = self._quant_parts()
        # (a block or module quantized or converted on its own makes a mixed model: each part
        # is looked at, not only the model's dtype, which reads the LM head's)
        if wdtype == self.dtype and all(str(impl.dtype) == wdtype for impl, _ in parts):
            return self
        if wdtype in _QUANT_DTYPES:
            bits, group = _check_quant_args(fn, _QUANT_DTYPES[wdtype], 32)
            _convert_parts(fn, parts, wdtype, group)
            return self
        quantized = [part for part in parts if str(part[0].dtype) in _QUANT_DTYPES]
        if quantized:  # dequantized in C++, tensor by tensor
            _convert_parts(fn, quantized, "float32", 0)
            floats = all(str(impl.dtype) == "float32" for impl, _ in parts)
            if wdtype == "float32" and self.embed_dtype == "float32" and floats:
                return self
        with _no_random_init():
            new = Transformer(self.config, dtype=wdtype)
        own = new.state_dict()
        for key, arr in self.state_dict().items():
            if key == "lm_head.weight" and self.config.tie_embeddings:
                continue
            np.copyto(own[key], arr, casting="unsafe")
        self.__dict__.update(new.__dict__)
        return self

    def save_pretrained(self, path: str | os.PathLike[str], *, dtype: Any = None) -> None:
        """Write an HF checkpoint directory that transformers (and :meth:`from_pretrained`)
        load: ``config.json`` (``torch_dtype`` set) and ``model.safetensors``. ``dtype``: the
        dtype the matrices are written in (default: the model's own; norms and biases are
        written in it too, as HF does). A tied LM head is not written (as transformers).

        A quantized model (int8 / int4) is written as it is stored, in llmkernels' documented
        layout (docs/quantization.md): ``X.qweight`` codes (int8, or uint8 nibble pairs) and
        ``X.scales`` (float16) per projection and for the LM head (also with tied
        embeddings), the embedding in its float dtype, norms and biases float32, and a
        ``quantization_config`` in config.json. :meth:`from_pretrained` loads it back
        bit-identically; transformers does not read it (its quant_method is unknown there).
        ``dtype`` must then be None or the model's."""
        from ._safetensors import save_file

        fn = "save_pretrained"
        quant = self.quantization
        wdtype = _weight_dtype(fn, dtype, allow_none=True) or self.dtype
        if quant is not None and wdtype != self.dtype:
            raise ValueError(
                f"[{fn}] dtype: a quantized ({self.dtype}) model is written as it is stored; "
                f"convert it first (model.to({wdtype!r})) to write {wdtype}"
            )
        keys = self.state_dict().keys()
        if (quant is None and any(k.endswith(".qweight") for k in keys)) or (
            quant is not None and any(k.endswith("_proj.weight") for k in keys)
        ):
            raise ValueError(
                f"[{fn}] the model mixes quantized and float projections (a block or module "
                "was quantized or converted on its own): quantize or convert the whole model "
                "(model.quantize(...), model.to(...)) before saving it"
            )
        out = os.fspath(path)
        os.makedirs(out, exist_ok=True)
        cfg = self.config.to_hf_dict()
        import json

        tensors = {
            k: v
            for k, v in self.state_dict().items()
            if not (k == "lm_head.weight" and self.config.tie_embeddings)
        }
        if quant is not None:
            from ._safetensors import QuantConfig

            cfg["torch_dtype"] = self.embed_dtype
            cfg["quantization_config"] = QuantConfig(**quant).to_dict()
            write_dtype = None  # every tensor as stored: bit-identical on load
        else:
            cfg["torch_dtype"] = wdtype
            write_dtype = wdtype
        # the special token ids of the checkpoint it was loaded from (transformers builds the
        # embedding's padding row from pad_token_id: Phi3Config's default, 32000, is past a small
        # vocabulary)
        cfg.update(self._token_ids)
        if "pad_token_id" not in self._token_ids and self.config.model_type == "phi3":
            if self.config.vocab_size <= 32000:
                cfg["pad_token_id"] = None
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        save_file(os.path.join(out, "model.safetensors"), tensors, dtype=write_dtype)

    def new_cache(
        self, batch: int, max_seq_len: int | None = None, dtype: Any = None
    ) -> ModelCache:
        """Per-layer KV caches for ``batch`` sequences of up to ``max_seq_len`` tokens, keys and
        values stored in ``dtype``: ``"float32"`` (default), ``"bfloat16"`` or ``"float16"``
        (half the memory and the bytes decode reads; see :class:`KVCache`)."""
        kv_dtype = _kv_dtype("new_cache", "dtype", dtype)
        length = self.config.max_seq_len if max_seq_len is None else max_seq_len
        return ModelCache([b.new_cache(batch, length, kv_dtype) for b in self.blocks])

    def __call__(
        self,
        ids: Any,
        *,
        positions: Any = None,
        mask: Any = None,
        cache: ModelCache | None = None,
        last_only: bool = False,
        return_attention: bool = False,
        return_stats: bool = False,
    ) -> Any:
        """Logits ``(B, T, vocab)`` float32 for token ids ``(B, T)`` (or ``(T,)``), or
        ``(B, 1, vocab)`` with ``last_only``. ``mask``: ``(B, T)`` padding mask (True = real
        token, e.g. left padding for batched prompts).

        ``last_only`` also saves work, as llama.cpp does: the last layer computes the keys and
        values of every token (the cache keeps them) but the query, attention, output
        projection and MLP of the last position only -- a quarter of a 4-layer model's prefill.
        Its logits equal the full forward's last row within rounding (with int8 / int4 weights
        those rows take the decode kernels: activations rounded to int8 per token).

        ``return_attention`` / ``return_stats`` (no cache): run layer by layer through
        :func:`llmkernels.inspect.trace` and return ``(logits, weights)``, ``(logits, stats)``
        or ``(logits, weights, stats)``: ``weights`` a list of ``(B, Hq, T, T)`` arrays, one per
        layer; ``stats`` a :class:`llmkernels.inspect.ResidualStats`.

        ``ids`` may be a tokenizer's output as it is: a ``BatchEncoding`` or a dict with
        ``input_ids`` (and ``attention_mask``, used as ``mask``), NumPy, lists or torch."""
        ids, mask = _model_inputs(self._name, ids, mask)
        ids_arr = np.asarray(ids)
        if ids_arr.dtype.kind not in "iu":
            raise TypeError(f"[{self._name}] ids must be integers, got dtype {ids_arr.dtype}")
        if ids_arr.ndim == 1:
            ids_arr = ids_arr[None]
        if ids_arr.ndim != 2:
            raise ValueError(
                f"[{self._name}] ids must have shape (B, T) or (T,), got {ids_arr.shape}"
            )
        if ids_arr.size and (ids_arr.min() < 0 or ids_arr.max() >= self.config.vocab_size):
            raise ValueError(
                f"[{self._name}] ids must be in [0, vocab_size={self.config.vocab_size})"
            )
        b, t = ids_arr.shape
        if b == 0 or t == 0:
            raise ValueError(
                f"[{self._name}] ids holds no tokens (shape {ids_arr.shape}): give at least one "
                "token per sequence"
            )
        if cache is not None:
            if not isinstance(cache, ModelCache) or len(cache.layers) != len(self.blocks):
                raise TypeError(f"[{self._name}] cache must come from this model's new_cache()")
            for c in cache.layers:
                _check_cache(self._name, c, b, t)
        with _holding(cache, self._name):  # positions continue from the previous call
            if cache is not None:
                for c in cache.layers:
                    _check_cache(self._name, c, b, t)
                _check_layers_in_step(self._name, cache)
            pos, key_mask, nxt = _positions_and_mask(self._name, b, t, positions, mask, cache)
            if return_attention is not False or return_stats is not False:
                from .inspect import call_hook

                return call_hook(
                    self, ids_arr, pos, key_mask, cache, last_only, return_attention, return_stats
                )
            freqs = self._rope.frequencies(pos)
            for c in cache.layers if cache is not None else []:
                c._begin(nxt)
            logits = self._impl.forward(
                np.ascontiguousarray(ids_arr, dtype=np.int64),
                pos,
                key_mask,
                [c._impl for c in cache.layers] if cache is not None else [],
                bool(last_only),
                freqs,
            )
            for c in cache.layers if cache is not None else []:
                c._commit(nxt)
        return logits

    def generate(
        self,
        ids: Any,
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        min_p: float | None = None,
        repetition_penalty: float | None = None,
        seed: int | None = None,
        mask: Any = None,
        progress: bool | None = None,
        kv_dtype: Any = None,
    ) -> np.ndarray:
        """Autoregressive decoding with a KV cache: one prefill, then one C++ call per token.

        ``temperature=0`` is greedy (argmax); otherwise samples from
        ``softmax(logits / temperature)`` restricted to the ``top_k`` tokens, the ``top_p``
        nucleus and the tokens with at least ``min_p`` times the top probability, with a NumPy
        generator seeded by ``seed``. ``repetition_penalty`` divides the positive (multiplies
        the negative) logits of tokens already in the sequence, as in transformers. ``ids``
        ``(B, T)`` (left-padded with ``mask`` for prompts of different lengths; a right-padded
        batch is moved to the left) or a tokenizer's output (``BatchEncoding`` / dict with
        ``input_ids`` and ``attention_mask``). Returns ``(B, T + max_new_tokens)``.
        ``progress``: a tqdm bar (default: on when stderr is a terminal). ``kv_dtype``: the KV
        cache's dtype, ``"float32"`` (default), ``"bfloat16"`` or ``"float16"`` (see
        :class:`KVCache`). No stopping at EOS here: :func:`llmkernels.generate` works on text
        and stops at EOS and stop strings.
        """
        kv = _kv_dtype("generate", "kv_dtype", kv_dtype)
        ids, mask = _model_inputs("generate", ids, mask)
        ids_arr = np.asarray(ids)
        if ids_arr.ndim == 1:
            ids_arr = ids_arr[None]
        steps = _check_max_tokens("generate", "max_new_tokens", max_new_tokens)
        sampling = _Sampling.checked(
            "generate", temperature, top_k, top_p, min_p, repetition_penalty, seed
        )
        if ids_arr.ndim != 2 or ids_arr.shape[0] == 0 or ids_arr.shape[1] == 0:
            raise ValueError(
                f"[generate] ids must hold a prompt of at least one token per sequence, "
                f"got shape {ids_arr.shape}"
            )
        if ids_arr.dtype.kind not in "iu":
            raise TypeError(f"[{self._name}] ids must be integers, got dtype {ids_arr.dtype}")
        if ids_arr.min() < 0 or ids_arr.max() >= self.config.vocab_size:  # also for 0 steps
            raise ValueError(f"[generate] ids must be in [0, vocab_size={self.config.vocab_size})")
        ids_arr, mask = _left_align("generate", ids_arr, mask)
        b, t = ids_arr.shape
        if steps == 0:
            return ids_arr.astype(np.int64)
        _check_cache_size("generate", "max_new_tokens", self.config, b, t, steps)
        cache = self.new_cache(b, t + steps, kv)
        sampler = sampling.sampler(b, self.config.vocab_size)
        sampler.see(ids_arr, mask)
        out = [ids_arr.astype(np.int64)]
        show = sys.stderr.isatty() if progress is None else progress
        bar = _progress(steps, show)
        logits = self(ids_arr, mask=mask, cache=cache, last_only=True)[:, -1]
        for step in range(steps):
            nxt = sampler(logits)
            out.append(nxt[:, None])
            bar.update(1)
            if step + 1 < steps:
                logits = self(nxt[:, None], cache=cache, last_only=True)[:, -1]
        bar.close()
        return np.concatenate(out, axis=1)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"Transformer(vocab={c.vocab_size}, dim={c.dim}, n_layers={c.n_layers}, "
            f"n_heads={c.n_heads}, n_kv_heads={c.n_kv_heads})"
        )


def _sample(
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


class _Sampler:
    """Sampling state of one generation: parameters, generator and the tokens seen so far
    (for the repetition penalty)."""

    def __init__(self, params: _Sampling, batch: int, vocab: int) -> None:
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
        nxt = _sample(
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


class _Sampling:
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
    ) -> _Sampling:
        t = _real(fn, "temperature", temperature)
        if not (math.isfinite(t) and t >= 0):
            raise ValueError(f"[{fn}] temperature must be a finite number >= 0, got {t}")
        k = None
        if top_k is not None:
            if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1:
                raise ValueError(f"[{fn}] top_k must be an int >= 1 or None, got {top_k!r}")
            k = int(top_k)
        p = None
        if top_p is not None:
            p = _real(fn, "top_p", top_p)
            if not 0 < p <= 1:  # NaN fails too
                raise ValueError(f"[{fn}] top_p must be in (0, 1], got {p}")
        m = None
        if min_p is not None:
            m = _real(fn, "min_p", min_p)
            if not 0 <= m <= 1:
                raise ValueError(f"[{fn}] min_p must be in [0, 1], got {m}")
        r = None
        if repetition_penalty is not None:
            r = _real(fn, "repetition_penalty", repetition_penalty)
            if not (math.isfinite(r) and r > 0):
                raise ValueError(f"[{fn}] repetition_penalty must be a finite number > 0, got {r}")
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0
        ):
            raise ValueError(f"[{fn}] seed must be an int >= 0 or None, got {seed!r}")
        return cls(t, k, p, m, r, None if seed is None else int(seed))

    def sampler(self, batch: int, vocab: int) -> _Sampler:
        return _Sampler(self, batch, vocab)


def _real(fn: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"[{fn}] {name} must be a number, got {value!r}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"[{fn}] {name} is out of range, got {str(value)[:40]}") from None


def _check_max_tokens(fn: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"[{fn}] {name} must be an int >= 0, got {str(value)[:40]}")
    return int(value)


_MAX_CACHE_LEN = 1 << 24  # KVCache's limits (max_seq_len and elements per layer)
_MAX_CACHE_ELEMS = 1 << 33


def _check_cache_size(fn: str, name: str, cfg: ModelConfig, batch: int, t: int, n: int) -> None:
    """The KV cache ``t + n`` tokens need must be one :class:`KVCache` can hold."""
    total = t + n
    if total > _MAX_CACHE_LEN or batch * total * cfg.n_kv_heads * cfg.head_dim > _MAX_CACHE_ELEMS:
        raise ValueError(
            f"[{fn}] {name} = {n} is too large: the prompt ({t}) plus the new tokens need a KV "
            f"cache of {total} positions for {batch} sequence(s), over the limit "
            f"(2**24 positions, 2**33 elements per layer)"
        )


def _check_load_dtype(fn: str, dtype: Any) -> None:
    _weight_dtype(fn, dtype, allow_none=True)


def _checkpoint_dir(path: Any) -> str:
    """``path`` as a local directory; a hub id gets told to download it first."""
    try:
        p = os.fspath(path)
    except TypeError:
        raise TypeError(
            f"[from_pretrained] path must be a directory path, got {type(path).__name__}"
        ) from None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if os.path.isdir(p):
        return p
    parts = p.split("/")
    if not os.path.lexists(p) and len(parts) == 2 and all(parts) and not p.startswith((".", "~")):
        raise ValueError(
            f"[from_pretrained] {p!r} is not a directory; it looks like a Hugging Face hub id. "
            f"llmkernels does not download: fetch it first, e.g. `huggingface-cli download {p}` "
            f"or `huggingface_hub.snapshot_download({p!r})`, and pass the local directory "
            "(it needs config.json and *.safetensors)"
        )
    raise ValueError(f"[from_pretrained] {p!r} is not a directory")


def _model_inputs(fn: str, ids: Any, mask: Any) -> tuple[Any, Any]:
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


def _left_align(fn: str, ids: np.ndarray, mask: Any) -> tuple[np.ndarray, Any]:
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


def _progress(total: int, show: bool, desc: str = "generate", unit: str = "tok") -> Any:
    if not show:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    if unit == "B":
        return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024)
    return tqdm(total=total, desc=desc, unit=unit)
