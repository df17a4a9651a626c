"""Smoke test of an installed llmkernels wheel, run from outside the repository (.ci/test_wheel).

Checks that the package imports from site-packages (not a source tree), that every op agrees
with its NumPy reference, that a block and a tiny model run and load back from safetensors (the
library is a dependency of the wheel), and that the OpenBLAS the extension
uses is the copy inside the wheel (``llmkernels.libs``), not a system library.
"""

import json
import os
import sys
import tempfile

import llmkernels as lk
import numpy as np
from llmkernels import reference as ref
from llmkernels._safetensors import save_file

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
# a checkpoint round trip: read back with the safetensors library the wheel depends on
with tempfile.TemporaryDirectory() as tmp:
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(model.config.to_hf_dict(), f)
    save_file(os.path.join(tmp, "model.safetensors"), model.state_dict())
    loaded = lk.Transformer.from_pretrained(tmp, progress=False)
    ids = np.array([[1, 2, 3, 4]])
    assert np.array_equal(loaded(ids), model(ids)), "from_pretrained round trip differs"
maps = open("/proc/self/maps").read()
blas = sorted({line.split()[-1] for line in maps.splitlines() if "openblas" in line.lower()})
ours = [p for p in blas if "llmkernels.libs" in p]
assert ours, f"the wheel's OpenBLAS is not loaded: {blas}"
system = [p for p in blas if p.startswith("/usr/")]
assert not system, f"a system OpenBLAS is loaded: {system}"
print(
    f"wheel OK: llmkernels {lk.__version__} from {os.path.dirname(lk.__file__)}, "
    f"SIMD {lk.simd_arch()}, OpenBLAS {ours[0]}, Python {sys.version.split()[0]}"
)
