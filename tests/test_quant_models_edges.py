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
