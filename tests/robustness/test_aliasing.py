"""Operands that share memory with ``out=``: every operand of every op that takes ``out``.

The rule: the result written to ``out`` equals the result the op
gives on private copies of its operands, whatever the overlap -- identical views, shifted views,
strided or reversed views of the same buffer -- and nothing outside ``out`` is written. The ops
copy an operand that may overlap ``out`` (``np.may_share_memory``, a superset of exact
overlap) unless the kernel provably reads each element before writing it (the exact alias of an
elementwise/row-wise input).

The reference here is the op itself on copies: the aliasing bug class is "an operand read after
being overwritten", which shows as a difference from the same op on unaliased inputs.
"""

from __future__ import annotations

import llmkernels as lk
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def _view(buf: np.ndarray, shape: tuple[int, ...], offset: int, step: int) -> np.ndarray:
    """A view of ``buf`` with ``shape``: elements ``offset, offset + step, ...`` (step may be
    negative: a reversed view), reshaped (a strided reshape stays a view)."""
    n = int(np.prod(shape))
    if step > 0:
        flat = buf[offset : offset + n * step : step]
    else:
        start = offset + (n - 1) * (-step)
        flat = buf[start::step][:n] if start >= 0 else buf[:0]
    assert flat.size == n and np.shares_memory(flat, buf)
    return flat.reshape(shape)


# op name -> (builder of operand shapes, call with (operands dict, out))
def _shapes(op: str, a: int, b: int, c: int) -> tuple[dict[str, tuple[int, ...]], tuple]:
    """Operand shapes and the output shape for an op at small sizes a, b, c."""
    if op == "rms_norm":
        return {"x": (a, b), "weight": (b,)}, (a, b)
    if op == "layer_norm":
        return {"x": (a, b), "weight": (b,), "bias": (b,)}, (a, b)
    if op == "silu":
        return {"x": (a, b)}, (a, b)
    if op == "swiglu":
        return {"gate": (a, b), "up": (a, b)}, (a, b)
    if op == "rope":
        return {"x": (a, b, 2 * c), "inv_freq": (c,)}, (a, b, 2 * c)
    if op == "attention":
        return (
            {"q": (2, a, c), "k": (1, b, c), "v": (1, b, c + 1), "mask": (a, b)},
            (2, a, c + 1),
        )
    raise AssertionError(op)


def _call(op: str, args: dict[str, np.ndarray], out: np.ndarray | None) -> np.ndarray:
    kw = {} if out is None else {"out": out}
    if op == "rms_norm":
        return lk.rms_norm(args["x"], args["weight"], **kw)
    if op == "layer_norm":
        return lk.layer_norm(args["x"], args["weight"], args["bias"], **kw)
    if op == "silu":
        return lk.silu(args["x"], **kw)
    if op == "swiglu":
        return lk.swiglu(args["gate"], args["up"], **kw)
    if op == "rope":
        # frequencies from the buffer's values: any finite numbers are valid frequencies
        return lk.rope(args["x"], inv_freq=args["inv_freq"], **kw)
    if op == "attention":
        return lk.attention(args["q"], args["k"], args["v"], mask=args["mask"], causal=True, **kw)
    raise AssertionError(op)


OPS = ["rms_norm", "layer_norm", "silu", "swiglu", "rope", "attention"]


@given(
    op=st.sampled_from(OPS),
    dtype=st.sampled_from([F32, F64]),
    # sizes past one 64-row attention tile and past SIMD widths (tails)
    sizes=st.tuples(
        st.sampled_from([1, 2, 5, 7, 33, 70]),
        st.sampled_from([1, 3, 9, 17, 65]),
        st.sampled_from([1, 2, 4]),
    ),
    data=st.data(),
)
def test_operands_overlapping_out(op, dtype, sizes, data):
    shapes, out_shape = _shapes(op, *sizes)
    n_out = int(np.prod(out_shape))
    biggest = max(int(np.prod(s)) for s in shapes.values())
    length = 3 * (n_out + 2 * biggest) + 8
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    buf = rng.standard_normal(length).astype(dtype)
    original = buf.copy()

    out_offset = data.draw(st.integers(0, length - n_out), label="out_offset")
    out = buf[out_offset : out_offset + n_out].reshape(out_shape)  # C-contiguous, as required
    # each operand: its own fresh array, or a view into the same buffer (overlapping out or not)
    args: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        n = int(np.prod(shape))
        if data.draw(st.booleans(), label=f"{name} aliased"):
            step = data.draw(st.sampled_from([1, 1, 2, -1, -2]), label=f"{name} step")
            reach = (n - 1) * abs(step) + 1
            offset = data.draw(st.integers(0, length - reach), label=f"{name} offset")
            args[name] = _view(buf, shape, offset, step)
        else:
            args[name] = rng.standard_normal(shape).astype(dtype)
    want = _call(op, {k: np.array(v, copy=True) for k, v in args.items()}, None)

    got = _call(op, args, out)
    assert got is out
    np.testing.assert_array_equal(out, want, err_msg=f"{op}: aliased operands")
    # nothing outside out was written
    outside = np.ones(length, bool)
    outside[out_offset : out_offset + n_out] = False
    np.testing.assert_array_equal(buf[outside], original[outside])


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_attention_mask_shares_out(dtype, n_threads, threads):
    """The case that was found: a float mask whose rows for the second 64-query tile are the
    first tile's output rows (written before the second tile reads its mask)."""
    lk.set_num_threads(n_threads)
    rng = np.random.default_rng(0)
    tq, tk = 128, 16
    buf = np.zeros((tq + 64) * tk, dtype)
    out = buf[64 * tk :].reshape(1, tq, tk)  # out row i is buffer row i + 64
    mask = buf[: tq * tk].reshape(tq, tk)  # mask row r is buffer row r
    mask[...] = rng.standard_normal((tq, tk))
    q = rng.standard_normal((1, tq, 4)).astype(dtype)
    k = rng.standard_normal((1, tk, 4)).astype(dtype)
    v = rng.standard_normal((1, tk, tk)).astype(dtype)
    want = lk.attention(q, k, v, mask=mask.copy())
    lk.attention(q, k, v, mask=mask, out=out)
    np.testing.assert_array_equal(out, want)
