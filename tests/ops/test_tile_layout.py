"""int8 matrices stored in AMX's tile layout (drivers/qlinear.hpp tile_int8, modules/modules.hpp
MatrixLayout): where the AMX kernel runs (natively, or its emulated twin when forced), a
module's forward keeps its int8 matrices as the kernel's B tiles, so no call repacks them. The
layout never shows: state_dict views are of the plain layout, and a forward changes a matrix's
layout only while no view of it is alive. The products stay the AVX2 GEMV's, bit for bit: the
tile kernel (m > 3) and the small-batch GEMV on the tile layout (m <= 3) both keep its float
arithmetic per (row, token), so a forward of m tokens equals the AVX2 GEMV run on each alone.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

import llmkernels as lk
import numpy as np
import pytest
from test_quant_vnni import HAS_AVX2, avx2_gemv

AMX_PATHS = ["amx_emu"] + (["amx"] if lk._core.cpu_has_amx else [])
pytestmark = pytest.mark.skipif(not HAS_AVX2, reason="the AMX kernels run on AVX2 hosts and up")


@pytest.fixture(params=AMX_PATHS)
def amx(request: pytest.FixtureRequest) -> Iterator[str]:
    # Every other kernel on the AVX2 path, as the references run them: the SwiGLU, the
    # activation quantizer and the float side are not bit for bit alike across the SIMD paths
    # (e.g. AVX-512 against AVX2 without optimization, which contracts no FMA), and one code
    # flipped by a last-bit difference moves a whole token's output
    previous = lk.simd_arch()
    lk.set_simd_arch("avx2")
    lk._core._set_int8_dot(request.param)
    yield request.param
    lk._core._set_int8_dot("auto")
    lk.set_simd_arch(previous)


@contextmanager
def avx2_int8_dot() -> Iterator[None]:
    """The AVX2 integer kernels of the int8 product (plain layout), every other kernel as it is."""
    lk._core._set_int8_dot("avx2")
    try:
        yield
    finally:
        lk._core._set_int8_dot("auto")


def per_token(module, x: np.ndarray) -> np.ndarray:
    """module on each token alone on the AVX2 GEMV (plain layout)."""
    with avx2_gemv():
        return np.concatenate([module(x[i : i + 1]) for i in range(len(x))])


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 16, 17, 33])
def test_ffn_equals_avx2_gemv_per_token(amx, group, m, rng):
    ffn = lk.FeedForward(128, 384, seed=1).quantize(bits=8, group_size=group)
    x = rng.standard_normal((m, 128)).astype(np.float32)
    want = per_token(ffn, x)
    assert ffn._impl.tiled_matrices == 0  # (the AVX2 path: plain)
    got = ffn(x)
    assert ffn._impl.tiled_matrices == 2
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ffn(x), want)  # (tiled already: the same again)


def test_lone_last_group_of_16_rows(amx):
    # an LM head of 80 rows: its second 64-row block is one group of 16 rows alone
    cfg = {
        "vocab_size": 80,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "tie_word_embeddings": False,
    }
    model = lk.Transformer(cfg, dtype="int8", seed=2)
    for m in (1, 5, 12):
        ids = np.arange(m)[None] % 80
        with avx2_int8_dot():
            want = model(ids)
        lk._core._set_int8_dot(amx)
        assert model._impl.tiled_matrices == 0
        np.testing.assert_array_equal(model(ids), want)
        assert model._impl.tiled_matrices == 1


def test_views_show_the_plain_layout(amx, rng):
    ffn = lk.FeedForward(64, 96, seed=3).quantize(bits=8)
    plain = {k: v.copy() for k, v in ffn.state_dict().items()}
    gc.collect()
    x = rng.standard_normal((5, 64)).astype(np.float32)
    y = ffn(x)
    assert ffn._impl.tiled_matrices == 2
    sd = ffn.state_dict()  # untiled first
    assert ffn._impl.tiled_matrices == 0
    for k, v in plain.items():
        np.testing.assert_array_equal(sd[k], v)
    # a live view keeps the plain layout, and writing to it changes the module
    np.testing.assert_array_equal(ffn(x), y)
    assert ffn._impl.tiled_matrices == 0
    sd["down_proj.qweight"][:] = 0
    np.testing.assert_array_equal(ffn(x), np.zeros_like(y))
    del sd
    gc.collect()
    np.testing.assert_array_equal(ffn(x), np.zeros_like(y))
    assert ffn._impl.tiled_matrices == 2  # no view left: tiled again
    ffn.load_state_dict(plain)
    np.testing.assert_array_equal(ffn(x), y)


def test_other_paths_read_tiled_weights(amx, rng):
    # a matrix tiled under the AMX path, then another kernel before any forward relayouts it:
    # qlinear's fallback untiles into scratch (forced GEMM route, float activations)
    ffn = lk.FeedForward(64, 96, seed=4).quantize(bits=8)
    x = rng.standard_normal((20, 64)).astype(np.float32)
    ffn(x)
    assert ffn._impl.tiled_matrices == 2
    want = per_token(ffn, x)  # (untiles: the AVX2 path wants the plain layout)
    np.testing.assert_array_equal(ffn(x), want)


def test_model_and_round_trip(amx, tmp_path):
    path = lk.example_model()
    model = lk.Transformer.from_pretrained(path, dtype="int8")
    ids = np.arange(1, 12)[None]
    with avx2_int8_dot():
        want = model(ids)[0]
    lk._core._set_int8_dot(amx)
    got = model(ids)[0]
    layers = model.blocks
    tiled = [b.attention._impl.tiled_matrices + b.feed_forward._impl.tiled_matrices for b in layers]
    assert tiled == [4] * len(layers)
    assert model._impl.tiled_matrices == 1  # the quantized LM head
    np.testing.assert_array_equal(got, want)
    model.save_pretrained(tmp_path / "m")
    again = lk.Transformer.from_pretrained(tmp_path / "m")
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(again.state_dict()[k], v)
    np.testing.assert_array_equal(again(ids)[0], got)


def test_rows_not_in_groups_of_16_stay_plain(amx, rng):
    # head_dim 8, one kv head: v starts at row 40, not a multiple of 16
    mha = lk.MultiHeadAttention(32, 4, 1, head_dim=8, seed=5).quantize(bits=8)
    x = rng.standard_normal((1, 3, 32)).astype(np.float32)
    mha(x)
    assert mha._impl.tiled_matrices == 1  # o_proj only (32 rows)
