"""What every module shares: the :class:`Module` base (state dicts over C++-owned weights,
quantization, dtype conversion), the weight and KV dtype names, and the argument checks."""

from __future__ import annotations

import contextlib
import contextvars
import numbers
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .. import _core

INIT_STD = 0.02  # HF's initializer_range

# Set while a model is built only to be overwritten by a checkpoint: the weights are allocated
# (by C++) but not randomly filled, which would cost as much time as the load itself.
SKIP_INIT: contextvars.ContextVar[bool] = contextvars.ContextVar("SKIP_INIT", default=False)


@contextlib.contextmanager
def no_random_init() -> Iterator[None]:
    token = SKIP_INIT.set(True)
    try:
        yield
    finally:
        SKIP_INIT.reset(token)


def to_numpy(value: Any) -> np.ndarray:
    """An array-like or torch tensor as a NumPy array; a torch bfloat16 tensor becomes an
    ``ml_dtypes.bfloat16`` array (same bits, no widening), other torch dtypes NumPy lacks
    (float8) are widened to float32 first, as a transformers user expects them to load."""
    if hasattr(value, "detach") and hasattr(value, "is_floating_point"):
        t = value.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            import ml_dtypes

            return np.asarray(t.contiguous().view(torch_int16()).numpy()).view(ml_dtypes.bfloat16)
        if t.is_floating_point() and str(t.dtype) not in (
            "torch.float16",
            "torch.float32",
            "torch.float64",
        ):
            t = t.float()
        return np.asarray(t.numpy())
    return np.asarray(value)


def torch_int16() -> Any:
    import torch

    return torch.int16


#: weight storage dtypes by name (what the C++ modules take), and the aliases accepted
FLOAT_WEIGHT_DTYPES = ("float32", "bfloat16", "float16")
#: group-wise quantized storage (docs/quantization.md): name -> bits. Only these strings name
#: them: NumPy's int8 dtype object is not a quantization request.
QUANT_DTYPES = {"int8": 8, "int4": 4}
WEIGHT_DTYPES = FLOAT_WEIGHT_DTYPES + tuple(QUANT_DTYPES)
DTYPE_ALIASES = {
    "f32": "float32",
    "fp32": "float32",
    "bf16": "bfloat16",
    "f16": "float16",
    "fp16": "float16",
    "half": "float16",
}


def check_weight_dtype(fn: str, dtype: Any, allow_none: bool = False) -> str | None:
    """``dtype`` (a name, a NumPy / ml_dtypes dtype or a torch dtype) as one of
    ``WEIGHT_DTYPES``; None stays None when ``allow_none`` (the checkpoint's dtype), else
    float32."""
    if dtype is None:
        return None if allow_none else "float32"
    name = str(dtype).removeprefix("torch.") if not isinstance(dtype, str) else dtype
    if not isinstance(dtype, str):
        try:
            name = np.dtype(dtype).name
        except TypeError:
            pass
    name = DTYPE_ALIASES.get(name, name)
    if name not in WEIGHT_DTYPES or (name in QUANT_DTYPES and not isinstance(dtype, str)):
        raise ValueError(
            f"[{fn}] dtype must be None, 'float32', 'bfloat16', 'float16', 'int8' or 'int4', "
            f"got {str(dtype)[:40]!r}"
        )
    return name


KV_DTYPES = ("float32", "bfloat16", "float16")


def check_kv_dtype(fn: str, arg: str, dtype: Any) -> str:
    """A KV cache dtype (a name, a NumPy / ml_dtypes dtype or a torch dtype; None: float32) as
    one of ``KV_DTYPES``."""
    try:
        name = check_weight_dtype(fn, dtype)
    except ValueError:
        name = None
    if name not in KV_DTYPES:
        raise ValueError(
            f"[{fn}] {arg} must be None, 'float32', 'bfloat16' or 'float16', got "
            f"{str(dtype)[:40]!r}"
        )
    return str(name)


def check_bits(fn: str, bits: Any) -> int:
    """``bits`` of a quantization: 8 or 4."""
    if isinstance(bits, bool) or not isinstance(bits, numbers.Integral) or bits not in (8, 4):
        raise ValueError(f"[{fn}] bits must be 8 or 4, got {str(bits)[:40]}")
    return int(bits)


def group_arg(fn: str, dtype: str, group_size: Any) -> int:
    """``group_size`` converted for the C++ entry, which checks it once (32, 64 or 128,
    dividing every input dimension of the quantized matrices, in the name of :func:`entry`):
    an int for a quantized ``dtype``, 32 (unused) for a float one."""
    if dtype not in QUANT_DTYPES:
        return 32
    if (
        isinstance(group_size, bool)
        or not isinstance(group_size, numbers.Integral)
        or not -(2**63) <= group_size < 2**63
    ):
        raise ValueError(f"[{fn}] group_size must be 32, 64 or 128, got {str(group_size)[:40]}")
    return int(group_size)


#: the public call being served: the C++ entries name it in the argument errors of the modules
#: it builds (TransformerBlock.from_config builds a MultiHeadAttention: its errors say
#: "[TransformerBlock] ...")
ENTRY: contextvars.ContextVar[str | None] = contextvars.ContextVar("ENTRY", default=None)


@contextlib.contextmanager
def entry(name: str) -> Iterator[None]:
    """Inside, :func:`entry_name` is ``name`` (the outermost entry's, when they nest)."""
    token = ENTRY.set(ENTRY.get() or name)
    try:
        yield
    finally:
        ENTRY.reset(token)


def entry_name(name: str) -> str:
    """The name argument errors give: the entry being served, else ``name``."""
    return ENTRY.get() or name


def fill_matrix(own: Mapping[str, np.ndarray], base: str, w: np.ndarray, group: int) -> None:
    """Write the float matrix ``w`` into the storage of ``base`` in ``own`` (a state dict):
    ``base.weight`` (converted to its dtype), or ``base.qweight`` / ``base.scales`` quantized
    with ``group`` (the bits of :func:`llmkernels.quantize`)."""
    if base + ".weight" in own:
        np.copyto(own[base + ".weight"], w, casting="unsafe")
        return
    q, sc = _core.quantize(np.ascontiguousarray(w, dtype=np.float32), qbits(own, base), group)
    own[base + ".qweight"][...] = q
    own[base + ".scales"][...] = sc


def qbits(own: Mapping[str, np.ndarray], base: str) -> int:
    """The bits of the quantized matrix ``base`` of a state dict (int8 codes or uint8 pairs)."""
    return 8 if own[base + ".qweight"].dtype == np.int8 else 4


def quant_sources(
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
            w = np.ascontiguousarray(to_numpy(value), dtype=np.float32)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(f"[{fn}] {key}: cannot read as an array ({exc})") from None
        rows = own[base + ".qweight"].shape[0]
        k = own[base + ".scales"].shape[1] * group
        if w.shape != (rows, k):
            raise ValueError(f"[{fn}] {key}: expected shape {(rows, k)}, got {w.shape}")
        try:
            q, sc = _core.quantize(w, qbits(own, base), group)
        except ValueError as exc:
            raise ValueError(f"[{fn}] {key}: {exc}") from None
        out[base + ".qweight"], out[base + ".scales"] = q, sc
        made += [base + ".qweight", base + ".scales"]
    return out, made


def convert_parts(fn: str, parts: Sequence[Any], dtype: str, group: int) -> None:
    """Convert the matrices of the C++ modules ``parts`` to ``dtype``
    ('int8' / 'int4' in groups of ``group``, or 'float32'), all or none: every new matrix is
    made (and checked: the group size too, by the C++ entry) before any replaces the old ones,
    so a bad group size or bad weights (NaN, Inf, beyond float16 scales) raise
    ``ValueError("[fn] ...")`` and change nothing. Modules already in
    ``dtype`` are left as they are; an int8 module is not re-quantized to int4 (or to another
    group size): quantize the float module."""
    todo = []
    for impl in parts:
        cur = str(impl.dtype)
        if cur == dtype and (dtype not in QUANT_DTYPES or impl.group_size == group):
            continue
        if cur in QUANT_DTYPES and dtype in QUANT_DTYPES:
            raise ValueError(
                f"[{fn}] the weights are already {cur} (group_size {impl.group_size}): "
                f"quantize the float model to {dtype} (group_size {group}) instead"
            )
        todo.append(impl)
    staged = [impl.converted(dtype, group, fn) for impl in todo]
    for impl, new in zip(todo, staged, strict=True):
        impl.assign(new)


def seeded_rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(seed)


def positive_int(cls: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"[{cls}] {name} must be a positive int, got {value!r}")
    if value > 1 << 24:
        raise ValueError(f"[{cls}] {name} = {value} is too large (limit 2**24)")
    return int(value)


def positive_real(cls: str, name: str, value: Any) -> float:
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


def check_eps(cls: str, eps: Any) -> float:
    # compared before float(): an int like 10**400 has no float (OverflowError)
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not (0 <= eps < 1):
        raise ValueError(f"[{cls}] eps must be a number in [0, 1), got {str(eps)[:40]}")
    return float(eps)


def from_impl(attr: str) -> Any:
    """A read-only property that reads ``attr`` of the module's C++ object (``self._impl``)."""
    return property(lambda self: getattr(self._impl, attr), doc=f"``{attr}`` of the C++ module.")


class Module:
    """State-dict plumbing shared by the modules: ``_impl.params()`` gives zero-copy views."""

    _name = "Module"

    def _own_params(self) -> dict[str, np.ndarray]:
        return dict(self._impl.params())  # type: ignore[attr-defined]

    def _children(self) -> Iterator[tuple[str, Module]]:
        return iter(())

    def _quant_parts(self) -> list[Any]:
        """The C++ modules holding this module's projection matrices."""
        return []

    def _group_size(self) -> int:
        """The group size of the quantized matrices (0: float weights)."""
        parts = self._quant_parts()
        return int(parts[0].group_size) if parts else 0

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
        dtype = f"int{check_bits(fn, bits)}"
        convert_parts(fn, self._quant_parts(), dtype, group_arg(fn, dtype, group_size))
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
            state_dict, _ = quant_sources(f"{self._name}.load_state_dict", own, state_dict, group)
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
                arr = to_numpy(value)
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

    def _take_layer(self, impl: Any, fused_names: bool, seed: int | None) -> None:
        """A layer's last step: its C++ module ``impl`` (``fused_names``: Phi-3's one-tensor
        names for the fused projections, the storage it has anyway), random weights from
        ``seed``."""
        self._impl = impl
        impl.fused_names = bool(fused_names)
        self._init_random(seeded_rng(seed))

    def _init_random(self, rng: np.random.Generator) -> None:
        if SKIP_INIT.get():
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
                w = rng.standard_normal(shape, dtype=np.float32) * INIT_STD
                fill_matrix(own, base, w, group)
            else:
                arr[...] = rng.standard_normal(arr.shape, dtype=np.float32) * INIT_STD


_F32 = np.dtype(np.float32)


def as_f32(cls: str, name: str, x: Any, last: int) -> np.ndarray:
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
