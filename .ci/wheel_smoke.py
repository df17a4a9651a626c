"""Smoke test of an installed llmkernels wheel, run from outside the repository (.ci/test_wheel).

Checks that the package imports from site-packages (not a source tree), that every op agrees
with its NumPy reference, that a block and a tiny model run, and that the OpenBLAS the extension
uses is the copy inside the wheel (``llmkernels.libs``), not a system library.
"""

import os
import sys

import numpy as np

import llmkernels as lk
from llmkernels import reference as ref

assert "site-packages" in lk.__file__, f"imported from {lk.__file__}, not an installed wheel"
rng = np.random.default_rng(0)
x = rng.standard_normal((3, 37)).astype(np.float32)
w = rng.standard_normal(37).astype(np.float32)
checks = {
    "rms_norm": (lk.rms_norm(x, w), ref.rms_norm(x, w)),
    "layer_norm": (lk.layer_norm(x, w, w), ref.layer_norm(x, w, w)),
    "silu": (lk.silu(x), ref.silu(x)),
    "swiglu": (lk.swiglu(x, x), ref.swiglu(x, x)),
    "rope": (lk.rope(x[:, :36]), ref.rope(x[:, :36])),
}
q = rng.standard_normal((2, 4, 5, 8)).astype(np.float32)
checks["attention"] = (lk.attention(q, q, q, causal=True), ref.attention(q, q, q, causal=True))
wg = rng.standard_normal((37, 600)).astype(np.float32)  # a matmul big enough for the BLAS path
xs = rng.standard_normal((600, 37)).astype(np.float32)
checks["swiglu_ffn"] = (lk.swiglu_ffn(xs, wg, wg, wg.T), ref.swiglu_ffn(xs, wg, wg, wg.T))
for name, (got, want) in checks.items():
    scale = max(1.0, float(np.abs(want).max()))
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4 * scale), name
model = lk.Transformer(
    {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64, "vocab_size": 50}, seed=0
)
assert model.generate([1, 2, 3], 4, progress=False).shape == (1, 7)
maps = open("/proc/self/maps").read()
blas = sorted({line.split()[-1] for line in maps.splitlines() if "openblas" in line.lower()})
ours = [p for p in blas if "llmkernels.libs" in p]
assert ours, f"the wheel's OpenBLAS is not loaded: {blas}"
system = [p for p in blas if p.startswith("/usr/")]
assert not system, f"a system OpenBLAS is loaded: {system}"
print(f"wheel OK: llmkernels {lk.__version__} from {os.path.dirname(lk.__file__)}, "
      f"SIMD {lk.simd_arch()}, OpenBLAS {ours[0]}, Python {sys.version.split()[0]}")
