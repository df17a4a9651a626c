"""Loading the compiled extension (``llmkernels._core``): the one place where the BLAS it links
is configured, and where a missing shared library becomes an error that says what to install.

The extension links OpenBLAS (the system library for a source build; the manylinux wheel carries
its own copy) for the large-token projections. OpenBLAS picks its kernels for the CPU when it is
loaded, from ``OPENBLAS_CORETYPE``; on recent AMD EPYC with AVX-512 it does not choose its
SkylakeX kernels by itself, so the variable is set around the import only (NumPy is imported
first, so NumPy's own OpenBLAS is unaffected), then restored. ``LLMKERNELS_BLAS_CORETYPE``
overrides the choice (e.g. ``Haswell``). The package's own threads run OpenBLAS single-threaded
(``cpp/common/thread_pool.cpp``).
"""

from __future__ import annotations

import os as _os
from types import ModuleType


def load_core() -> ModuleType:
    """Import the extension, choosing the GEMM kernels of its OpenBLAS (the system library, not
    NumPy's): on CPUs with AVX-512 the SkylakeX kernels, which OpenBLAS 0.3.21 does not pick by
    itself on recent AMD EPYC (it falls back to its AVX2 "Haswell" kernels: ~105 vs ~170 GFLOP/s
    per core here). OpenBLAS reads OPENBLAS_CORETYPE once, when it loads, so the variable is set
    only around this import (NumPy is imported first, so its own OpenBLAS is unaffected) and then
    restored. ``LLMKERNELS_BLAS_CORETYPE`` overrides the choice (e.g. ``Haswell``).
    """
    import numpy  # noqa: F401  -- load NumPy's BLAS before touching the variable

    key = "OPENBLAS_CORETYPE"
    wanted = _os.environ.get("LLMKERNELS_BLAS_CORETYPE") or (
        "SkylakeX" if _cpu_has_avx512() else None
    )
    previous = _os.environ.get(key)
    if wanted:
        _os.environ[key] = wanted
    try:
        from . import _core as core
    except ImportError as exc:
        if "cannot open shared object file" not in str(exc):
            raise
        # A source/plain wheel build links the system OpenBLAS; the manylinux wheel (`make
        # wheel`) carries its own copy and never gets here.
        raise ImportError(
            f"llmkernels: the compiled extension needs a shared library that is not installed "
            f"({exc}). It was built against the system OpenBLAS: install it (Debian/Ubuntu: "
            f"`apt-get install libopenblas0-pthread`), or install llmkernels' manylinux wheel, "
            f"which carries its own copy."
        ) from exc
    finally:
        if wanted:
            if previous is None:
                del _os.environ[key]
            else:
                _os.environ[key] = previous
    return core


def _cpu_has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags
    except OSError:
        pass
    return False
