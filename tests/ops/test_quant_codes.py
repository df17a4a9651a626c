"""int8 codes at the edge of their type: -128 is outside what :func:`llmkernels.quantize` makes
([-127, 127]) but a valid int8 a user or a checkpoint can store; every path must compute
``code * scale`` for it as for any other code (the AVX2 integer dot product once negated a
weight code of -128, which overflowed: a silently wrong decode).

Reference: ``ref_quantized_linear`` (float64; with ``activations="int8"`` x is replaced by its
per-token int8 blocks first, the formula of the decode path).
"""

from __future__ import annotations

import llmkernels as lk
import numpy as np
import pytest
from llmkernels.quant import int8_activations_used
from llmkernels.reference import quantized_linear as ref_quantized_linear


@pytest.mark.parametrize("activations", ["int8", "float32"])
@pytest.mark.parametrize("m", [1, 3, 8, 16, 17])
def test_code_minus_128_matches_the_reference(isa: str, activations: str, m: int) -> None:
    rng = np.random.default_rng(m)
    w = rng.standard_normal((33, 96)).astype(np.float32)
    q, s = lk.quantize(w, 8, 32)
    q[::2, ::3] = -128  # every third code of every other row
    q[1] = -128  # a whole row
    x = rng.standard_normal((m, 96)).astype(np.float32)
    got = lk.quantized_linear(x, q, s, 8, 32, activations=activations)
    # the int8-activation path is exact integer arithmetic then one float32 FMA per block
    acts = activations if int8_activations_used(m) else "float32"  # int8: the GEMV's (+ VNNI)
    want = ref_quantized_linear(x, q, s, 8, 32, activations=acts)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_module_with_minus_128_codes_decodes_as_its_dequantized_weights() -> None:
    ffn = lk.FeedForward(64, 128, seed=0).quantize(8, 32)
    sd = {k: v.copy() for k, v in ffn.state_dict().items()}
    for k in sd:
        if k.endswith(".qweight"):
            sd[k][::3] = -128
    ffn.load_state_dict(sd)
    ref = lk.FeedForward(64, 128, seed=0)
    ref.load_state_dict(
        {
            k[: -len(".qweight")] + ".weight": lk.dequantize(v, sd[k[:-8] + ".scales"], 8, 32)
            for k, v in sd.items()
            if k.endswith(".qweight")
        }
    )
    x = np.random.default_rng(1).standard_normal((1, 1, 64)).astype(np.float32)
    want = ref(x)
    # decode quantizes the activations to int8 blocks: within their rounding, not off by O(1)
    np.testing.assert_allclose(ffn(x), want, atol=0.02 * np.abs(want).max())
