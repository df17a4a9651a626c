"""Transformer.decode: one decode step of independent sequences, each on its own cache.

Row b of ``model.decode(ids, caches)`` is the single-sequence step
``model(ids[b:b+1, None], cache=caches[b], last_only=True)[0, -1]``: bit for bit with int8 /
int4 weights (per-token int8 activations, exact integer sums), within float32 rounding of the
grouped projections with float weights; the caches advance as they would (same keys, values,
lengths and positions). Swept: weight dtypes, families (window, soft-capping, q/k norms,
biases, fused projections), sequence counts 1-16 at different lengths, a rolling (sliding
window) cache past its window, dynamic RoPE, threads; and the errors.
"""

from __future__ import annotations

import llmkernels as lk
import numpy as np
import pytest

BASE = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "hidden_dim": 96,
        "vocab_size": 97, "max_seq_len": 256}  # fmt: skip


def model_of(dtype: str, **cfg: object) -> lk.Transformer:
    m = lk.Transformer({**BASE, **cfg}, seed=3)
    if dtype in ("int8", "int4"):
        m.quantize(bits=int(dtype[3:]), group_size=32)
    elif dtype != "float32":
        m.to(dtype)
    return m


def run_both(model: lk.Transformer, lengths: list[int], steps: int, seed: int = 0) -> tuple:
    """(single-step logits, decode logits, single caches, decode caches) over ``steps`` steps
    of sequences whose prompts have ``lengths``."""
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size
    solo = [model.new_cache(1, 128) for _ in lengths]
    together = [model.new_cache(1, 128) for _ in lengths]
    for n, a, b in zip(lengths, solo, together, strict=True):
        prompt = rng.integers(0, vocab, (1, n))
        model(prompt, cache=a, last_only=True)
        model(prompt, cache=b, last_only=True)
    got, want = [], []
    for _ in range(steps):
        ids = rng.integers(0, vocab, len(lengths))
        want.append(
            np.stack([model(np.array([[t]]), cache=c, last_only=True)[0, -1]
                      for t, c in zip(ids, solo, strict=True)])
        )  # fmt: skip
        got.append(model.decode(ids, together))
    return np.stack(want), np.stack(got), solo, together


def assert_caches_equal(a: list, b: list, exact: bool, tol: float = 1e-5) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.length == y.length
        np.testing.assert_array_equal(x.next_positions, y.next_positions)
        for lx, ly in zip(x.layers, y.layers, strict=True):
            for gx, gy in ((lx.keys(), ly.keys()), (lx.values(), ly.values())):
                gx, gy = np.asarray(gx, np.float32), np.asarray(gy, np.float32)
                if exact:
                    np.testing.assert_array_equal(gx, gy)
                else:
                    np.testing.assert_allclose(gx, gy, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("n", [1, 2, 5, 9, 16])
def test_quantized_rows_are_bitwise_single_steps(dtype: str, n: int) -> None:
    model = model_of(dtype)
    lengths = [1 + (7 * i) % 23 for i in range(n)]
    want, got, solo, together = run_both(model, lengths, steps=4)
    np.testing.assert_array_equal(got, want)
    assert_caches_equal(solo, together, exact=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("n", [1, 3, 8, 12])
def test_float_rows_match_single_steps(dtype: str, n: int) -> None:
    model = model_of(dtype)
    want, got, solo, together = run_both(model, [3 + 5 * i for i in range(n)], steps=3)
    if n == 1:  # one row: the single step's kernels, bit for bit
        np.testing.assert_array_equal(got, want)
    scale = np.abs(want).max()
    # bf16 weights above 8 rows may take the bf16 dot-product kernels (bf16 activations)
    tol = 2e-2 if dtype == "bfloat16" and n > 8 else 1e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)
    assert_caches_equal(solo, together, exact=n == 1, tol=tol)


FAMILY_CFGS = {
    "window": {"sliding_window": 6},  # rolling caches, decoded past the window
    "softcap": {"attn_softcap": 30.0, "final_softcap": 20.0},
    "qk_norm": {"qk_norm": True, "head_dim": 16},
    "bias": {"attention_bias": True},
    "post_norm": {"norm_position": "post"},
}


@pytest.mark.parametrize("name", list(FAMILY_CFGS))
def test_family_features(name: str) -> None:
    try:
        model = model_of("int8", **FAMILY_CFGS[name])
    except (TypeError, ValueError) as exc:  # a feature this config form does not take
        pytest.skip(f"config: {exc}")
    want, got, solo, together = run_both(model, [2, 9, 4], steps=8)
    np.testing.assert_array_equal(got, want)
    assert_caches_equal(solo, together, exact=True)


def test_dynamic_rope_rows_use_their_own_length() -> None:
    scaling = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}
    model = model_of("int8", rope_scaling=scaling)
    want, got, _, _ = run_both(model, [3, 14, 6], steps=4)  # one under, one over 8
    np.testing.assert_array_equal(got, want)


def test_threads_do_not_change_rows() -> None:
    model = model_of("float32")
    before = lk.get_num_threads()
    try:
        outs = []
        for t in (1, 2):
            lk.set_num_threads(t)
            outs.append(run_both(model, [4, 7, 2], steps=3)[1])
    finally:
        lk.set_num_threads(before)
    np.testing.assert_array_equal(outs[0], outs[1])


def test_errors() -> None:
    model = model_of("float32")
    a, b = model.new_cache(1, 8), model.new_cache(1, 8)
    model([[1, 2]], cache=a)
    with pytest.raises(TypeError, match=r"\[Transformer.decode\] ids must be a 1-D"):
        model.decode([[1, 2]], [a, b])
    with pytest.raises(ValueError, match="2 ids but 1 caches"):
        model.decode([1, 2], [a])
    with pytest.raises(ValueError, match="appears twice"):
        model.decode([1, 2], [a, a])
    with pytest.raises(TypeError, match="list of ModelCache"):
        model.decode([1], a)
    with pytest.raises(ValueError, match="one sequence"):
        model.decode([1], [model.new_cache(2, 8)])
    with pytest.raises(ValueError, match=r"ids must be in \[0, vocab_size=97\), got 500"):
        model.decode([1, 500], [a, b])
    other = model_of("float32", n_layers=3)
    with pytest.raises(TypeError, match="this model's new_cache"):
        model.decode([1], [other.new_cache(1, 8)])
    full = model.new_cache(1, 2)
    model([[1, 2]], cache=full)
    with pytest.raises(ValueError, match="KV cache is full"):
        model.decode([1, 3], [b, full])
    assert (a.length, b.length, full.length) == (2, 0, 2)  # a failed step appends nothing
    assert model.decode([], []).shape == (0, 97)
