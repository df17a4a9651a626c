"""The OpenAI-compatible server (llmkernels.serve) against live servers on 127.0.0.1.

* the official ``openai`` client: chat and completions, streamed and not, stop strings, usage
  counts; greedy text equal to ``lk.generate`` run alone;
* 16 concurrent clients: each reply equals its single-client reply;
* a client that disconnects mid-stream frees its slot (the waiting request is then served);
  a full queue answers 503;
* bad requests (malformed JSON, wrong types, unknown fields, bad max_tokens, a prompt past the
  context, a body over the limit, a wrong API key) get the right status and an OpenAI error
  object, and the server keeps serving;
* ``llmkernels serve`` in a subprocess answers, then exits cleanly on SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx  # (the test extra installs the server's stack: these tests run, not skip)
import llmkernels as lk
import numpy as np
import openai
import pytest
import uvicorn
from llmkernels.serve import create_app

MODEL, TOK = lk.load(lk.example_model())
MODEL_ID = "example"
KEY = "secret-key"
QUESTION = [{"role": "user", "content": "What is a list?"}]
TIMEOUT = 120  # seconds a test waits for a server at most


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """``create_app(MODEL, TOK, **kw)`` served by uvicorn on a thread."""

    def __init__(self, model: Any = MODEL, **kw: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(model, TOK, model_id=MODEL_ID, **kw)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + TIMEOUT
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.02)

    def client(self, key: str = KEY) -> Any:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, timeout=TIMEOUT)

    def post(self, path: str, key: str | None = KEY, headers: Any = None, **kw: Any) -> Any:
        headers = {**(headers or {}), **({"Authorization": f"Bearer {key}"} if key else {})}
        return httpx.post(self.url + path, headers=headers, timeout=TIMEOUT, **kw)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(TIMEOUT)


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    s = LiveServer(max_sequences=4, queue_size=64, ctx=512, api_key=KEY)
    yield s
    s.stop()


def chat(client: Any, **kw: Any) -> Any:
    return client.chat.completions.create(model=MODEL_ID, **{"messages": QUESTION, **kw})


# ----------------------------------------------------------------------------------------------
# the API
# ----------------------------------------------------------------------------------------------


def test_chat_equals_generate(server: LiveServer) -> None:
    for max_tokens in (24, 8):  # (the reply ends at EOS after 23 tokens; 8 stops it)
        r = chat(server.client(), max_tokens=max_tokens, temperature=0)
        pieces = list(lk.stream_generate(MODEL, TOK, QUESTION, max_tokens, temperature=0))
        assert r.choices[0].message.role == "assistant"
        assert r.choices[0].message.content == "".join(p.text for p in pieces)
        assert r.object == "chat.completion" and r.model == MODEL_ID
        n_prompt, n_reply = len(TOK.apply_chat_template(QUESTION)), pieces[-1].generation_tokens
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (n_prompt, n_reply)
        assert r.usage.total_tokens == n_prompt + n_reply
        assert r.choices[0].finish_reason == pieces[-1].finish_reason
    assert r.choices[0].finish_reason == "length"


def test_chat_stream_equals_generate(server: LiveServer) -> None:
    chunks = list(
        chat(server.client(), max_tokens=24, temperature=0, stream=True,
             stream_options={"include_usage": True})
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    pieces = list(lk.stream_generate(MODEL, TOK, QUESTION, 24, temperature=0))
    assert text == "".join(p.text for p in pieces)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"  # EOS
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == pieces[-1].generation_tokens
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_raw_sse_ends_with_done(server: LiveServer) -> None:
    body = {"model": MODEL_ID, "prompt": "The list type", "max_tokens": 5, "stream": True,
            "temperature": 0}  # fmt: skip
    with httpx.stream(
        "POST", server.url + "/v1/completions", json=body, timeout=TIMEOUT,
        headers={"Authorization": f"Bearer {KEY}"},
    ) as r:  # fmt: skip
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert all(ln.startswith("data: ") for ln in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    want = lk.generate(MODEL, TOK, "The list type", max_tokens=5, temperature=0)
    assert "".join(c["choices"][0]["text"] for c in chunks) == want


def test_completions_equal_generate(server: LiveServer) -> None:
    client = server.client()
    r = client.completions.create(
        model=MODEL_ID, prompt="The list type", max_tokens=12, temperature=0
    )
    want = lk.generate(MODEL, TOK, "The list type", max_tokens=12, temperature=0)
    assert r.choices[0].text == want and r.object == "text_completion"
    assert r.usage.prompt_tokens == len(TOK.encode("The list type"))
    streamed = client.completions.create(
        model=MODEL_ID, prompt="The list type", max_tokens=12, stream=True, temperature=0
    )
    assert "".join(c.choices[0].text for c in streamed) == want
    # token ids as the prompt; OpenAI's default of 16 new tokens
    ids = TOK.encode("A dict")
    r = client.completions.create(model=MODEL_ID, prompt=ids, temperature=0)
    assert r.choices[0].text == lk.generate(MODEL, TOK, ids, max_tokens=16, temperature=0)
    assert r.usage.completion_tokens <= 16


def test_stop_strings_and_sampling(server: LiveServer) -> None:
    client = server.client()
    full = lk.generate(MODEL, TOK, QUESTION, max_tokens=30, temperature=0)
    stop = full.split()[3]  # a word from the middle of the reply
    r = chat(client, max_tokens=30, temperature=0, stop=[stop])
    assert r.choices[0].message.content == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    # seeded sampling is reproducible and equals lk.generate's
    kw = {"temperature": 0.9, "top_p": 0.9, "seed": 7}
    r1 = chat(client, max_tokens=16, **kw).choices[0].message.content
    r2 = chat(client, max_tokens=16, **kw).choices[0].message.content
    assert r1 == r2 == lk.generate(MODEL, TOK, QUESTION, max_tokens=16, **kw)
    # extensions: ignore_eos (the reply ends at EOS after 23 tokens without it), top_k,
    # min_p, repetition_penalty
    r = chat(client, max_tokens=30, temperature=0, extra_body={"ignore_eos": True})
    assert (r.usage.completion_tokens, r.choices[0].finish_reason) == (30, "length")
    ext = {"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.3}
    r = chat(client, max_tokens=16, seed=3, temperature=0.8, extra_body=ext)
    assert r.choices[0].message.content == lk.generate(
        MODEL, TOK, QUESTION, max_tokens=16, seed=3, temperature=0.8, **ext
    )


def test_models_and_health(server: LiveServer) -> None:
    models = server.client().models.list()
    assert [m.id for m in models.data] == [MODEL_ID]
    health = httpx.get(server.url + "/health", timeout=TIMEOUT)
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_conversation_turn_reuses_the_cache(server: LiveServer) -> None:
    """The next turn of a conversation, sent whole as OpenAI clients do, is prefilled from
    where the previous turn's tokens end (the prompt cache): fewer prompt tokens prefilled,
    the same reply as a ChatSession's."""
    client = server.client()
    first = chat(client, max_tokens=8, temperature=0).choices[0].message.content
    turn = [*QUESTION, {"role": "assistant", "content": first},
            {"role": "user", "content": "And a dict?"}]  # fmt: skip
    engine = server.app.state.engine
    before = [s.prefilled for s in engine._slots]
    r = chat(client, messages=turn, max_tokens=8, temperature=0)
    after = [s.prefilled for s in engine._slots]
    session = lk.ChatSession(MODEL, TOK)
    list(session.send("What is a list?", max_tokens=8, temperature=0))
    want = "".join(p.text for p in session.send("And a dict?", max_tokens=8, temperature=0))
    assert r.choices[0].message.content == want
    changed = [a for a, b in zip(after, before, strict=True) if a != b] or after
    assert min(changed) == session.prefilled < len(TOK.apply_chat_template(turn))


def test_concurrent_clients_equal_single_client() -> None:
    """16 clients at once on 8 slots: their generations share batched decode steps, in
    whatever groups the timing makes, and their prompts are prefilled 3 tokens per step while
    others decode; each reply equals the prompt's lk.generate alone (int8 weights: the batched
    decode is bitwise the single-sequence one; a chunked prompt's logits are within float32
    rounding of the whole prompt's, and these replies have no near-tie)."""
    model8, _ = lk.load(lk.example_model(), dtype="int8")
    s = LiveServer(model=model8, max_sequences=8, ctx=512, prefill_chunk=3)
    try:
        prompts = [f"Item {i}: the" for i in range(16)]
        alone = {p: lk.generate(model8, TOK, p, max_tokens=24, temperature=0) for p in prompts}

        def ask(p: str) -> str:
            r = s.client().completions.create(
                model=MODEL_ID, prompt=p, max_tokens=24, temperature=0
            )
            return r.choices[0].text

        with ThreadPoolExecutor(16) as pool:
            got = dict(zip(prompts, pool.map(ask, prompts), strict=True))
        assert got == alone
    finally:
        s.stop()


class _Recording:
    """A model that records the length of every prompt chunk the engine runs."""

    def __init__(self, model: Any) -> None:
        self.model, self.chunks = model, []

    def __call__(self, ids: Any, **kw: Any) -> Any:
        self.chunks.append(len(ids[0]))
        return self.model(ids, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def test_long_prompt_is_prefilled_in_chunks_while_others_decode() -> None:
    """A prompt that joins while another generation decodes goes in chunks of prefill_chunk
    tokens, one per decode step, and its reply equals lk.generate alone (int8 weights; the
    chunks' logits are within float32 rounding of the whole prompt's: no near-tie here)."""
    model8, _ = lk.load(lk.example_model(), dtype="int8")
    s = LiveServer(model=model8, max_sequences=2, ctx=512, prefill_chunk=5)
    engine = s.app.state.engine
    engine.model = recording = _Recording(model8)
    try:
        long_prompt = "The list type " * 8
        n_prompt = len(TOK.encode(long_prompt))
        assert n_prompt > 20
        body = {**LONG, "max_tokens": 200, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=TIMEOUT,
                          headers={"Authorization": f"Bearer {KEY}"}) as first:  # fmt: skip
            lines = first.iter_lines()
            assert next(ln for ln in lines if ln).startswith("data: ")  # it is decoding
            recording.chunks.clear()
            r = s.client().completions.create(
                model=MODEL_ID, prompt=long_prompt, max_tokens=8, temperature=0
            )
        assert r.choices[0].text == lk.generate(
            model8, TOK, long_prompt, max_tokens=8, temperature=0
        )
        assert recording.chunks[: n_prompt // 5] == [5] * (n_prompt // 5), recording.chunks
        assert sum(recording.chunks) == n_prompt
    finally:
        s.stop()


def test_shared_prefix_and_repeated_prompt_reuse_the_cache() -> None:
    """A prompt that shares a prefix with a free slot's tokens keeps that prefix's K/V (the
    slot's cache is cropped to it) and prefills only the rest; the same prompt sent again
    prefills its last token only. Replies equal lk.generate alone (int8 weights; the split
    prompt's logits are within float32 rounding of the whole prompt's: no near-tie here)."""
    model8, _ = lk.load(lk.example_model(), dtype="int8")
    s = LiveServer(model=model8, max_sequences=1, ctx=512)
    engine = s.app.state.engine
    engine.model = recording = _Recording(model8)
    shared = "A list is a sequence of items. " * 3
    prompts = [shared + "Q: what is a list? A:", shared + "Q: what is a dict? A:"]
    try:
        replies, prefilled = [], []
        with s.client() as client:
            for p in [*prompts, prompts[1]]:
                recording.chunks.clear()
                r = client.completions.create(model=MODEL_ID, prompt=p, max_tokens=6,
                                              temperature=0)  # fmt: skip
                replies.append(r.choices[0].text)
                prefilled.append(sum(recording.chunks))
        for p, got in zip([*prompts, prompts[1]], replies, strict=True):
            assert got == lk.generate(model8, TOK, p, max_tokens=6, temperature=0)
        ids = [TOK.encode(p) for p in prompts]
        common = next(i for i, (a, b) in enumerate(zip(*ids, strict=False)) if a != b)
        assert common > len(ids[1]) // 2
        assert prefilled == [len(ids[0]), len(ids[1]) - common, 1]
    finally:
        s.stop()


def _log_softmax(logits: Any) -> Any:
    row = np.asarray(logits, np.float64)
    return row - (row.max() + np.log(np.exp(row - row.max()).sum()))


def _served_logprobs(ids: list[int], reply: list[int], *, reused: bool) -> list[Any]:
    """The log-softmax rows the server computes for the tokens of ``reply``: the prompt
    prefilled in one forward with ``last_only`` -- or, when a slot holds the prompt, its prefix
    from that slot's cache and its last token run alone -- then each reply token decoded. (The
    same computation, not the whole sequence in one forward: where the CPU has a bfloat16 dot
    product, a bfloat16 model's prefill rounds its activations to bfloat16 and a lone token's
    does not, so the two differ by more than float32 rounding.)"""
    cache = MODEL.new_cache(1, len(ids) + len(reply))
    head, last = (ids[:-1], ids[-1:]) if reused else (ids, [])
    rows = [MODEL(np.asarray([head]), cache=cache, last_only=True)[0, -1]]
    for t in [*last, *reply[:-1]]:
        rows.append(MODEL(np.asarray([[t]]), cache=cache)[0, -1])
    return [_log_softmax(r) for r in rows[len(last) :]]


def test_chat_logprobs() -> None:
    """logprobs: true, top_logprobs: 3 -- each token's log-softmax of the raw logits (computed
    as the server computes them, within float32 rounding), the 3 most likely first, greedy's
    token the most likely; streamed the same. (A server of its own, so that which tokens come
    from a slot's cache is known.)"""
    s = LiveServer(max_sequences=1, ctx=512)
    try:
        r = chat(s.client(), max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
        content = r.choices[0].logprobs.content
        assert "".join(c.token for c in content) == r.choices[0].message.content
        ids = TOK.apply_chat_template(QUESTION)
        reply = TOK.encode(r.choices[0].message.content, add_special_tokens=False)
        assert len(reply) == len(content)
        for c, want in zip(content, _served_logprobs(ids, reply, reused=False), strict=True):
            assert abs(c.logprob - want.max()) < 1e-4  # greedy: the most likely
            assert [t.logprob for t in c.top_logprobs] == sorted(
                (t.logprob for t in c.top_logprobs), reverse=True
            )
            assert len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token
            np.testing.assert_allclose([t.logprob for t in c.top_logprobs],
                                       np.sort(want)[::-1][:3], atol=1e-4)  # fmt: skip
            assert c.bytes == list(c.token.encode())
        # the same prompt again: the slot holds it, so its prefix's K/V come from the cache and
        # its last token is run alone
        streamed = chat(s.client(), max_tokens=8, temperature=0, logprobs=True, stream=True)
        got = [e for ch in streamed if ch.choices and ch.choices[0].logprobs
               for e in ch.choices[0].logprobs.content]  # fmt: skip
        assert [e.token for e in got] == [c.token for c in content]
        np.testing.assert_allclose([e.logprob for e in got],
                                   [w.max() for w in _served_logprobs(ids, reply, reused=True)],
                                   atol=1e-5)  # fmt: skip
        assert all(e.top_logprobs == [] for e in got)
        assert chat(s.client(), max_tokens=2).choices[0].logprobs is None
    finally:
        s.stop()


def test_completions_logprobs(server: LiveServer) -> None:
    client = server.client()
    r = client.completions.create(
        model=MODEL_ID, prompt="The list type", max_tokens=6, temperature=0, logprobs=2
    )
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.tokens) == 6
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert top[token] == logprob == max(top.values()) and len(top) <= 3
    streamed = client.completions.create(
        model=MODEL_ID, prompt="The list type", max_tokens=6, temperature=0, logprobs=0,
        stream=True,
    )  # fmt: skip
    chunks = [c.choices[0].logprobs for c in streamed if c.choices[0].logprobs]
    assert [t for c in chunks for t in c.tokens] == lp.tokens
    # (the same prompt again: its prefix's K/V come from the cache and its last token is run
    # alone, so the logits are within float32 rounding of the first run's)
    np.testing.assert_allclose([v for c in chunks for v in c.token_logprobs], lp.token_logprobs,
                               atol=1e-5)  # fmt: skip
    assert r.choices[0].logprobs is not None
    plain = client.completions.create(model=MODEL_ID, prompt="a", max_tokens=2)
    assert plain.choices[0].logprobs is None


# ----------------------------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------------------------

BAD = [
    ("malformed", {"content": b"{not json"}, 400, None),
    ("not_object", {"json": [1, 2]}, 400, None),
    ("unknown_field", {"json": {"prompt": "a", "frobnicate": 1}}, 400, "frobnicate"),
    ("max_tokens_negative", {"json": {"prompt": "a", "max_tokens": -1}}, 400, "max_tokens"),
    ("max_tokens_str", {"json": {"prompt": "a", "max_tokens": "5"}}, 400, "max_tokens"),
    ("max_tokens_huge", {"json": {"prompt": "a", "max_tokens": 10**12}}, 400, "max_tokens"),
    ("temperature_str", {"json": {"prompt": "a", "temperature": "hot"}}, 400, "temperature"),
    ("temperature_negative", {"json": {"prompt": "a", "temperature": -1}}, 400, "temperature"),
    ("stream_int", {"json": {"prompt": "a", "stream": 1}}, 400, "stream"),
    ("n_two", {"json": {"prompt": "a", "n": 2}}, 400, "n"),
    ("stop_int", {"json": {"prompt": "a", "stop": 3}}, 400, "stop"),
    ("prompt_missing", {"json": {"max_tokens": 3}}, 400, "prompt"),
    ("prompt_bad_ids", {"json": {"prompt": [1, 10**9]}}, 400, "prompt"),
    ("prompt_too_long", {"json": {"prompt": "word " * 2000}}, 400, "prompt"),
    ("penalty", {"json": {"prompt": "a", "presence_penalty": 0.5}}, 400, "presence_penalty"),
    ("logprobs_many", {"json": {"prompt": "a", "logprobs": 21}}, 400, "logprobs"),
    ("logprobs_bool", {"json": {"prompt": "a", "logprobs": True}}, 400, "logprobs"),
    ("unknown_model", {"json": {"prompt": "a", "model": "gpt-9"}}, 404, "model"),
    ("body_too_large", {"content": b" " * (5 << 20)}, 413, None),
]


@pytest.mark.parametrize("name,kw,status,param", BAD, ids=[b[0] for b in BAD])
def test_bad_requests_get_openai_errors(
    server: LiveServer, name: str, kw: dict, status: int, param: str | None
) -> None:
    headers = {"Content-Type": "application/json"}
    r = server.post("/v1/completions", headers=headers, **kw)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in r.text
    assert error["param"] == param
    if name in ("prompt_too_long", "max_tokens_huge"):
        assert error["code"] == "context_length_exceeded"
    # and the server goes on serving
    assert chat(server.client(), max_tokens=2).choices[0].message.content is not None


def test_chat_errors(server: LiveServer) -> None:
    for messages, part in (
        ([], "non-empty"),
        ([{"role": "wizard", "content": "x"}], "role"),
        ([{"role": "user", "content": 5}], "content"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "text parts"),
    ):
        r = server.post("/v1/chat/completions", json={"messages": messages})
        assert r.status_code == 400 and part in r.json()["error"]["message"], r.text
        assert r.json()["error"]["param"] == "messages"
    for extra, param in (
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": 1}, "logprobs"),
    ):
        r = server.post("/v1/chat/completions", json={"messages": QUESTION, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_api_key(server: LiveServer) -> None:
    for key in ("wrong", None):
        r = server.post("/v1/completions", key=key, json={"prompt": "a", "max_tokens": 1})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        chat(server.client(key="wrong"), max_tokens=1)
    assert httpx.get(server.url + "/health", timeout=TIMEOUT).status_code == 200  # open


# ----------------------------------------------------------------------------------------------
# bounded under load
# ----------------------------------------------------------------------------------------------

LONG = {"model": MODEL_ID, "prompt": "The list type", "max_tokens": 1800, "temperature": 0}


def test_disconnect_frees_the_slot_and_full_queue_is_503() -> None:
    """One sequence, a queue of one: a long stream holds the slot, a second request waits, a
    third is refused with 503; the first client hangs up mid-stream, and the waiting request
    is then served."""
    assert lk.generate(MODEL, TOK, LONG["prompt"], max_tokens=1800, temperature=0)  # (runs)
    s = LiveServer(max_sequences=1, queue_size=1, ctx=2048)
    try:
        engine = s.app.state.engine
        with httpx.stream("POST", s.url + "/v1/completions", json={**LONG, "stream": True},
                          timeout=TIMEOUT) as first:  # fmt: skip
            lines = first.iter_lines()
            assert next(ln for ln in lines if ln).startswith("data: ")  # it is running
            waiting: dict[str, Any] = {}
            body = {"model": MODEL_ID, "prompt": "A dict", "max_tokens": 4, "temperature": 0}
            t = threading.Thread(
                target=lambda: waiting.update(r=s.post("/v1/completions", key=None, json=body))
            )
            t.start()
            deadline = time.monotonic() + TIMEOUT
            while engine.load != (1, 1):
                assert time.monotonic() < deadline, engine.load
                time.sleep(0.01)
            refused = s.post("/v1/completions", key=None, json=body)
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "server_overloaded"
        # the first client is gone: its sequence is cancelled and the waiting one served
        t.join(TIMEOUT)
        assert waiting["r"].status_code == 200
        assert waiting["r"].json()["choices"][0]["text"] == lk.generate(
            MODEL, TOK, "A dict", max_tokens=4, temperature=0
        )
        assert engine.load == (0, 0)
    finally:
        s.stop()


def test_cli_serves_and_exits_on_sigterm() -> None:
    port = free_port()
    env = {**os.environ, "LLMKERNELS_API_KEY": ""}
    cmd = [sys.executable, "-m", "llmkernels", "serve", "--model", lk.example_model(),
           "--port", str(port), "--max-sequences", "2", "--ctx", "256"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + TIMEOUT
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()  # type: ignore[union-attr]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        model_id = os.path.basename(os.path.normpath(lk.example_model()))
        r = client.chat.completions.create(
            model=model_id, messages=QUESTION, max_tokens=6, temperature=0
        )
        assert r.choices[0].message.content == lk.generate(
            MODEL, TOK, QUESTION, max_tokens=6, temperature=0
        )
        proc.send_signal(signal.SIGTERM)
        # uvicorn drains (the app's shutdown stops the engine), then re-raises the signal
        assert proc.wait(TIMEOUT) in (0, -signal.SIGTERM)
        log = proc.stdout.read().decode()  # type: ignore[union-attr]
        assert "Application shutdown complete" in log and "Traceback" not in log, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
