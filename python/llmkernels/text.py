"""Text in, text out: :func:`load`, :func:`generate`, :func:`stream_generate`, :class:`ChatSession`.

::

    model, tokenizer = lk.load("path/to/model")          # config.json, *.safetensors, tokenizer
    print(lk.generate(model, tokenizer, "Once upon a time", max_tokens=50))
    for piece in lk.stream_generate(model, tokenizer, [{"role": "user", "content": "Hi"}]):
        print(piece.text, end="", flush=True)

The prompt is a string (tokenized with the tokenizer's BOS handling), a conversation (a list of
``{"role", "content"}`` dicts, rendered with the chat template and a generation prompt), or a
list of token ids. A list of strings or conversations generates as one left-padded batch
(:func:`generate` only). Generation stops at ``max_tokens``, at any EOS id
(``tokenizer.eos_token_ids``: the tokenizer's and ``generation_config.json``'s) or when the
text contains a ``stop`` string: the token that completes it is the last one generated (as
transformers' ``stop_strings``) and the text is cut before the stop string (as mlx-lm).

Sampling parameters left to ``None`` come from ``generation_config.json`` as transformers
reads it (``do_sample`` false or absent: greedy; else its ``temperature``, ``top_k`` (50 by
default), ``top_p``, ``min_p``, ``repetition_penalty``); the one sampler is
:meth:`llmkernels.Transformer.generate`'s.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import resource
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._detokenize import Detokenizer, StopText, late_text
from ._tiny_model import write_tiny_model
from .nn import Transformer
from .nn.checkpoint import check_load_dtype, checkpoint_dir
from .nn.generation import check_cache_size, check_max_tokens, generate_step
from .nn.module import check_kv_dtype
from .nn.sampling import Sampling
from .tokenizer import Tokenizer

__all__ = [
    "ChatSession",
    "GenerationResponse",
    "example_model",
    "generate",
    "load",
    "stream_generate",
    "write_tiny_model",
]

#: The default limit on a prompt's length in tokens (``max_prompt_tokens`` of :func:`generate`,
#: :func:`stream_generate` and :meth:`ChatSession.send`, ``--max-prompt-tokens`` of the CLI): a
#: longer prompt is refused before any work. A prompt over the model's
#: ``max_position_embeddings`` (but within the limit) runs, with a warning, as in transformers.
MAX_PROMPT_TOKENS = 1 << 20


def load(
    path: str | os.PathLike[str], dtype: Any = None, *, progress: bool | None = None
) -> tuple[Transformer, Tokenizer]:
    """``model, tokenizer = load(path)``: an HF model directory (``config.json``,
    ``*.safetensors``, ``tokenizer.json`` and the optional ``tokenizer_config.json``,
    ``generation_config.json``, ``chat_template.jinja``).

    ``dtype``: ``None`` keeps the checkpoint's precision (a bf16 checkpoint stays bf16 in
    memory); ``"float32"``, ``"bfloat16"`` or ``"float16"`` converts while loading. A hub id (``"meta-llama/Llama-3.2-1B"``) is not downloaded: the error says
    how to fetch it. ``progress``: a bar while loading (default: large checkpoints on a
    terminal).

    Examples:
        >>> import llmkernels as lk
        >>> lk.load("no-such-org/no-such-model")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: [from_pretrained] 'no-such-org/no-such-model' is not a directory; it looks like a Hugging Face hub id. ...
    """  # noqa: E501
    check_load_dtype("load", dtype)
    directory = checkpoint_dir(path)
    tokenizer = Tokenizer.from_pretrained(directory)  # cheap: fail before the weights
    model = Transformer.from_pretrained(directory, dtype=dtype, progress=progress)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(
            f"[load] {directory}: the tokenizer has {tokenizer.vocab_size} tokens, the model's "
            f"vocabulary only {model.config.vocab_size}"
        )
    return model, tokenizer


def example_model() -> str:
    """The directory of the small trained model that ships with llmkernels, for
    :func:`load`: a 4.6-million-parameter LLaMA (dim 256, 6 layers, 8 query / 4 key-value
    heads, vocabulary 4096, bfloat16) trained on the prose of the Python documentation, with
    its byte-level BPE tokenizer and a chat template. It writes English about Python; it is not
    an assistant. Its card (``README.md`` in the directory) says how it was trained and under
    which licence.

    Examples:
        >>> import llmkernels as lk
        >>> model, tokenizer = lk.load(lk.example_model())
        >>> model.config.n_layers, tokenizer.vocab_size
        (6, 4096)
        >>> text = lk.generate(model, tokenizer, "The list type", max_tokens=8, temperature=0)
        >>> isinstance(text, str)
        True
    """
    return str(Path(__file__).resolve().parent / "_example_model")


@dataclasses.dataclass
class GenerationResponse:
    """One streamed piece (as mlx-lm's ``GenerationResponse``).

    Attributes:
        text: the new text (may be ``""`` while a character or a possible stop string is
            incomplete; the pieces concatenate to the whole generated text).
        token: the token just generated (``None`` for a final flush).
        prompt_tokens, prompt_tps: prompt length and prefill speed (tokens/s).
        generation_tokens, generation_tps: tokens generated so far and the decode speed
            (tokens/s after the first token).
        peak_memory: the process's peak resident memory so far, in GB.
        finish_reason: ``None`` while generating, then ``"stop"`` (EOS or stop string) or
            ``"length"`` (``max_tokens``).

    Examples:
        >>> import tempfile, llmkernels as lk
        >>> from llmkernels.text import write_tiny_model
        >>> model, tok = lk.load(write_tiny_model(tempfile.mkdtemp()))
        >>> r = list(lk.stream_generate(model, tok, "Hi", max_tokens=3))[-1]
        >>> r.prompt_tokens, r.generation_tokens, r.finish_reason  # "<s>Hi": 3 tokens
        (3, 3, 'length')
    """

    text: str
    token: int | None
    prompt_tokens: int
    prompt_tps: float
    generation_tokens: int
    generation_tps: float
    peak_memory: float
    finish_reason: str | None = None


def _peak_memory_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux


def _is_messages(x: Any) -> bool:
    return (
        isinstance(x, Sequence)
        and not isinstance(x, str)
        and len(x) > 0
        and all(isinstance(m, Mapping) for m in x)
    )


def _prompt_ids(fn: str, tokenizer: Tokenizer, prompt: Any) -> list[int]:
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
    elif _is_messages(prompt):
        ids = list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True))
    elif isinstance(prompt, np.ndarray) and prompt.ndim == 1 and prompt.dtype.kind in "iu":
        ids = [int(i) for i in prompt]
    elif (
        isinstance(prompt, Sequence)
        and not isinstance(prompt, str)
        and all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in prompt)
    ):
        ids = [int(i) for i in prompt]
    else:
        raise TypeError(
            f"[{fn}] prompt must be a str, a list of messages (dicts with 'role' and 'content') "
            f"or a list of token ids, got {type(prompt).__name__}"
        )
    if not ids:
        raise ValueError(
            f"[{fn}] prompt is empty: it has no tokens (the tokenizer adds no BOS to an empty "
            "string); give some text"
        )
    return ids


def _check_max_prompt_tokens(fn: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(
            f"[{fn}] max_prompt_tokens must be a positive integer, got {repr(value)[:40]}"
        )
    return int(value)


def _check_prompt(fn: str, model: Transformer, ids: list[int], limit: int) -> None:
    """A prompt's token ids against the model (errors name ``fn``, not the model): ids in
    ``[0, vocab_size)``, at most ``limit`` (``max_prompt_tokens``) of them; a prompt longer than
    ``max_position_embeddings`` gets transformers' warning."""
    cfg = model.config
    if len(ids) > limit:
        raise ValueError(
            f"[{fn}] the prompt has {len(ids)} tokens, over max_prompt_tokens = {limit} (raise "
            "max_prompt_tokens to run it)"
        )
    bad = [i for i in ids if not 0 <= i < cfg.vocab_size]
    if bad:
        raise ValueError(
            f"[{fn}] prompt token ids must be in [0, vocab_size={cfg.vocab_size}), got "
            f"{bad[0]}" + (f" and {len(bad) - 1} more" if len(bad) > 1 else "")
        )
    if len(ids) > cfg.max_seq_len:
        warnings.warn(
            f"[{fn}] the prompt's sequence length ({len(ids)} tokens) exceeds the maximum "
            f"sequence length of this model (max_position_embeddings = {cfg.max_seq_len}): "
            "positions past it were not trained, the output may be garbage",
            UserWarning,
            stacklevel=3,
        )


def sampling_params(fn: str, tokenizer: Tokenizer, **given: Any) -> Sampling:
    """The checked :class:`~llmkernels.nn.sampling.Sampling` of ``given`` (temperature, top_k,
    top_p, min_p, repetition_penalty, seed): those left to ``None`` from
    generation_config.json, as transformers reads it. Errors name ``fn``. (Shared by
    :func:`generate`, :class:`ChatSession` and the server.)"""
    gc = tokenizer.generation_config

    def value(key: str, default: Any) -> Any:  # null or absent: transformers' default
        v = gc.get(key)
        return default if v is None else v

    sample = gc.get("do_sample", False)
    if sample is None:
        sample = False
    if not isinstance(sample, bool):  # "false" would be truthy
        raise ValueError(
            f"[{fn}] [generation_config.json] do_sample must be true or false, got {sample!r:.40}"
        )
    top_k = value("top_k", 50) if sample else None
    defaults: dict[str, Any] = {
        "temperature": value("temperature", 1.0) if sample else 0.0,
        "top_k": None if top_k == 0 else top_k,  # 0: no top-k, as transformers
        "top_p": gc.get("top_p") if sample else None,
        "min_p": gc.get("min_p") if sample else None,
        "repetition_penalty": gc.get("repetition_penalty"),
        "seed": None,
    }
    # the file's values that are used are checked as arguments are, the file named
    used = {k: v for k, v in defaults.items() if given.get(k) is None}
    neutral = dict.fromkeys(defaults) | {"temperature": 0.0}
    Sampling.checked(f"{fn}] [generation_config.json", **(neutral | used))
    values = {k: (defaults.get(k) if v is None else v) for k, v in given.items()}
    return Sampling.checked(fn, **values)


def _stop_list(fn: str, stop: Any) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, Sequence) or not all(isinstance(s, str) and s for s in stop):
        raise TypeError(f"[{fn}] stop must be a non-empty str or a list of them")
    return list(stop)


def _check_model(fn: str, model: Any, tokenizer: Any) -> None:
    if not isinstance(model, Transformer):
        raise TypeError(f"[{fn}] model must be an llmkernels.Transformer (from lk.load)")
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"[{fn}] tokenizer must be an llmkernels Tokenizer (from lk.load)")


class TextGeneration:
    """One prompt's generation as text, token by token: the KV cache it runs on (``session``'s,
    reused where the prompt extends the tokens it holds, else a new one of ``kv_dtype``), its
    sampler, and the pieces of text each sampled token gives (stop strings, EOS, max_tokens).
    :func:`stream_pieces` drives it with :func:`~llmkernels.nn.generation.generate_step`; the
    server's engine with batched decode steps (``Transformer.decode``).

    Protocol: prefill ``todo`` into ``cache`` and call :meth:`prefilled`; then for each token
    sampled with ``sampler``, :meth:`add` gives its piece (``finished`` once it ended); feed an
    unfinished one to the model and call :meth:`fed`; :meth:`close` at the end."""

    def __init__(
        self,
        fn: str,
        model: Transformer,
        tokenizer: Tokenizer,
        ids: list[int],
        max_tokens: int,
        params: Sampling,
        stops: list[str],
        session: ChatSession | None = None,
        kv_dtype: str = "float32",
        ignore_eos: bool = False,
    ) -> None:
        # special tokens named by a stop string end the generation as an EOS does (decoding
        # skips them, so the text never shows the stop string); ignore_eos (a benchmark's
        # fixed reply length): only those
        eos = set() if ignore_eos else set(tokenizer.eos_token_ids)
        self.eos = eos | tokenizer.stop_token_ids(stops)
        self.sampler = params.sampler(1, model.config.vocab_size)
        self.sampler.see(np.asarray([ids]))
        self.t0 = time.perf_counter()
        self.session, self.max_tokens, self.prompt_tokens = session, max_tokens, len(ids)
        if session is not None:
            self.cache, self.todo = session._prepare(ids, max_tokens)
        else:
            check_cache_size(fn, "max_tokens", model.config, 1, len(ids), max_tokens)
            self.cache, self.todo = model.new_cache(1, len(ids) + max(max_tokens, 1), kv_dtype), ids
        self.detok, self.stop_text = Detokenizer(tokenizer), StopText(stops)
        self.n = 0  # tokens generated
        self.tokens: list[int] = list(ids)  # tokens the cache holds
        self.prompt_tps = 0.0
        self.t_first = self.t0
        self.finished = max_tokens == 0

    def prefilled(self) -> None:
        t1 = time.perf_counter()
        self.prompt_tps = len(self.todo) / max(t1 - self.t0, 1e-9)
        self.t_first = t1

    def _response(self, text: str, token: int | None, reason: str | None) -> GenerationResponse:
        elapsed = time.perf_counter() - self.t_first
        n = self.n
        tps = (n - 1) / elapsed if n > 1 and elapsed > 0 else 0.0
        return GenerationResponse(
            text, token, self.prompt_tokens, self.prompt_tps, n, tps, _peak_memory_gb(), reason
        )

    def add(self, token: int) -> GenerationResponse:
        """The piece of text the sampled ``token`` completes."""
        if self.session is not None:  # sampled, not yet in the cache
            self.session._unfed = [] if token in self.eos else [token]
        self.n += 1
        if self.n == 1:
            self.t_first = time.perf_counter()
        if token in self.eos:
            self.finished = True
            return self._response(late_text(self.detok, self.stop_text), token, "stop")
        text, stopped = self.stop_text.add(self.detok.add(token))
        if stopped:
            self.finished = True
            return self._response(text, token, "stop")
        if self.n == self.max_tokens:
            self.finished = True
            tail, stopped = self.stop_text.add(self.detok.flush())
            tail += "" if stopped else self.stop_text.rest()
            return self._response(text + tail, token, "stop" if stopped else "length")
        return self._response(text, token, None)

    def fed(self, token: int) -> None:
        """``token`` is in the cache now."""
        self.tokens.append(token)
        if self.session is not None:
            self.session._unfed = []

    def close(self) -> None:
        if self.session is not None:
            self.session._cached = self.tokens


def stream_pieces(model: Transformer, gen: TextGeneration) -> Iterator[GenerationResponse]:
    """The pieces of the generation ``gen`` (the one streaming loop of :func:`stream_generate`,
    :func:`generate` and :class:`ChatSession`), driven by
    :func:`~llmkernels.nn.generation.generate_step`."""
    step = generate_step(model, np.asarray([gen.todo], np.int64), gen.cache, gen.sampler)
    try:
        nxt = next(step)  # the prefill (and the first token)
        gen.prefilled()
        while not gen.finished:
            token = int(nxt[0])
            yield gen.add(token)
            if gen.finished:
                return
            nxt = next(step)
            gen.fed(token)
    finally:
        step.close()
        gen.close()


def _arguments(
    fn: str, model: Transformer, tokenizer: Tokenizer, max_tokens: Any, stop: Any, **sampling: Any
) -> tuple[int, Sampling, list[str]]:
    """The checked arguments of :func:`generate` / :func:`stream_generate`: the step count,
    the sampling parameters (``sampling``: ``temperature, top_k, top_p, min_p,
    repetition_penalty, seed``; defaults from ``generation_config.json``) and the stop
    strings."""
    _check_model(fn, model, tokenizer)
    steps = check_max_tokens(fn, "max_tokens", max_tokens)
    return steps, sampling_params(fn, tokenizer, **sampling), _stop_list(fn, stop)


def stream_generate(
    model: Transformer,
    tokenizer: Tokenizer,
    prompt: Any,
    max_tokens: int = 256,
    *,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    seed: int | None = None,
    stop: str | Sequence[str] | None = None,
    kv_dtype: Any = None,
    max_prompt_tokens: int = MAX_PROMPT_TOKENS,
) -> Iterator[GenerationResponse]:
    """Yield :class:`GenerationResponse` pieces as they are decoded (see the module doc for the
    prompt forms, stopping and sampling defaults). ``"".join(r.text for r in ...)`` equals
    :func:`generate`'s text. ``kv_dtype``: the KV cache's dtype (``"float32"`` default,
    ``"bfloat16"``, ``"float16"``; see :class:`llmkernels.KVCache`). ``max_prompt_tokens``:
    a longer prompt raises ValueError (default ``MAX_PROMPT_TOKENS``, 2**20); one longer than
    the model's ``max_position_embeddings`` runs with a UserWarning, as in transformers.

    Examples:
        >>> import tempfile, llmkernels as lk
        >>> from llmkernels.text import write_tiny_model
        >>> model, tok = lk.load(write_tiny_model(tempfile.mkdtemp()))
        >>> pieces = list(lk.stream_generate(model, tok, "Hello", max_tokens=8))
        >>> "".join(p.text for p in pieces) == lk.generate(model, tok, "Hello", max_tokens=8)
        True
        >>> pieces[-1].generation_tokens, pieces[-1].finish_reason
        (8, 'length')
    """
    fn = "stream_generate"
    kv = check_kv_dtype(fn, "kv_dtype", kv_dtype)
    steps, params, stops = _arguments(
        fn, model, tokenizer, max_tokens, stop, temperature=temperature, top_k=top_k,
        top_p=top_p, min_p=min_p, repetition_penalty=repetition_penalty, seed=seed,
    )  # fmt: skip
    limit = _check_max_prompt_tokens(fn, max_prompt_tokens)
    ids = _prompt_ids(fn, tokenizer, prompt)
    _check_prompt(fn, model, ids, limit)
    check_cache_size(fn, "max_tokens", model.config, 1, len(ids), steps)  # before iterating
    gen = TextGeneration(fn, model, tokenizer, ids, steps, params, stops, kv_dtype=kv)
    return stream_pieces(model, gen)


def generate(
    model: Transformer,
    tokenizer: Tokenizer,
    prompt: Any,
    max_tokens: int = 256,
    *,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    seed: int | None = None,
    stop: str | Sequence[str] | None = None,
    verbose: bool = False,
    kv_dtype: Any = None,
    max_prompt_tokens: int = MAX_PROMPT_TOKENS,
) -> str | list[str]:
    """The generated text for a prompt (a list of prompts: a list of texts, generated as one
    left-padded batch). ``verbose``: print the prompt and generation speeds after.
    ``kv_dtype``: the KV cache's dtype (``"float32"`` default, ``"bfloat16"``, ``"float16"``).
    ``max_prompt_tokens``: a longer prompt raises ValueError (default ``MAX_PROMPT_TOKENS``,
    2**20); one longer than the model's ``max_position_embeddings`` runs with a UserWarning,
    as in transformers.

    Examples:
        >>> import tempfile, llmkernels as lk
        >>> from llmkernels.text import write_tiny_model
        >>> model, tok = lk.load(write_tiny_model(tempfile.mkdtemp()))
        >>> text = lk.generate(model, tok, "Hello", max_tokens=12)  # greedy: the same each time
        >>> text == lk.generate(model, tok, "Hello", max_tokens=12), len(text) <= 12
        (True, True)
        >>> len(lk.generate(model, tok, ["Hello", "Hi"], max_tokens=5))  # one padded batch
        2
    """
    fn = "generate"
    kv = check_kv_dtype(fn, "kv_dtype", kv_dtype)
    steps, params, stops = _arguments(
        fn, model, tokenizer, max_tokens, stop, temperature=temperature, top_k=top_k,
        top_p=top_p, min_p=min_p, repetition_penalty=repetition_penalty, seed=seed,
    )  # fmt: skip
    batch = (
        isinstance(prompt, Sequence)
        and not isinstance(prompt, str)
        and len(prompt) > 0
        and all(isinstance(p, str) or _is_messages(p) for p in prompt)
        and not _is_messages(prompt)
    )
    limit = _check_max_prompt_tokens(fn, max_prompt_tokens)
    if not batch:
        ids = _prompt_ids(fn, tokenizer, prompt)
        _check_prompt(fn, model, ids, limit)
        pieces, last = [], None
        gen = TextGeneration(fn, model, tokenizer, ids, steps, params, stops, kv_dtype=kv)
        for r in stream_pieces(model, gen):
            pieces.append(r.text)
            last = r
        if verbose and last is not None:
            _report(last)
        return "".join(pieces)
    prompts = [_prompt_ids(fn, tokenizer, p) for p in prompt]
    for ids in prompts:
        _check_prompt(fn, model, ids, limit)
    return _generate_batch(
        fn,
        model,
        tokenizer,
        prompts,
        steps,
        params,
        stops,
        verbose,
        kv,
    )


def _generate_batch(
    fn: str,
    model: Transformer,
    tokenizer: Tokenizer,
    prompts: list[list[int]],
    steps: int,
    params: Sampling,
    stops: list[str],
    verbose: bool,
    kv_dtype: str = "float32",
) -> list[str]:
    b, t = len(prompts), max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = np.full((b, t), pad, np.int64)
    mask = np.zeros((b, t), bool)
    for i, p in enumerate(prompts):
        ids[i, t - len(p) :] = p
        mask[i, t - len(p) :] = True
    if steps == 0:
        return [""] * b
    check_cache_size(fn, "max_tokens", model.config, b, t, steps)
    eos = set(tokenizer.eos_token_ids) | tokenizer.stop_token_ids(stops)
    sampler = params.sampler(b, model.config.vocab_size)
    sampler.see(ids, mask)
    cache = model.new_cache(b, t + steps, kv_dtype)
    t0 = time.perf_counter()
    step = generate_step(model, ids, cache, sampler, mask)
    nxt = next(step)  # the prefill (and the first tokens)
    t1 = time.perf_counter()
    detoks = [Detokenizer(tokenizer) for _ in range(b)]
    texts = [StopText(stops) for _ in range(b)]
    out = [""] * b
    done = np.zeros(b, bool)
    n = 0
    for i_step in range(steps):
        n += 1
        for i in np.flatnonzero(~done):
            token = int(nxt[i])
            if token in eos:
                out[i] += late_text(detoks[i], texts[i])
                done[i] = True
                continue
            piece, stopped = texts[i].add(detoks[i].add(token))
            out[i] += piece
            if stopped:
                done[i] = True
        if done.all() or i_step + 1 == steps:
            break
        # finished rows keep decoding a pad token (their output is no longer read)
        nxt = step.send(np.where(done, pad, nxt))
    for i in np.flatnonzero(~done):
        out[i] += late_text(detoks[i], texts[i])
    if verbose:
        t2 = time.perf_counter()
        print(
            f"Prompt: {b}x{t} tokens, {b * t / max(t1 - t0, 1e-9):.1f} tokens-per-sec\n"
            f"Generation: {b}x{n} tokens, {b * n / max(t2 - t1, 1e-9):.1f} tokens-per-sec\n"
            f"Peak memory: {_peak_memory_gb():.3f} GB"
        )
    return out


def _report(r: GenerationResponse) -> None:
    print(
        f"Prompt: {r.prompt_tokens} tokens, {r.prompt_tps:.1f} tokens-per-sec\n"
        f"Generation: {r.generation_tokens} tokens, {r.generation_tps:.1f} tokens-per-sec\n"
        f"Peak memory: {r.peak_memory:.3f} GB"
    )


class ChatSession:
    """A conversation that keeps its KV cache across turns: each turn renders the whole
    conversation with the chat template and, when the rendering extends the tokens the cache
    holds, prefills only the new part (else it prefills everything again, e.g. when the
    template re-renders an earlier turn differently).

    Attributes:
        messages: the conversation so far.
        prefilled: tokens prefilled by the last turn (``len(prompt)`` when the cache was not
            reused).
        kv_dtype: the KV cache's dtype (``kv_dtype=`` of the constructor: ``"float32"``
            default, ``"bfloat16"`` or ``"float16"``).

    Examples:
        >>> import tempfile, llmkernels as lk
        >>> from llmkernels.text import write_tiny_model
        >>> model, tok = lk.load(write_tiny_model(tempfile.mkdtemp()))
        >>> chat = lk.ChatSession(model, tok)
        >>> reply = "".join(r.text for r in chat.send("Hi", max_tokens=4))
        >>> first = chat.prefilled
        >>> reply = "".join(r.text for r in chat.send("And?", max_tokens=4))
        >>> chat.prefilled < first + 10, len(chat.messages)  # only the new turn was prefilled
        (True, 4)
    """

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        *,
        system: str | None = None,
        kv_dtype: Any = None,
    ) -> None:
        _check_model("ChatSession", model, tokenizer)
        self.kv_dtype = check_kv_dtype("ChatSession", "kv_dtype", kv_dtype)  # of the KV cache
        self.model, self.tokenizer = model, tokenizer
        self.messages: list[dict[str, Any]] = (
            [{"role": "system", "content": system}] if system else []
        )
        self._cache: Any = None
        self._cached: list[int] = []  # tokens the cache holds
        self._unfed: list[int] = []  # the reply's last sampled token(s), not yet in the cache
        self._prompt_text: str | None = None  # the last turn's rendered prompt
        self._reply_end: str | None = None  # and the reply that followed it
        self.prefilled = 0

    def _prepare(self, ids: list[int], max_tokens: int) -> tuple[Any, list[int]]:
        need = len(ids) + max(max_tokens, 1)
        n = len(self._cached)
        cfg = self.model.config
        reuse = (
            self._cache is not None
            and self._cache.length == n
            and 0 < n < len(ids)
            and ids[:n] == self._cached
            and need <= self._cache.layers[0].max_seq_len
        )
        if reuse:
            self.prefilled = len(ids) - n
            return self._cache, ids[n:]
        check_cache_size("chat", "max_tokens", cfg, 1, len(ids), max_tokens)
        capacity = self._cache.layers[0].max_seq_len if self._cache is not None else 0
        if need > capacity:
            # room for a few more turns without reallocating
            capacity = min(max(need, 2 * capacity, 1024), max(need, cfg.max_seq_len))
            self._cache = self.model.new_cache(1, capacity, self.kv_dtype)
        else:
            self._cache.reset()
        self._cached = []
        self.prefilled = len(ids)
        return self._cache, ids

    def send(
        self,
        content: str,
        max_tokens: int = 256,
        *,
        max_prompt_tokens: int = MAX_PROMPT_TOKENS,
        **sampling: Any,
    ) -> Iterator[GenerationResponse]:
        """Add a user turn and stream the reply (the same options as :func:`stream_generate`,
        ``max_prompt_tokens`` bounding the whole rendered conversation); the reply joins the
        conversation when the stream ends."""
        fn = "chat"
        steps = check_max_tokens(fn, "max_tokens", max_tokens)
        limit = _check_max_prompt_tokens(fn, max_prompt_tokens)
        stop = sampling.pop("stop", None)
        names = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed")
        unknown = set(sampling) - set(names)
        if unknown:
            raise TypeError(f"[{fn}] unknown arguments {sorted(unknown)}")
        params = sampling_params(fn, self.tokenizer, **{k: sampling.get(k) for k in names})
        stops = _stop_list(fn, stop)
        # a turn that fails before any reply (a template error, max_tokens past the model's
        # length, an interrupted prefill) leaves the conversation as it was
        self.messages.append({"role": "user", "content": content})
        try:
            text = self.tokenizer.apply_chat_template(
                self.messages, add_generation_prompt=True, tokenize=False
            )
            ids = self._continuation(text)
            if ids is None:
                ids = _prompt_ids(fn, self.tokenizer, self.messages)
            _check_prompt(fn, self.model, ids, limit)
        except BaseException:
            self.messages.pop()
            raise
        self._prompt_text, self._reply_end = None, None
        reply: list[str] = []
        last: GenerationResponse | None = None
        failed = False
        try:
            gen = TextGeneration(fn, self.model, self.tokenizer, ids, steps, params, stops, self)
            for r in stream_pieces(self.model, gen):
                reply.append(r.text)
                last = r
                yield r
        except GeneratorExit:  # the caller stopped reading: the reply so far joins
            raise
        except BaseException:
            failed = last is None
            raise
        finally:
            if failed:
                self.messages.pop()
            else:
                self.messages.append({"role": "assistant", "content": "".join(reply)})
            self._settle(text, "".join(reply), last)

    def _settle(self, text: str | None, reply: str, last: GenerationResponse | None) -> None:
        """After the reply ``reply`` (ending with the piece ``last``) to the rendered prompt
        ``text``: the next prompt that extends ``text + reply`` reuses the cache
        (:meth:`_continuation`) -- unless a stop string cut the reply (the cache then holds text
        the conversation does not) or it did not end (an error, a client gone)."""
        eos = set(self.tokenizer.eos_token_ids)
        clean = (
            text is not None
            and last is not None
            and last.finish_reason is not None
            and (last.finish_reason == "length" or last.token in eos)
        )
        self._prompt_text, self._reply_end = (text, reply) if clean else (None, None)

    def _continuation(self, text: str) -> list[int] | None:
        """Ids for the rendered conversation ``text`` that start with the tokens the cache holds:
        the cached prompt and reply tokens as they were generated (re-encoding the reply's text
        could give other tokens), then the template's text after the reply, encoded. ``None``
        when the rendering does not extend the last prompt + reply (then everything is
        prefilled again)."""
        if self._prompt_text is None or not self._cached or self._cache is None:
            return None
        base = self._prompt_text + (self._reply_end or "")
        if not text.startswith(base) or len(text) == len(base):
            return None
        rest = self.tokenizer.encode(text[len(base) :], add_special_tokens=False)
        return self._cached + self._unfed + rest
