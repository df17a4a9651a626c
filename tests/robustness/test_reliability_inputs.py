"""Inputs at the edges of what the contract allows:

* dtypes NumPy considers equal to float32/float64 (pickled, with metadata) are accepted by the
  ops, the modules and ``_core`` itself; non-native byte order is converted;
* numbers too large for a float (``10**400``) are errors naming the argument;
* positions are validated by value whatever their dtype, and a cache's next position cannot
  wrap int64;
* empty dimensions give NumPy's answer (``swiglu_ffn`` with D = 0);
* the RoPE table cache is safe under threads and bounded in bytes.
"""

from __future__ import annotations

import pickle
import threading

import llmkernels as lk
import numpy as np
import pytest
from llmkernels import pure
from llmkernels import reference as ref

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def _variants(dtype: np.dtype):
    """Arrays of dtypes equal to ``dtype`` that are not its canonical object, and byte-swapped."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((3, 5, 8)).astype(dtype)
    pickled = pickle.loads(pickle.dumps(base))
    meta = base.astype(np.dtype(dtype, metadata={"unit": "m"}))
    swapped = base.astype(dtype.newbyteorder(">" if dtype.byteorder != ">" else "<"))
    return base, {"pickled": pickled, "metadata": meta, "byteswapped": swapped}


@pytest.mark.parametrize("dtype", [F32, F64])
def test_equal_dtypes_accepted_by_every_op(dtype):
    base, variants = _variants(dtype)
    w = np.linspace(0.5, 1.5, 8).astype(dtype)
    ops = {
        "rms_norm": lambda x: lk.rms_norm(x, w),
        "layer_norm": lambda x: lk.layer_norm(x, w, w),
        "silu": lambda x: lk.silu(x),
        "swiglu": lambda x: lk.swiglu(x, x),
        "swiglu_ffn": lambda x: lk.swiglu_ffn(x, np.ones((8, 4), dtype), np.ones((8, 4), dtype)),
        "rope": lambda x: lk.rope(x),
        "attention": lambda x: lk.attention(x, x, x, causal=True),
    }
    for name, op in ops.items():
        want = op(base)
        for kind, arr in variants.items():
            got = op(arr)
            assert got.dtype == want.dtype, (name, kind)
            np.testing.assert_array_equal(got, want, err_msg=f"{name} on {kind}")


@pytest.mark.parametrize("dtype", [F32, F64])
def test_equal_dtypes_accepted_by_core_and_out(dtype):
    """``_core`` compares dtypes as NumPy does (``out`` with metadata is float32 too)."""
    base, variants = _variants(dtype)
    x = variants["pickled"]
    out = np.empty(base.shape, np.dtype(dtype, metadata={"k": 1}))
    lk.silu(x, out=out)
    np.testing.assert_array_equal(out, lk.silu(base))
    res = np.empty_like(base)
    lk._core.silu(x.reshape(-1), res.reshape(-1))
    np.testing.assert_array_equal(res, lk.silu(base))


def test_equal_dtypes_accepted_by_modules():
    base, variants = _variants(F32)
    norm = lk.RMSNorm(8)
    ffn = lk.FeedForward(8, 16, seed=0)
    for kind, arr in variants.items():
        np.testing.assert_array_equal(norm(arr), norm(base), err_msg=kind)
        np.testing.assert_array_equal(ffn(arr), ffn(base), err_msg=kind)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: lk.rms_norm(np.ones((2, 4)), eps=10**400), r"^\[rms_norm\] eps must be finite"),
        (lambda: lk.layer_norm(np.ones((2, 4)), eps=10**400), r"^\[layer_norm\] eps must"),
        (
            lambda: lk.attention(
                np.ones((1, 2, 4)), np.ones((1, 2, 4)), np.ones((1, 2, 4)), scale=10**400
            ),
            r"^\[attention\] scale must be finite",
        ),
        (lambda: lk.rope(np.ones((2, 4)), theta=10**400), r"^\[rope\] theta must be finite"),
        (lambda: lk.RMSNorm(4, eps=10**400), r"^\[RMSNorm\] eps must be a number in \[0, 1\)"),
        (lambda: lk.LayerNorm(4, eps=-(10**400)), r"^\[LayerNorm\] eps must be"),
    ],
)
def test_huge_numbers_name_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    "x_shape, h, out_dim",
    [((3, 0), 4, 5), ((2, 3, 0), 4, None), ((3, 4), 0, 5), ((0, 4), 6, 5), ((3, 4), 6, 0)],
)
@pytest.mark.parametrize("biases", [False, True])
def test_swiglu_ffn_empty_dimensions(x_shape, h, out_dim, biases):
    """NumPy's answer: a product over an empty inner dimension is zeros, biases still apply."""
    rng = np.random.default_rng(1)
    d = x_shape[-1]
    x = rng.standard_normal(x_shape)
    wg, wu = rng.standard_normal((d, h)), rng.standard_normal((d, h))
    wd = None if out_dim is None else rng.standard_normal((h, out_dim))
    kw = {}
    if biases:
        kw = {"b_gate": rng.standard_normal(h), "b_up": rng.standard_normal(h)}
        if wd is not None:
            kw["b_down"] = rng.standard_normal(out_dim)
    got = lk.swiglu_ffn(x, wg, wu, wd, **kw)
    # reference formula: (silu(x @ wg + bg) * (x @ wu + bu)) @ wd + bd
    want = ref.swiglu_ffn(x, wg, wu, wd, **kw)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _block():
    return lk.TransformerBlock.from_config(
        {"dim": 16, "n_heads": 2, "n_kv_heads": 1, "hidden_dim": 32}, seed=0
    )


@pytest.mark.parametrize(
    "positions, ok",
    [
        (np.array([0, 2**64 - 1], np.uint64), False),  # was cast to -1
        (np.array([0, 2**63], np.uint64), False),
        (np.array([0, -1], np.int64), False),
        (np.array([0, -1], np.int8), False),
        (np.array([0, 2**32 - 1], np.uint32), True),
        (np.array([0, 2**62], np.uint64), True),
    ],
)
def test_module_positions_validated_by_value(positions, ok):
    block = _block()
    x = np.ones((1, 2, 16), np.float32)
    if ok:
        assert np.isfinite(block(x, positions=positions)).all()
    else:
        with pytest.raises(ValueError, match=r"^\[TransformerBlock\] positions must be"):
            block(x, positions=positions)


def test_module_positions_upper_bound_and_cache_wrap():
    block = _block()
    x = np.ones((1, 2, 16), np.float32)
    with pytest.raises(ValueError, match=r"^\[TransformerBlock\] positions must be <= 2\*\*62"):
        block(x, positions=np.array([2**63 - 2, 2**63 - 1], np.int64))
    cache = block.new_cache(1, 8)
    block(x, positions=np.array([2**62 - 1, 2**62], np.int64), cache=cache)
    assert cache.next_positions[0] == 2**62 + 1  # no wrap
    with pytest.raises(ValueError, match=r"^\[TransformerBlock\] the cache's positions"):
        block(x[:, :1], cache=cache)  # the default position 2**62 + 1 is past the bound
    assert cache.length == 2  # nothing appended by the refused call


def test_rope_table_cache_threads_and_bound():
    """Threads evicting the LRU concurrently never see a KeyError; the cache stays within its
    byte budget however many distinct large calls were made."""
    from llmkernels import _ops

    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(200):
                t = int(rng.integers(1, 64))
                x = rng.standard_normal((t, 16)).astype(np.float32)
                pos = rng.integers(0, 10**6, t)
                np.testing.assert_allclose(lk.rope(x, pos), ref.rope(x, pos), rtol=2e-5, atol=1e-5)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    # many distinct tables near the per-entry limit: the total stays within the budget
    for i in range(40):
        lk.rope(np.ones((8192, 256), np.float32), np.arange(8192) + i * 10**5)
        assert _ops._table_cache_used <= _ops._TABLE_CACHE_BYTES
    assert _ops._table_cache_used == sum(c.nbytes + s.nbytes for c, s in _ops._TABLE_CACHE.values())


@pytest.mark.parametrize("base", [2**24 + 3, 2**31 - 2, 2**31 + 5, 2**32 + 1, 2**40 + 7])
def test_block_positions_past_2_24_and_2_31(base):
    """Positions are int64 end to end (Python, the C++ block, the cache's next position): a
    block at positions past 2**24 and 2**31 equals the float64 reference block there, and a
    cached decode continues from them."""
    cfg = {"dim": 32, "n_heads": 4, "n_kv_heads": 2, "hidden_dim": 64}
    block = lk.TransformerBlock.from_config(cfg, seed=1)
    rng = np.random.default_rng(base % 97)
    x = rng.standard_normal((2, 5, 32)).astype(np.float32)
    pos = base + np.stack([np.arange(5), 3 + np.arange(5)])
    want = ref.transformer_block(x, block.state_dict(), cfg, positions=pos)
    np.testing.assert_allclose(block(x, positions=pos), want, rtol=1e-4, atol=1e-5)
    cache = block.new_cache(2, 8)
    block(x[:, :4], positions=pos[:, :4], cache=cache)
    assert list(cache.next_positions) == list(pos[:, 3] + 1)
    np.testing.assert_allclose(block(x[:, 4:], cache=cache), want[:, 4:], rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------
# edges found by an adversarial pass (session 12)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [1e-80, 1e-300, 5e-324])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_norms_of_a_zero_or_constant_row_with_a_tiny_eps(eps, dtype, isa):
    """1/sqrt(eps) past float32's range: a zero row is zeros and a constant row exactly its
    bias (was 0 * inf = NaN in float32), as the float64 kernel and the reference give."""
    x = np.zeros((2, 33), dtype)
    x[1] = 7.0
    np.testing.assert_array_equal(lk.rms_norm(x[:1], eps=eps), 0.0)
    bias = np.arange(33, dtype=dtype)
    np.testing.assert_array_equal(lk.layer_norm(x, bias=bias, eps=eps), np.stack([bias, bias]))
    np.testing.assert_array_equal(lk.RMSNorm(33, eps=eps)(x[:1].astype(np.float32)), 0.0)


def test_rope_positions_that_do_not_convert_name_the_argument():
    x = np.ones((2, 3, 8), np.float32)

    class Bad:
        def __array__(self, *a, **k):
            raise ZeroDivisionError("no")

    for positions in ([[0, 1, 2], [0, 1]], Bad()):
        with pytest.raises(TypeError, match=r"\[rope\] positions could not be converted"):
            lk.rope(x, positions)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: lk.rope_inv_freq(8, 10**400), r"\[rope_inv_freq\] theta must be finite"),
        (
            lambda: lk.rope_inv_freq(8, 1e4, {"rope_type": "linear", "factor": 10**400}),
            r"\[rope_inv_freq\] scaling\['factor'\] must be finite",
        ),
        (
            lambda: lk.rope_attention_factor(
                {"rope_type": "yarn", "factor": 10**400, "original_max_position_embeddings": 64}
            ),
            r"\[rope_attention_factor\] scaling\['factor'\] must be finite",
        ),
        (
            lambda: lk.rope_inv_freq(
                8, 1e4, {"rope_type": "dynamic", "factor": 2.0}, seq_len=10**400
            ),
            r"\[rope_inv_freq\] seq_len must be at most 2\*\*63",
        ),
        (lambda: lk.rope_inv_freq(10**20, 1e4), r"\[rope_inv_freq\] dim must be at most 2\*\*24"),
    ],
)
def test_rope_frequency_arguments_past_float_range(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_default_rope_tables_stay_within_the_documented_bound():
    """The C++ map of the default calls' tables holds at most 8 MiB, the Python LRU 24 MiB:
    32 MiB in all (the map could hold 128 MiB of tables the LRU had dropped)."""
    import tracemalloc

    from llmkernels import _ops

    _ops._TABLE_CACHE.clear()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for t in range(960, 1024):  # 64 shapes of ~1 MiB tables each
            lk.rope(np.ones((1, t, 256), np.float32))
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert _ops._table_cache_used <= _ops._TABLE_CACHE_BYTES == 24 << 20
    assert held < 34 << 20


def test_pure_norms_of_empty_rows():
    assert pure.rms_norm([[], []]) == [[], []] and pure.layer_norm([[]]) == [[]]
