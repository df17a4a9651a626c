"""The example model that ships with the package (``lk.example_model()``): it loads with
``lk.load`` as any HF directory does, transformers loads the same files and agrees with it, and
what it writes is words.

Bounds only: another training run (another torch) gives other weights.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import llmkernels as lk
import numpy as np
import pytest

DIR = Path(lk.example_model())


@pytest.fixture(scope="module")
def loaded():
    return lk.load(DIR)


def test_the_directory_is_a_small_hf_checkpoint_with_a_card():
    names = {p.name for p in DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", "chat_template.jinja", "README.md"} <= names  # fmt: skip
    assert sum(p.stat().st_size for p in DIR.iterdir() if p.is_file()) <= 10 * 2**20
    card = (DIR / "README.md").read_text(encoding="utf-8")
    for needed in ("Python documentation", "PSF License", "train_example_model.py"):
        assert needed in card
    config = json.loads((DIR / "config.json").read_text())
    assert config["model_type"] == "llama" and config["dtype"] == "bfloat16"


def test_lk_load(loaded):
    model, tokenizer = loaded
    assert model.dtype == "bfloat16" and model.config.n_layers == 6
    assert model.config.tie_embeddings and tokenizer.vocab_size == 4096
    ids = tokenizer.encode("The list type is mutable.")
    assert ids[0] == tokenizer.bos_token_id and tokenizer.decode(ids[1:]) == (
        "The list type is mutable."
    )
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}],
                                           add_generation_prompt=True)  # fmt: skip
    assert tokenizer.decode(prompt).endswith("<|user|>\nHi<|end|>\n<|assistant|>\n")


def _words(text: str) -> list[str]:
    return re.findall(r"\S+", text)


def test_it_writes_words(loaded):
    """Greedy text from a trained model: mostly dictionary-shaped words, no byte soup."""
    model, tokenizer = loaded
    text = lk.generate(model, tokenizer, "The dictionary", max_tokens=48, temperature=0)
    words = _words(text)
    assert len(words) >= 8, text
    plain = [w for w in words if re.fullmatch(r"[A-Za-z][a-z]*[.,;:)]?|\(?[a-z_.]+\)?", w)]
    assert len(plain) >= 0.7 * len(words), text
    assert "\ufffd" not in text and not re.search(r"[\x00-\x08\x0e-\x1f]", text)


def test_transformers_loads_it_and_agrees():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(DIR, dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(DIR)
    model, tokenizer = lk.load(DIR)
    text = "A tuple is an immutable sequence."
    ids = tokenizer.encode(text)
    assert hf_tok(text)["input_ids"] == ids
    messages = [{"role": "user", "content": "What is a set?"}]
    assert list(hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                           return_dict=False)) == list(  # fmt: skip
        tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    )
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits.numpy()
    ours = model(np.array([ids]))
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    # greedy decoding, token for token
    with torch.no_grad():
        hf_out = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                             eos_token_id=None, pad_token_id=1)[0, len(ids):].tolist()  # fmt: skip
    ours_out = model.generate(ids, max_new_tokens=24, progress=False)
    assert list(np.asarray(ours_out).ravel()[-24:]) == hf_out
