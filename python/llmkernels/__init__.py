"""llmkernels: SIMD (xsimd) C++ kernels for LLaMA-style transformer layers, on NumPy arrays.

Ops (float32 and float64, any leading shape, any strides):

- :func:`rms_norm`, :func:`layer_norm` — normalisation over the last axis
- :func:`silu`, :func:`swiglu`, :func:`swiglu_ffn` — SwiGLU activations and feed-forward
- :func:`rope`, :func:`rope_inv_freq`, :func:`rope_attention_factor` — rotary embeddings
  with HF's scaling types (linear, dynamic, yarn, llama3, longrope) and p-RoPE
- :func:`quantize`, :func:`dequantize`, :func:`quantized_linear` — group-wise int8 / int4
  weights (docs/quantization.md)
- :func:`attention` — fused streaming (flash-style) scaled dot-product attention with GQA,
  bottom-right causal masking for KV caches, boolean/additive masks and optional weights

Runtime: :func:`set_num_threads`, :func:`get_num_threads`, :func:`simd_arch`,
:func:`set_simd_arch`, :func:`build_info`. The environment variable ``LLMKERNELS_ARCH``
(``sse2``, ``avx2``, ``avx512``) forces a lower SIMD path at import; ``LLMKERNELS_NUM_THREADS``
sets the initial thread count.

NumPy reference formulas (the specification) live in :mod:`llmkernels.reference`, pure-Python
versions in :mod:`llmkernels.pure`.
"""

from __future__ import annotations

import numbers as _numbers
from typing import Any

from ._extension import load_core as _load_core

_core = _load_core()


def _check_environment() -> None:
    """Warn about an environment variable the C++ core reads and ignores (a typo would
    otherwise run another path or thread count than the one asked for, silently)."""
    import os
    import re
    import warnings

    arch = os.environ.get("LLMKERNELS_ARCH")
    if arch is not None and not _core._is_simd_arch_name(arch):
        warnings.warn(
            f"LLMKERNELS_ARCH={arch!r} is not a SIMD path ({', '.join(_core.isa_names)}): "
            f"ignored, running {_core.simd_arch()}",
            RuntimeWarning,
            stacklevel=3,
        )
    native = {  # the paths of the CPU's own instructions, and whether it has them
        "vnni": _core.cpu_has_avx512_vnni,
        "vnni512": _core.cpu_has_avx512_vnni,
        "avx512bf16": _core.cpu_has_avx512_bf16,
        "amx": _core.cpu_has_amx,
    }
    for var, names in (
        ("LLMKERNELS_INT8_DOT", _core.int8_dot_names),
        ("LLMKERNELS_BF16_DOT", _core.bf16_dot_names),
    ):
        value = os.environ.get(var)
        if value is not None and value not in names:
            warnings.warn(
                f"{var}={value!r} is not a path ({', '.join(names)}): ignored",
                RuntimeWarning,
                stacklevel=3,
            )
        elif value in native and not native[value]:
            warnings.warn(
                f"{var}={value!r}: this CPU lacks the instruction, running 'none'",
                RuntimeWarning,
                stacklevel=3,
            )
    threads = os.environ.get("LLMKERNELS_NUM_THREADS")
    lead = re.match(r"\s*([+-]?\d+)", threads or "")  # what the core's strtol reads
    if threads is not None and not (lead and 1 <= int(lead.group(1)) < 2**63):
        warnings.warn(
            f"LLMKERNELS_NUM_THREADS={threads!r} is not a thread count >= 1: ignored, "
            f"using {_core.get_num_threads()}",
            RuntimeWarning,
            stacklevel=3,
        )


_check_environment()
# the Python layer imports _core, so it comes after _load_core() has set up OpenBLAS
from . import inspect as inspect  # noqa: E402  (lk.inspect: attention weights, residual RMS)
from . import modules as modules  # noqa: E402  (their first import path)
from . import nn as nn  # noqa: E402  (lk.nn: the module classes, caches, sampling)
from . import pure as pure  # noqa: E402  (lk.pure: every op in pure Python)
from . import reference as reference  # noqa: E402  (lk.reference: every op's float64 formula)
from ._ops import attention, layer_norm, rms_norm, rope, silu, swiglu, swiglu_ffn  # noqa: E402
from ._rope_scaling import rope_attention_factor, rope_inv_freq  # noqa: E402
from .nn import *  # noqa: E402, F403  (the module classes: nn.__all__)
from .quant import dequantize, quantize, quantized_linear  # noqa: E402
from .text import (  # noqa: E402
    ChatSession,
    GenerationResponse,
    example_model,
    generate,
    load,
    stream_generate,
)
from .tokenizer import Tokenizer  # noqa: E402

__version__: str = _core.__version__

__all__ = [
    "ChatSession",
    "GenerationResponse",
    "Tokenizer",
    "example_model",
    "generate",
    "load",
    "stream_generate",
    "__version__",
    "attention",
    "build_info",
    "dequantize",
    "get_num_threads",
    "layer_norm",
    "quantize",
    "quantized_linear",
    "rms_norm",
    "rope",
    "rope_attention_factor",
    "rope_inv_freq",
    "set_num_threads",
    "set_simd_arch",
    "silu",
    "simd_arch",
    "swiglu",
    "swiglu_ffn",
]
__all__ += nn.__all__


def set_num_threads(n: int) -> None:
    """Set the number of threads the kernels (and the OpenBLAS matmuls) use:
    ``1 <= n <= 1024``. The worker threads are started here and kept until the count changes
    (no kernel call starts or stops threads). If the system refuses to start them all (a thread
    or memory limit), RuntimeError is raised and the previous count stays in force.

    Examples:
        >>> import llmkernels as lk
        >>> lk.set_num_threads(1); lk.get_num_threads()
        1
    """
    if isinstance(n, bool) or not isinstance(n, _numbers.Integral):
        raise TypeError(f"[set_num_threads] n must be an int, got {type(n).__name__}")
    n = int(n)
    if not 1 <= n <= _core.max_threads:
        raise ValueError(f"[set_num_threads] n must be between 1 and {_core.max_threads}, got {n}")
    _core.set_num_threads(n)


def get_num_threads() -> int:
    """Number of threads the kernels use (default: the machine's cores).

    Examples:
        >>> import llmkernels as lk
        >>> lk.get_num_threads() >= 1
        True
    """
    return _core.get_num_threads()


def simd_arch() -> str:
    """The SIMD path in use: ``"avx512"``, ``"avx2"`` (with FMA) or ``"sse2"``.

    Examples:
        >>> import llmkernels as lk
        >>> lk.simd_arch() in ("sse2", "avx2", "avx512")
        True
    """
    return _core.simd_arch()


def set_simd_arch(arch: str) -> None:
    """Force a SIMD path (``"sse2"``, ``"avx2"``, ``"avx512"``) supported by this CPU for every
    kernel, or go back to ``"auto"``: the best path, each kernel family on the path measured
    fastest for it on this CPU (on AMD Zen 4, which splits 512-bit instructions in two, RMSNorm /
    LayerNorm, RoPE, attention and the quantized float-activation products run their avx2 code;
    :func:`build_info`'s ``kernel_paths`` lists them). ``auto`` is the mode at start unless the
    environment variable ``LLMKERNELS_ARCH`` forces a path.

    Examples:
        >>> import llmkernels as lk
        >>> best = lk.simd_arch(); lk.set_simd_arch("sse2"); lk.simd_arch()
        'sse2'
        >>> lk.set_simd_arch("auto")
    """
    if not isinstance(arch, str):
        raise TypeError(f"[set_simd_arch] arch must be a str, got {type(arch).__name__}")
    _core.set_simd_arch(arch)


def build_info() -> dict[str, Any]:
    """Version, compiler, SIMD paths, threads and BLAS of this build, and the path each kernel
    family runs on this CPU: ``kernel_paths`` -- the xsimd path of the float kernels, whether
    it is the automatic choice, the path of each kernel family (``family_norm``, ``family_rope``,
    ``family_attention``, ``family_quant`` (the quantized GEMM), ``family_qgemv`` (the quantized
    GEMVs of decode), ``family_packed``; ``family_other``: the rest), the int8 dot product of the
    quantized prefill (``"amx"``: AMX's tdpbssd, ``"vnni"`` / ``"vnni512"``: AVX512_VNNI's
    vpdpbusd on 256- / 512-bit vectors, ``"avx2"``:
    AVX2's maddubs, ``"none"`` (SSE2): the float-activation GEMM) and the bf16 one of the
    bfloat16-weight prefill (``"amx"``: AMX tiles' tdpbf16ps, ``"avx512bf16"``: vdpbf16ps, both
    with the activations rounded to bfloat16; ``"none"``: exact).

    Examples:
        >>> import llmkernels as lk
        >>> sorted(lk.build_info())[:3]
        ['best_simd_arch', 'blas', 'compiled_simd_archs']
    """
    return {
        "version": __version__,
        "compiler": _core.compiler,
        "xsimd": _core.xsimd_version,
        "simd_arch": _core.simd_arch(),
        "best_simd_arch": _core.best_simd_arch(),
        "compiled_simd_archs": list(_core.isa_names),
        "num_threads": _core.get_num_threads(),
        "blas": _core.openblas_config(),
        "kernel_paths": {
            "float": _core.simd_arch(),
            "automatic": _core.simd_arch_automatic(),
            **{f"family_{name}": isa for name, isa in _core.family_simd_archs().items()},
            "int8_prefill_dot": _core.int8_dot(),
            "int8_decode_dot": _int8_decode_dot(),
            "bf16_prefill_dot": _core.bf16_dot(),
        },
    }


def _int8_decode_dot() -> str:
    """The int8 / int4-weight GEMV's integer side: vpdpbusd ("vnni") where the CPU has a
    dot-product extension and the quantized family runs its AVX2 or AVX-512 code, the SIMDe twin
    where one is forced, else the AVX2 / SSE2 code ("none"). Every choice gives the same bits."""
    dot = _core.int8_dot()
    if dot in ("vnni_simde", "amx_emu", "vnni512_simde"):
        return "vnni_simde"
    fam = _core.family_simd_archs()["quant"]
    return "vnni" if dot in ("vnni", "amx", "vnni512") and fam in ("avx2", "avx512") else "none"
