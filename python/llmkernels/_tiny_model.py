"""A tiny random-weight checkpoint with a byte-level tokenizer and a chat template, written on
the spot for examples, docstrings and tests (:func:`write_tiny_model`)."""

from __future__ import annotations

import os

import numpy as np

from .nn import Transformer

_TINY_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def write_tiny_model(
    directory: str | os.PathLike[str], *, seed: int = 0, dim: int = 64, n_layers: int = 2
) -> str:
    """Write a tiny random-weight LLaMA checkpoint with a byte-level tokenizer (256 byte
    tokens, ``<s>``, ``</s>``, ``<pad>`` and chat markers) and a chat template into
    ``directory`` — an HF-style directory :func:`load` reads, for examples and tests (its
    output is noise). Returns the directory.

    Examples:
        >>> import tempfile, llmkernels as lk
        >>> from llmkernels.text import write_tiny_model
        >>> model, tok = lk.load(write_tiny_model(tempfile.mkdtemp()))
        >>> tok.decode(tok.encode("héllo"), skip_special_tokens=True)
        'héllo'
    """
    import json

    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, processors

    from ._safetensors import save_file

    path = os.fspath(directory)
    os.makedirs(path, exist_ok=True)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda c: ord(c))
    vocab = {c: i for i, c in enumerate(alphabet)}
    tok = RustTokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
    tok.add_special_tokens(specials)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    tok.save(os.path.join(path, "tokenizer.json"))
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    end = tok.token_to_id("<|end|>")
    eos = tok.token_to_id("</s>")
    files = {
        "tokenizer_config.json": {
            "bos_token": "<s>",
            "eos_token": "</s>",
            "pad_token": "<pad>",
            "chat_template": _TINY_TEMPLATE,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
        "generation_config.json": {"bos_token_id": bos, "eos_token_id": [eos, end]},
        "config.json": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": vocab_size,
            "hidden_size": dim,
            "intermediate_size": 2 * dim,
            "num_hidden_layers": n_layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 512,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
            "bos_token_id": bos,
            "eos_token_id": eos,
        },
    }
    for name, content in files.items():
        with open(os.path.join(path, name), "w", encoding="utf-8") as f:
            json.dump(content, f, indent=1)
    model = Transformer(files["config.json"], seed=seed)
    # weights larger than HF's 0.02 init, so the noise it generates varies
    rng = np.random.default_rng(seed)
    state = {
        k: (v if v.ndim == 1 else rng.standard_normal(v.shape, np.float32) * 0.3)
        for k, v in model.state_dict().items()
    }
    # the LM head scores only printable ASCII bytes, so the noise decodes to readable text
    byte_of = {c: b for b, c in enumerate(_bytes_to_unicode())}
    printable = np.array(
        [32 <= byte_of.get(c, -1) < 127 for c in alphabet] + [False] * len(specials)
    )
    state["lm_head.weight"][~printable] = 0.0
    save_file(os.path.join(path, "model.safetensors"), state)
    return path


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table (ByteLevel's alphabet), by byte value."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]
