"""Quantized models at their edges (found by an adversarial review): a failed
``load_state_dict`` of a tied, quantized model changes nothing; a model whose blocks were
quantized on their own is refused by ``save_pretrained`` (it wrote a checkpoint nothing could
load); a state dict giving one matrix twice (float and quantized) is refused."""

from __future__ import annotations

from pathlib import Path

import llmkernels as lk
import numpy as np
import pytest

CFG = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "hidden_dim": 128,
       "vocab_size": 96, "max_seq_len": 64}  # fmt: skip


@pytest.mark.parametrize("bad", [np.inf, np.nan, 2e7])
def test_tied_quantized_load_that_fails_changes_nothing(bad: float) -> None:
    m = lk.Transformer({**CFG, "tie_embeddings": True}, seed=0, dtype="int8")
    before = {k: v.copy() for k, v in m.state_dict().items()}
    e = np.random.default_rng(1).standard_normal((96, 64)).astype(np.float32)
    e[5, 5] = bad  # non-finite, or finite but needing an int8 scale beyond float16
    with pytest.raises(ValueError, match=r"^\[Transformer.load_state_dict\] lm_head \(the tied"):
        m.load_state_dict({"model.embed_tokens.weight": e}, strict=False)
    after = m.state_dict()
    assert all(np.array_equal(after[k], before[k]) for k in before)


def test_save_pretrained_refuses_a_partly_quantized_model(tmp_path: Path) -> None:
    m = lk.Transformer(CFG, seed=0)
    m.blocks[1].feed_forward.quantize(4)
    with pytest.raises(ValueError, match=r"^\[save_pretrained\] the model mixes quantized"):
        m.save_pretrained(tmp_path / "a")
    # once the whole model is quantized it saves and loads back
    m.quantize(4)
    m.save_pretrained(tmp_path / "c")
    ids = np.array([[1, 2, 3]])
    np.testing.assert_array_equal(lk.Transformer.from_pretrained(tmp_path / "c")(ids), m(ids))


def test_a_matrix_given_twice_is_refused() -> None:
    ffn = lk.FeedForward(64, 128, seed=0).quantize(8)
    sd = dict(ffn.state_dict())
    sd["up_proj.weight"] = np.zeros((128, 64), np.float32)
    with pytest.raises(KeyError, match=r"up_proj.weight and up_proj.qweight"):
        ffn.load_state_dict(sd)


# ------------------------------------------------------------------------------------------
# edges found by an adversarial pass (session 12)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 9, 17])
@pytest.mark.parametrize("activations", ["float32", "int8"])
def test_quantized_linear_of_an_empty_inner_dimension(m, activations):
    """k = 0: an empty sum, the bias (was a floating-point exception or uninitialised memory
    in the kernel, a NumPy reshape error in the wrapper)."""
    x = np.ones((m, 0), np.float32)
    bias = np.array([1.0, 2.0, 3.0], np.float32)
    for bits, codes in ((8, np.zeros((3, 0), np.int8)), (4, np.zeros((3, 0), np.uint8))):
        scales = np.zeros((3, 0), np.float16)
        y = lk.quantized_linear(x, codes, scales, bits, 32, bias=bias, activations=activations)
        np.testing.assert_array_equal(y, np.broadcast_to(bias, (m, 3)))
        y = lk.quantized_linear(x, codes, scales, bits, 32, activations=activations)
        np.testing.assert_array_equal(y, np.zeros((m, 3), np.float32))


def test_quantize_takes_bfloat16(rng):
    """A bf16 model's state_dict holds ml_dtypes.bfloat16 arrays: quantize and
    quantized_linear widen them (exactly) as float16 ones."""
    import ml_dtypes

    w = rng.standard_normal((8, 64)).astype(ml_dtypes.bfloat16)
    q, s = lk.quantize(w, 8, 32)
    q32, s32 = lk.quantize(w.astype(np.float32), 8, 32)
    np.testing.assert_array_equal(q, q32)
    np.testing.assert_array_equal(s, s32)
    x = rng.standard_normal((3, 64)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(
        lk.quantized_linear(x, q, s, 8, 32), lk.quantized_linear(x.astype(np.float32), q, s, 8, 32)
    )


@pytest.mark.parametrize("target", ["float32", "bfloat16", "float16"])
def test_to_a_float_dtype_of_a_model_with_one_module_quantized(target):
    """One FFN quantized on its own: to(float) dequantizes it too (was a bare KeyError, or a
    silent no-op for float32 that left it int8)."""
    cfg = {"dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 128, "vocab_size": 96}
    model = lk.Transformer(cfg, seed=0)
    model.blocks[0].feed_forward.quantize(8)
    want = model([[1, 2, 3, 4]])
    model.to(target)
    assert model.dtype == target and model.blocks[0].feed_forward.dtype == target
    assert not any(k.endswith(".qweight") for k in model.state_dict())
    # (the int8 module's few-token products run on int8 activations: within 5e-2)
    np.testing.assert_allclose(model([[1, 2, 3, 4]]), want, rtol=5e-2, atol=5e-2)


def test_save_pretrained_keeps_the_checkpoints_token_ids(tmp_path):
    """bos / eos / pad ids of the loaded checkpoint are written back (transformers builds the
    padding row from pad_token_id: Phi-3's default, 32000, is past a small vocabulary)."""
    import json

    import torch
    import transformers

    cfg = transformers.Phi3Config(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        vocab_size=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=[2, 3],
    )
    torch.manual_seed(0)
    transformers.Phi3ForCausalLM(cfg).save_pretrained(tmp_path / "hf")
    ours = lk.Transformer.from_pretrained(tmp_path / "hf", progress=False)
    ours.to("bfloat16").save_pretrained(tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert (saved["pad_token_id"], saved["bos_token_id"], saved["eos_token_id"]) == (0, 1, [2, 3])
    transformers.Phi3ForCausalLM.from_pretrained(tmp_path / "ours")  # loads
    # a model made from a config: no ids known, and no out-of-range padding row written
    fresh = lk.Transformer(ours.config, seed=0)
    fresh.save_pretrained(tmp_path / "fresh")
    transformers.Phi3ForCausalLM.from_pretrained(tmp_path / "fresh")
