"""Text in, text out: the tokenizer, chat template, lk.generate / lk.stream_generate.

Peers: transformers on the same directory. A byte-level BPE is trained locally with the
``tokenizers`` library on tests/data/tokenizer_corpus.txt (English, accents, Cyrillic, Greek,
CJK, emoji), saved with special tokens, a chat template in tokenizer_config.json and a
TemplateProcessing post-processor that adds BOS, beside random-weight ``LlamaForCausalLM``
models saved by transformers. transformers reads the directory with ``AutoTokenizer`` and
generates with ``generate(do_sample=False, ...)``; the reference for the text is
``tokenizer.decode(new_tokens, skip_special_tokens=True)``.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import llmkernels as lk
import numpy as np
import pytest
import torch
from _models import hf_llama_config
from llmkernels._detokenize import Detokenizer, StopText
from llmkernels.nn.sampling import sample
from llmkernels.tokenizer import TokenizerError
from transformers import AutoTokenizer, LlamaForCausalLM

CORPUS = Path(__file__).resolve().parents[1] / "data" / "tokenizer_corpus.txt"
SPECIALS = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
# the template uses what transformers passes to templates: bos_token, raise_exception, tojson
TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{{ message['content'] | tojson }}{% endif %}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
TEXTS = [
    "Hello world",
    "RMSNorm simplifies this by removing the mean subtraction.",
    "Café, crème brûlée, déjà vu — naïve façade.",
    "日本語のテキストです。你好，世界！한국어",
    "Emoji: 🎉 🚀 👍 👨‍👩‍👧 ❤️",
    "  leading and trailing spaces  ",
    "<|user|> special tokens in text </s>",
]


def train_tokenizer(directory: Path, template: str = TEMPLATE) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(CORPUS)], trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "clean_up_tokenization_spaces": False,
        "chat_template": template,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


# the HF model saved beside the tokenizer (its vocabulary size and special ids come from there)
TEXT_MODEL = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}


def make_model_dir(directory: Path, seed: int = 0) -> LlamaForCausalLM:
    """Tokenizer + a random LlamaForCausalLM saved by transformers (weights scaled up from HF's
    0.02 init so greedy text varies instead of repeating one token)."""
    directory.mkdir(parents=True, exist_ok=True)
    train_tokenizer(directory)
    tok = json.loads((directory / "tokenizer.json").read_text())
    vocab = len(tok["model"]["vocab"]) + sum(
        1 for t in tok["added_tokens"] if t["content"] not in tok["model"]["vocab"]
    )
    specials = {t["content"]: t["id"] for t in tok["added_tokens"]}
    ids = {
        "bos_token_id": specials["<s>"],
        "eos_token_id": specials["</s>"],
        "pad_token_id": specials["<pad>"],
    }
    torch.manual_seed(seed)
    config = hf_llama_config(vocab_size=vocab, **TEXT_MODEL, **ids, initializer_range=0.3)
    model = LlamaForCausalLM(config)
    model.eval()
    model.save_pretrained(directory)
    return model


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("textmodel")
    hf = make_model_dir(d)
    model, tokenizer = lk.load(d)
    return {
        "dir": d,
        "hf": hf,
        "hf_tok": AutoTokenizer.from_pretrained(str(d)),
        "model": model,
        "tok": tokenizer,
    }


def hf_generate(peer: dict[str, Any], ids: list[int], n: int, **kw: Any) -> list[int]:
    """transformers' greedy new tokens for one prompt."""
    kw.setdefault("eos_token_id", peer["tok"].eos_token_ids)
    with torch.no_grad():
        out = peer["hf"].generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=peer["tok"].pad_token_id,
            **kw,
        )
    return out[0, len(ids) :].tolist()


# ------------------------------------------------------------------------------------------
# tokenizer and chat template against transformers
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_as_transformers(peer: dict[str, Any], text: str) -> None:
    tok, hf_tok = peer["tok"], peer["hf_tok"]
    ids = tok.encode(text)
    assert ids == hf_tok.encode(text)
    assert ids[0] == tok.bos_token_id  # the post-processor's BOS
    assert tok.encode(text, add_special_tokens=False) == hf_tok.encode(
        text, add_special_tokens=False
    )
    for skip in (False, True):
        assert tok.decode(ids, skip_special_tokens=skip) == hf_tok.decode(
            ids, skip_special_tokens=skip
        )
    # non-ASCII round-trips (byte-level BPE)
    assert (
        tok.decode(ids, skip_special_tokens=True)
        == text.replace("<|user|>", "").replace("</s>", "")
        or "<|" in text
    )


def test_special_tokens_and_generation_config(peer: dict[str, Any]) -> None:
    tok, hf_tok = peer["tok"], peer["hf_tok"]
    assert tok.bos_token_id == hf_tok.bos_token_id
    assert tok.pad_token_id == hf_tok.pad_token_id
    assert tok.eos_token_id == hf_tok.eos_token_id
    gen = json.loads((peer["dir"] / "generation_config.json").read_text())
    assert tok.generation_config == gen
    assert set(tok.eos_token_ids) >= {hf_tok.eos_token_id}
    assert tok.vocab_size == len(hf_tok)


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "  Café? 日本語 🎉 "},
        {"role": "assistant", "content": "Oui."},
        {"role": "user", "content": "Encore"},
    ],
    [{"role": "user", "content": ["a list", {"k": 'é <tag> & "q"'}]}],  # tojson, no escaping
]


@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("gen_prompt", [True, False])
def test_chat_template_as_transformers(peer: dict[str, Any], conv: int, gen_prompt: bool) -> None:
    tok, hf_tok = peer["tok"], peer["hf_tok"]
    messages = CONVERSATIONS[conv]
    text = tok.apply_chat_template(messages, add_generation_prompt=gen_prompt, tokenize=False)
    expected = hf_tok.apply_chat_template(
        messages, add_generation_prompt=gen_prompt, tokenize=False
    )
    assert text == expected
    ids = tok.apply_chat_template(messages, add_generation_prompt=gen_prompt)
    hf_ids = hf_tok.apply_chat_template(
        messages, add_generation_prompt=gen_prompt, tokenize=True, return_dict=False
    )
    assert ids == list(hf_ids)
    assert ids.count(tok.bos_token_id) == 1  # the template's BOS only, none added on top


def test_chat_template_raise_exception_and_sandbox(peer: dict[str, Any]) -> None:
    import jinja2

    tok = peer["tok"]
    with pytest.raises(jinja2.exceptions.TemplateError, match="unknown role tool"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])
    hostile = lk.Tokenizer(
        tok._tok, {**tok.config, "chat_template": "{{ ''.__class__.__mro__ }}"}, {}
    )
    with pytest.raises(jinja2.exceptions.SecurityError):
        hostile.apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match=r"^\[apply_chat_template\] messages is empty"):
        tok.apply_chat_template([])


def test_chat_template_jinja_file_wins(tmp_path: Path, peer: dict[str, Any]) -> None:
    d = tmp_path / "m"
    shutil.copytree(peer["dir"], d)
    (d / "chat_template.jinja").write_text(
        "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    )
    tok = lk.Tokenizer.from_pretrained(d)
    hf_tok = AutoTokenizer.from_pretrained(str(d))
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == "[hi]"
    assert hf_tok.apply_chat_template(msgs, tokenize=False) == "[hi]"


# ------------------------------------------------------------------------------------------
# generation against transformers
# ------------------------------------------------------------------------------------------

PROMPTS: list[Any] = [
    "The Math: RMSNorm",
    "Café 日本語",
    [{"role": "user", "content": "Tell me about RoPE."}],
]


@pytest.mark.parametrize("which", range(len(PROMPTS)))
def test_greedy_text_equals_transformers(peer: dict[str, Any], which: int) -> None:
    model, tok, hf_tok = peer["model"], peer["tok"], peer["hf_tok"]
    prompt = PROMPTS[which]
    ids = (
        tok.encode(prompt)
        if isinstance(prompt, str)
        else tok.apply_chat_template(prompt, add_generation_prompt=True)
    )
    new = hf_generate(peer, ids, 40)
    eos = set(tok.eos_token_ids)
    stopped = bool(new) and new[-1] in eos
    expected = hf_tok.decode(new, skip_special_tokens=True)
    text = lk.generate(model, tok, prompt, max_tokens=40)
    assert text == expected
    pieces = list(lk.stream_generate(model, tok, prompt, max_tokens=40))
    assert "".join(p.text for p in pieces) == text
    last = pieces[-1]
    assert last.generation_tokens == len(new)
    assert last.finish_reason == ("stop" if stopped else "length")
    assert last.prompt_tokens == len(ids)
    assert [p.token for p in pieces] == new
    assert last.prompt_tps > 0 and last.peak_memory > 0


def test_repetition_penalty_greedy_equals_transformers(peer: dict[str, Any]) -> None:
    model, tok, hf_tok = peer["model"], peer["tok"], peer["hf_tok"]
    ids = tok.encode("The Math: RMSNorm")
    new = hf_generate(peer, ids, 30, repetition_penalty=1.8)
    assert new != hf_generate(peer, ids, 30)  # the penalty matters for this prompt
    text = lk.generate(model, tok, "The Math: RMSNorm", 30, repetition_penalty=1.8)
    assert text == hf_tok.decode(new, skip_special_tokens=True)


def test_eos_stops_where_transformers_stops(tmp_path: Path, peer: dict[str, Any]) -> None:
    """An ordinary token made an EOS id (generation_config.json's list): both stop on it."""
    tok, hf_tok = peer["tok"], peer["hf_tok"]
    ids = tok.encode("The Math: RMSNorm")
    free = hf_generate(peer, ids, 30)
    k = 7
    stop_id = free[k]
    assert stop_id not in free[:k] or free.index(stop_id) < k
    d = tmp_path / "eos"
    shutil.copytree(peer["dir"], d)
    gen = json.loads((d / "generation_config.json").read_text())
    gen["eos_token_id"] = [tok.eos_token_id, stop_id]
    (d / "generation_config.json").write_text(json.dumps(gen))
    model, tok2 = lk.load(d)
    assert stop_id in tok2.eos_token_ids
    new = hf_generate(peer, ids, 30, eos_token_id=[tok.eos_token_id, stop_id])
    assert new[-1] == stop_id and len(new) == free.index(stop_id) + 1
    pieces = list(lk.stream_generate(model, tok2, "The Math: RMSNorm", 30))
    assert pieces[-1].generation_tokens == len(new) and pieces[-1].finish_reason == "stop"
    assert pieces[-1].token == stop_id
    # the EOS token's own text is not part of the output
    text = lk.generate(model, tok2, "The Math: RMSNorm", 30)
    assert (
        text == "".join(p.text for p in pieces) == hf_tok.decode(new[:-1], skip_special_tokens=True)
    )


@pytest.mark.parametrize("offset, length", [(5, 3), (12, 1), (20, 4)])
def test_stop_strings_stop_where_transformers_stops(
    peer: dict[str, Any], offset: int, length: int
) -> None:
    model, tok, hf_tok = peer["model"], peer["tok"], peer["hf_tok"]
    prompt = "The Math: RMSNorm"
    ids = tok.encode(prompt)
    free_text = hf_tok.decode(hf_generate(peer, ids, 40), skip_special_tokens=True)
    # a stop string taken from the free text (no replacement character, not blank)
    stop = next(
        c
        for i in range(offset, len(free_text) - length)
        if "\ufffd" not in (c := free_text[i : i + length]) and c.strip()
    )
    cut = free_text.index(stop)
    new = hf_generate(peer, ids, 40, stop_strings=[stop], tokenizer=hf_tok)
    hf_text = hf_tok.decode(new, skip_special_tokens=True)
    assert stop in hf_text and hf_text.index(stop) == cut  # transformers keeps the stop string
    pieces = list(lk.stream_generate(model, tok, prompt, 40, stop=[stop, "\x00never"]))
    text = "".join(p.text for p in pieces)
    assert text == free_text[:cut]  # cut before the stop string
    assert pieces[-1].generation_tokens == len(new)  # stopped on the same token
    assert pieces[-1].finish_reason == "stop"
    assert lk.generate(model, tok, prompt, 40, stop=stop) == text
    # no streamed piece ever showed part of the stop string
    assert all(stop not in p.text for p in pieces)


def test_sampling_is_reproducible_with_a_seed(peer: dict[str, Any]) -> None:
    model, tok = peer["model"], peer["tok"]
    kw: dict[str, Any] = {"temperature": 1.0, "top_k": 40, "top_p": 0.95, "min_p": 0.02}
    a = lk.generate(model, tok, "The Math", 30, seed=7, **kw)
    b = lk.generate(model, tok, "The Math", 30, seed=7, **kw)
    c = lk.generate(model, tok, "The Math", 30, seed=8, **kw)
    assert a == b and a != c
    streamed = "".join(p.text for p in lk.stream_generate(model, tok, "The Math", 30, seed=7, **kw))
    assert streamed == a
    assert a != lk.generate(model, tok, "The Math", 30)  # not greedy


def test_sampler_filters_match_transformers_warpers() -> None:
    """Every drawn token is one transformers' warpers (temperature, top-k, top-p, min-p) keep,
    and the greedy repetition penalty is HF's processor."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 200)).astype(np.float32) * 3
    scores = torch.tensor(logits)
    for proc in (
        TemperatureLogitsWarper(0.7),
        TopKLogitsWarper(30),
        TopPLogitsWarper(0.8),
        MinPLogitsWarper(0.1),
    ):
        scores = proc(None, scores)
    allowed = torch.isfinite(scores).numpy()
    gen = np.random.default_rng(1)
    drawn = np.stack([sample(logits, 0.7, 30, 0.8, gen, min_p=0.1) for _ in range(300)], axis=1)
    for row in range(3):
        assert set(drawn[row]) <= set(np.flatnonzero(allowed[row]))
        assert len(set(drawn[row])) > 1

    seen = np.zeros((3, 200), bool)
    history = rng.integers(0, 200, (3, 12))
    np.put_along_axis(seen, history, True, axis=1)
    penalised = RepetitionPenaltyLogitsProcessor(1.5)(torch.tensor(history), torch.tensor(logits))
    got = sample(logits, 0.0, None, None, gen, repetition_penalty=1.5, seen=seen)
    np.testing.assert_array_equal(got, penalised.argmax(-1).numpy())


def test_generation_config_sampling_defaults(tmp_path: Path, peer: dict[str, Any]) -> None:
    d = tmp_path / "sampled"
    shutil.copytree(peer["dir"], d)
    gen = json.loads((d / "generation_config.json").read_text())
    gen.update(do_sample=True, temperature=0.9, top_k=20, top_p=0.9)
    (d / "generation_config.json").write_text(json.dumps(gen))
    model, tok = lk.load(d)
    sampled = lk.generate(model, tok, "The Math", 20, seed=3)
    assert sampled == lk.generate(
        model, tok, "The Math", 20, seed=3, temperature=0.9, top_k=20, top_p=0.9
    )
    assert lk.generate(model, tok, "The Math", 20, temperature=0) == lk.generate(
        peer["model"], peer["tok"], "The Math", 20
    )


def test_generation_config_nulls_and_bad_values(tmp_path: Path, peer: dict[str, Any]) -> None:
    """null (or absent) sampling values take transformers' defaults (temperature 1, top_k 50);
    a value of the wrong type is an error naming the file and the key."""
    d = tmp_path / "nulls"
    shutil.copytree(peer["dir"], d)
    gen = json.loads((d / "generation_config.json").read_text())
    gen.update(do_sample=True, temperature=None, top_k=None)
    (d / "generation_config.json").write_text(json.dumps(gen))
    model, tok = lk.load(d)
    sampled = lk.generate(model, tok, "The Math", 20, seed=3)
    assert sampled == lk.generate(model, tok, "The Math", 20, seed=3, temperature=1.0, top_k=50)
    gen.update(temperature="hot")
    (d / "generation_config.json").write_text(json.dumps(gen))
    model, tok = lk.load(d)
    with pytest.raises(ValueError, match=r"\[generation_config.json\] temperature must be a"):
        lk.generate(model, tok, "The Math", 3)
    # the argument given overrides the file's value, which is then not used
    assert lk.generate(model, tok, "The Math", 3, temperature=0) == lk.generate(
        peer["model"], peer["tok"], "The Math", 3
    )


# ------------------------------------------------------------------------------------------
# incremental detokenization
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS[2:5])
def test_streamed_pieces_never_split_a_character(peer: dict[str, Any], text: str) -> None:
    tok = peer["tok"]
    ids = tok.encode(text, add_special_tokens=False)
    # the test means something: some token holds part of a multi-byte character
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    detok = Detokenizer(tok)
    pieces = [detok.add(i) for i in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_stop_text_holds_back_a_possible_stop() -> None:
    st = StopText(["STOP", "xy"])
    assert st.add("abc ST") == ("abc ", False)
    assert st.add("O") == ("", False)
    assert st.add("P and more") == ("", True)
    assert st.text == "abc "
    st = StopText(["STOP"])
    assert st.add("abc ST") == ("abc ", False)
    assert st.add("ART") == ("START", False)
    assert st.rest() == ""


# ------------------------------------------------------------------------------------------
# batches and tokenizer outputs
# ------------------------------------------------------------------------------------------


def test_batched_prompts_equal_single_ones(peer: dict[str, Any]) -> None:
    model, tok = peer["model"], peer["tok"]
    prompts: list[Any] = ["The Math: RMSNorm", "Café", "日本語のテキスト and more words here"]
    batch = lk.generate(model, tok, prompts, max_tokens=25)
    assert batch == [lk.generate(model, tok, p, max_tokens=25) for p in prompts]
    convs = [CONVERSATIONS[0], CONVERSATIONS[1]]
    assert lk.generate(model, tok, convs, max_tokens=10) == [
        lk.generate(model, tok, c, max_tokens=10) for c in convs
    ]
    stops = lk.generate(model, tok, prompts, max_tokens=25, stop=["e"])
    assert stops == [lk.generate(model, tok, p, max_tokens=25, stop="e") for p in prompts]


def test_model_accepts_tokenizer_output(peer: dict[str, Any]) -> None:
    model, hf_tok = peer["model"], peer["hf_tok"]
    enc = hf_tok("The Math: RMSNorm", return_tensors="np")
    ids = enc["input_ids"]
    np.testing.assert_array_equal(model(enc), model(ids))
    np.testing.assert_array_equal(
        model(hf_tok("The Math", return_tensors="pt")),
        model(hf_tok("The Math", return_tensors="np")["input_ids"]),
    )
    np.testing.assert_array_equal(model.generate(enc, 5, progress=False), model.generate(ids, 5))
    plain = hf_tok("The Math")  # lists, no batch axis
    np.testing.assert_array_equal(
        model.generate(plain, 5, progress=False), model.generate(plain["input_ids"], 5)
    )
    # a right-padded batch (transformers' default padding side) generates as the singles
    texts = ["The Math: RMSNorm simplifies", "Café"]
    batch = hf_tok(texts, return_tensors="np", padding=True)
    assert batch["attention_mask"][1, -1] == 0
    out = model.generate(batch, 6, progress=False)
    for i, t in enumerate(texts):
        single = model.generate(hf_tok(t, return_tensors="np"), 6, progress=False)
        np.testing.assert_array_equal(out[i, -6:], single[0, -6:])
    with pytest.raises(ValueError, match=r"^\[Transformer\] a mapping given as ids"):
        model({"ids": ids})
    with pytest.raises(ValueError, match=r"^\[generate\] ids must be a rectangular"):
        model.generate(hf_tok(texts)["input_ids"], 3)


# ------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------


def test_text_api_errors(tmp_path: Path, peer: dict[str, Any]) -> None:
    model, tok = peer["model"], peer["tok"]
    with pytest.raises(ValueError, match=r"^\[generate\] prompt is empty"):
        lk.generate(model, tok, [])
    with pytest.raises(ValueError, match=r"^\[stream_generate\] max_tokens"):
        lk.stream_generate(model, tok, "x", float("nan"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^\[generate\] temperature"):
        lk.generate(model, tok, "x", 3, temperature=float("nan"))
    with pytest.raises(ValueError, match=r"^\[generate\] top_k"):
        lk.generate(model, tok, "x", 3, top_k=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^\[generate\] max_tokens = 1000000000 is too large"):
        lk.generate(model, tok, "x", 10**9)
    with pytest.raises(TypeError, match=r"^\[generate\] stop"):
        lk.generate(model, tok, "x", 3, stop=[""])
    with pytest.raises(TypeError, match=r"^\[generate\] prompt must be"):
        lk.generate(model, tok, 3.0)
    with pytest.raises(ValueError, match=r"^\[load\] dtype must be None, 'float32'.*'int3'"):
        lk.load(peer["dir"], dtype="int3")
    with pytest.raises(ValueError, match=r"hub id.*huggingface-cli download meta-llama/Llama"):
        lk.load("meta-llama/Llama-3.2-1B")
    d = tmp_path / "notok"
    shutil.copytree(peer["dir"], d)
    (d / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=r"^\[load\] .*no tokenizer.json"):
        lk.load(d)
    (d / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"^\[load\] .*tokenizer.json: not a valid"):
        lk.load(d)


def test_out_of_range_prompt_ids_name_the_function(peer: dict[str, Any]) -> None:
    """A list of token ids with one past the vocabulary: the error named [Transformer] (the
    model's forward), not the function called."""
    model, tok = peer["model"], peer["tok"]
    vocab = model.config.vocab_size
    for fn, call in (
        ("generate", lambda ids: lk.generate(model, tok, ids, 3)),
        ("stream_generate", lambda ids: list(lk.stream_generate(model, tok, ids, 3))),
    ):
        for ids in ([1, 2, vocab], np.array([1, -1, 2])):
            match = rf"^\[{fn}\] prompt token ids must be in \[0, vocab_size={vocab}\), got "
            with pytest.raises(ValueError, match=match + r"-?\d+$"):
                call(ids)


def test_prompt_length_limit_and_warning(peer: dict[str, Any]) -> None:
    """Prompts past max_position_embeddings (512 here) ran silently: a UserWarning now, as in
    transformers; max_prompt_tokens (default 2**20) refuses longer ones by name."""
    from llmkernels.text import MAX_PROMPT_TOKENS

    model, tok = peer["model"], peer["tok"]
    assert MAX_PROMPT_TOKENS == 1 << 20
    long = [5] * 520
    with pytest.warns(UserWarning, match=r"^\[generate\] the prompt's sequence length \(520 "
                                         r"tokens\) exceeds the maximum sequence length of this "
                                         r"model \(max_position_embeddings = 512\)"):  # fmt: skip
        lk.generate(model, tok, long, 1)
    with pytest.warns(UserWarning, match=r"^\[stream_generate\] the prompt's sequence length"):
        lk.stream_generate(model, tok, long, 1)
    with pytest.warns(UserWarning, match=r"^\[generate\] the prompt's sequence length"):
        lk.generate(model, tok, ["a" * 600, "b"], 1)  # a batch: each prompt
    lk.generate(model, tok, [5] * 512, 1)  # up to the maximum: no warning
    for fn, call in (
        ("generate", lambda **kw: lk.generate(model, tok, [5] * 10, 1, **kw)),
        ("stream_generate", lambda **kw: lk.stream_generate(model, tok, [5] * 10, 1, **kw)),
        ("chat", lambda **kw: list(lk.ChatSession(model, tok).send("hello", 1, **kw))),
    ):
        with pytest.raises(ValueError, match=rf"^\[{fn}\] the prompt has \d+ tokens, over "
                                             r"max_prompt_tokens = 9"):  # fmt: skip
            call(max_prompt_tokens=9)
        for bad in (0, 2.5, True, None):
            with pytest.raises(ValueError, match=rf"^\[{fn}\] max_prompt_tokens must be a "
                                                 r"positive integer"):  # fmt: skip
                call(max_prompt_tokens=bad)
    assert lk.generate(model, tok, [5] * 10, 1, max_prompt_tokens=10) == lk.generate(
        model, tok, [5] * 10, 1
    )


def test_template_globals_as_transformers(tmp_path: Path, peer: dict[str, Any]) -> None:
    """namespace, dict, loop controls, strftime_now and tojson as transformers provides them;
    namespace refuses underscore attributes in both."""
    import jinja2

    template = (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 2 %}{% break %}"
        "{% endif %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }} {{ dict(a='é<') | tojson }}"
        " {{ strftime_now('%Y') | length }} {{ eos_token }}"
    )
    d = tmp_path / "m"
    shutil.copytree(peer["dir"], d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok, hf_tok = lk.Tokenizer.from_pretrained(d), AutoTokenizer.from_pretrained(str(d))
    msgs = [{"role": "user", "content": "x"}] * 3
    assert tok.apply_chat_template(msgs, tokenize=False) == hf_tok.apply_chat_template(
        msgs, tokenize=False
    )
    bad = lk.Tokenizer(tok._tok, {**tok.config, "chat_template": "{% set ns = namespace(_x=1) %}"})
    with pytest.raises(jinja2.exceptions.SecurityError):
        bad.apply_chat_template(msgs)


def test_chat_session_prefills_only_the_new_turn(peer: dict[str, Any]) -> None:
    """Turn 2 prefills only the template's text after the cached reply (the cache keeps the
    reply's tokens as they were generated, not a re-encoding of its text), and its greedy
    reply equals transformers' greedy continuation of exactly the tokens the model saw."""
    model, tok = peer["model"], peer["tok"]
    chat = lk.ChatSession(model, tok)
    list(chat.send("Hello there", max_tokens=6))
    held = chat._cached + chat._unfed  # turn 1: prompt + reply tokens
    cached_before = len(chat._cached)
    reply = "".join(r.text for r in chat.send("And then what?", max_tokens=12))
    prompt = chat._cached[: cached_before + chat.prefilled]  # the ids turn 2 was given
    assert prompt[: len(held)] == held
    full = tok.apply_chat_template(chat.messages[:-1])
    assert chat.prefilled < len(full) / 2
    # the prompt's text is the conversation's rendering (reply tokens decode to the reply)
    rendered = tok.apply_chat_template(chat.messages[:-1], tokenize=False)
    assert tok.decode(prompt) == rendered
    ours = chat._cached[len(prompt) :] + chat._unfed
    theirs = hf_generate(peer, prompt, 12)
    assert theirs[: len(ours)] == ours
    assert len(theirs) == len(ours) or theirs[len(ours)] in tok.eos_token_ids
    assert tok.decode(ours) == reply


def test_chat_turn_that_fails_leaves_the_conversation(peer: dict[str, Any]) -> None:
    """A turn that raises before any reply (max_tokens past the model's length) leaves no
    phantom user or assistant turn: the retry sends the message once."""
    model, tok = peer["model"], peer["tok"]
    chat = lk.ChatSession(model, tok)
    list(chat.send("Hi", max_tokens=4))
    before = [dict(m) for m in chat.messages]
    with pytest.raises(ValueError, match=r"\[chat\] max_tokens"):
        list(chat.send("Again", max_tokens=10**9))
    assert chat.messages == before
    # (the retry prefills the whole conversation again: the failed turn dropped the cached
    # continuation, so its tokens are the rendering's, not the first reply's as generated)
    retry = "".join(r.text for r in chat.send("Again", max_tokens=4))
    assert [m["role"] for m in chat.messages] == ["user", "assistant"] * 2
    assert [m["content"] for m in chat.messages][::2] == ["Hi", "Again"]
    assert chat.messages[-1]["content"] == retry


def test_a_tiny_temperature_is_greedy(peer: dict[str, Any]) -> None:
    """temperature 1e-310 (accepted: > 0) must not overflow logits / t into NaN
    probabilities: it samples the argmax, as greedy decoding does."""
    model, tok = peer["model"], peer["tok"]
    greedy = lk.generate(model, tok, "The Math", 8)
    for t in (1e-300, 1e-310):
        assert lk.generate(model, tok, "The Math", 8, temperature=t, seed=1) == greedy


# ------------------------------------------------------------------------------------------
# edges found by an adversarial pass (session 12)
# ------------------------------------------------------------------------------------------


def _wordlevel(directory: Path) -> Path:
    """A WordLevel tokenizer (not BPE) asking for clean_up_tokenization_spaces, as BERT-likes
    do: transformers cleans its decoded text (" ." -> ".", " n't" -> "n't", ...)."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    words = ["[UNK]", "Hello", ".", "World", "I", "do", "n't", "know", ",", "ok", "?", "'s", "x"]
    tok = RustTokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"}
    config["clean_up_tokenization_spaces"] = True
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize("text", ["Hello . World", "I do n't know , ok ?", "x 's x .", "x . ."])
def test_cleaned_up_text_streams_whole(tmp_path: Path, text: str) -> None:
    """With clean_up_tokenization_spaces (a non-BPE tokenizer), the pieces streamed concatenate
    to the decoded text, which is transformers' (the clean-up removes a space when the text
    after it arrives: it dropped characters)."""
    d = _wordlevel(tmp_path / "wl")
    tok = lk.Tokenizer.from_pretrained(d)
    hf = AutoTokenizer.from_pretrained(str(d))
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == hf.decode(ids)
    detok = Detokenizer(tok)
    streamed = "".join(detok.add(i) for i in ids) + detok.flush()
    assert streamed == tok.decode(ids, skip_special_tokens=True)


def test_bpe_ignores_clean_up_as_transformers(tmp_path: Path, peer: dict[str, Any]) -> None:
    d = tmp_path / "bpe_clean"
    shutil.copytree(peer["dir"], d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["clean_up_tokenization_spaces"] = True
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = lk.Tokenizer.from_pretrained(d)
    hf = AutoTokenizer.from_pretrained(str(d))
    ids = tok.encode("a . b , c n't", add_special_tokens=False)
    assert tok.decode(ids) == hf.decode(ids) == "a . b , c n't"


def test_chat_template_with_tools_and_documents(peer: dict[str, Any]) -> None:
    template = (
        "{% if tools %}TOOLS={{ tools | tojson }}\n{% endif %}"
        "{% if documents %}DOCS={{ documents | length }}\n{% endif %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    tok = lk.Tokenizer(peer["tok"]._tok, {"chat_template": template})
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    msgs = [{"role": "user", "content": "hi"}]
    got = tok.apply_chat_template(msgs, tools=tools, documents=[{"text": "d"}], tokenize=False)
    assert got == 'TOOLS=[{"type": "function", "function": {"name": "f", "parameters": {}}}]\n' + (
        "DOCS=1\nhi"
    )
    named = [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]
    tok = lk.Tokenizer(peer["tok"]._tok, {"chat_template": named})
    assert tok.apply_chat_template(msgs, tokenize=False) == "D"
    assert tok.apply_chat_template(msgs, tools=tools, tokenize=False) == "T"


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (123, "chat_template must be a string"),
        ([{"name": "tool_use", "template": "T"}], "no 'default' one"),
    ],
)
def test_malformed_chat_template_is_refused(peer: dict[str, Any], value: Any, match: str) -> None:
    with pytest.raises(TokenizerError, match=match):
        lk.Tokenizer(peer["tok"]._tok, {"chat_template": value})


def test_stop_string_naming_a_special_token(peer: dict[str, Any]) -> None:
    """A stop string that is a special token's text (decoding skips it, so the text never
    shows it) stops on that token, as transformers' stop_strings does."""
    model, tok = peer["model"], peer["tok"]
    end = tok._tok.token_to_id("<|end|>")
    a = tok.encode("a", add_special_tokens=False)[0]
    assert end is not None and end not in tok.eos_token_ids
    assert tok.stop_token_ids(["<|end|>", "plain text"]) == {end}

    class Scripted(lk.Transformer):  # the model, emitting 'a', 'a', <|end|>, 'a', ...
        calls = 0

        def __call__(self, ids: Any, **kw: Any) -> np.ndarray:  # type: ignore[override]
            b = np.asarray(ids).shape[0]
            logits = np.zeros((b, 1, self.config.vocab_size), np.float32)
            logits[:, 0, end if self.calls == 2 else a] = 1.0
            self.calls += 1
            return logits

    def scripted() -> Scripted:
        m = copy.copy(model)
        m.__class__ = Scripted
        return m

    out = list(lk.stream_generate(scripted(), tok, "x", 8, stop=["<|end|>"]))
    assert [r.token for r in out] == [a, a, end] and out[-1].finish_reason == "stop"
    assert "".join(r.text for r in out) == "aa"
    assert lk.generate(scripted(), tok, ["x", "x"], 8, stop=["<|end|>"]) == ["aa", "aa"]
    assert lk.generate(scripted(), tok, "x", 5) == "aaaa"  # no stop: <|end|> is skipped text


def test_special_tokens_map_wins_and_bad_values_are_refused(peer: dict[str, Any]) -> None:
    d = peer["dir"]
    tok = lk.Tokenizer.from_pretrained(d)
    hf = AutoTokenizer.from_pretrained(str(d))
    assert (tok.bos_token_id, tok.eos_token_id) == (hf.bos_token_id, hf.eos_token_id)


@pytest.mark.parametrize("value", [5, ["</s>"], {"text": "<s>"}])
def test_malformed_special_token_is_refused(peer: dict[str, Any], value: Any) -> None:
    with pytest.raises(TokenizerError, match=r"bos_token must be a string or an AddedToken"):
        lk.Tokenizer(peer["tok"]._tok, {"bos_token": value})


def test_generation_config_do_sample_must_be_a_bool(tmp_path: Path, peer: dict[str, Any]) -> None:
    d = tmp_path / "do_sample"
    shutil.copytree(peer["dir"], d)
    gen = json.loads((d / "generation_config.json").read_text())
    gen["do_sample"] = "false"
    (d / "generation_config.json").write_text(json.dumps(gen))
    model, tok = lk.load(d)
    with pytest.raises(ValueError, match=r"do_sample must be true or false, got 'false'"):
        lk.generate(model, tok, "The Math", 3)


def test_decode_ids(peer: dict[str, Any]) -> None:
    tok = peer["tok"]
    ids = tok.encode("Hello world", add_special_tokens=False)
    assert tok.decode([np.int64(i) for i in ids]) == tok.decode(np.array(ids)) == "Hello world"
    for bad in ([-1], [1.5], [2**64], [True]):
        with pytest.raises(ValueError, match=r"\[decode\] ids must be non-negative ints"):
            tok.decode(bad)
