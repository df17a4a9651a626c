"""The HTTP side of the server: an ASGI app (Starlette) speaking OpenAI's API.

``POST /v1/chat/completions`` (messages through the checkpoint's chat template) and
``POST /v1/completions`` (a prompt string or token ids), each with ``stream: true`` as
server-sent events (``data: {...}`` chunks, then ``data: [DONE]``); ``GET /v1/models`` and
``GET /health``. Parameters: ``max_tokens`` (chat also ``max_completion_tokens``),
``temperature``, ``top_p``, ``stop``, ``seed``, ``n`` (1), ``stream_options.include_usage``,
and as extensions ``top_k``, ``min_p``, ``repetition_penalty`` and ``ignore_eos`` (generate
``max_tokens`` whatever the model says, as llama.cpp's server); left out, sampling follows
the checkpoint's ``generation_config.json`` as :func:`llmkernels.generate` does. Every reply
carries ``usage`` (prompt and completion tokens).

Errors are OpenAI's error object (``{"error": {"message", "type", "param", "code"}}``) with
the status an OpenAI client expects: 400 for a malformed body, a wrong type or value, an
unknown field, or a prompt plus ``max_tokens`` past the context (code
``context_length_exceeded``); 401 for a missing or wrong API key (compared in constant time);
404 for another model name; 413 for a body over the size limit; 503 when the queue is full.
An unexpected failure is a 500 with a short message, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import numbers
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..nn import Transformer
from ..text import GenerationResponse, sampling_params
from ..tokenizer import Tokenizer
from .engine import Engine, GenerationRequest, Overloaded, ScoredResponse

__all__ = ["create_app"]

# fields every generation endpoint takes; the values of the OpenAI ones we do not implement are
# accepted only at their neutral setting (what clients send by default)
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed")
_COMMON = {
    "model", "max_tokens", "stop", "n", "stream", "stream_options", "user", "presence_penalty",
    "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "ignore_eos", *_SAMPLING,
}  # fmt: skip
_CHAT = _COMMON | {"messages", "max_completion_tokens", "response_format"}
_COMPLETIONS = _COMMON | {"prompt", "echo", "suffix"}
_NEUTRAL = {  # field: its values that change nothing
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "echo": (False,),
    "suffix": ("",),
}
_ROLES = ("system", "user", "assistant", "developer", "tool")
_COMPLETIONS_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
_MAX_LOGPROBS = 20  # alternatives per token at most (OpenAI's top_logprobs bound)


@dataclasses.dataclass
class ApiError(Exception):
    """An OpenAI error reply: HTTP ``status`` and the error object's fields."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    kind: str = "invalid_request_error"

    def __str__(self) -> str:
        return self.message

    def response(self) -> JSONResponse:
        body = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        return JSONResponse({"error": body}, status_code=self.status)


def _bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code)


# ----------------------------------------------------------------------------------------------
# request bodies
# ----------------------------------------------------------------------------------------------


async def _read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object, at most ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is over {limit} bytes", code="body_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body is over {limit} bytes", code="body_too_large")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"the request body is not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    return body


def _int(body: Mapping[str, Any], name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{name} must be an integer, got {json.dumps(value)[:40]}", name)
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise _bad(f"{name} must be {bound}, got {value}", name)
    return value


def _number(body: Mapping[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _bad(f"{name} must be a number, got {json.dumps(value)[:40]}", name)
    return float(value)


def _check_fields(body: Mapping[str, Any], allowed: set[str]) -> None:
    for name in body:
        if name not in allowed:
            raise _bad(f"unknown field {name!r}", name)
    for name, neutral in _NEUTRAL.items():
        value = body.get(name)
        # (by type too: True is not the 1 of an integer field, nor False its 0)
        if value is not None and not any(type(value) is type(n) and value == n for n in neutral):
            raise _bad(f"{name} is not supported (only {json.dumps(neutral[0])})", name)
    if body.get("logit_bias") not in (None, {}):
        raise _bad("logit_bias is not supported", "logit_bias")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise _bad('response_format is not supported (only {"type": "text"})', "response_format")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise _bad("user must be a string", "user")


def _stop(body: Mapping[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise _bad("stop must be a non-empty string or a list of them", "stop")
    if len(stop) > 16:
        raise _bad(f"stop takes at most 16 strings, got {len(stop)}", "stop")
    return stop


def _stream_flags(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream must be a boolean", "stream")
    options = body.get("stream_options")
    usage = False
    if options is not None:
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise _bad("stream_options must be {'include_usage': bool}", "stream_options")
        usage = options.get("include_usage", False)
        if not isinstance(usage, bool):
            raise _bad("stream_options.include_usage must be a boolean", "stream_options")
        if not stream:
            raise _bad("stream_options needs stream: true", "stream_options")
    return bool(stream), usage


def _logprobs(body: Mapping[str, Any], chat: bool) -> int | None:
    """How many alternatives each token's log-probability comes with; None: no logprobs.
    Chat: ``logprobs`` (a boolean) and ``top_logprobs``; completions: ``logprobs`` (an int)."""
    if not chat:
        return _int(body, "logprobs", 0, _MAX_LOGPROBS)
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise _bad("logprobs must be a boolean", "logprobs")
    top = _int(body, "top_logprobs", 0, _MAX_LOGPROBS)
    if top is not None and not wanted:
        raise _bad("top_logprobs needs logprobs: true", "top_logprobs")
    return (top or 0) if wanted else None


def _messages(body: Mapping[str, Any]) -> list[dict[str, str]]:
    """The chat messages, each content as one string (text parts joined)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(f"{where} must be an object", "messages")
        role, content = m.get("role"), m.get("content")
        if role not in _ROLES:
            raise _bad(f"{where}.role must be one of {', '.join(_ROLES)}", "messages")
        if isinstance(content, list):  # content parts: text only
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise _bad(f"{where}.content: only text parts are supported", "messages")
                if not isinstance(part.get("text"), str):
                    raise _bad(f"{where}.content: a text part needs a string 'text'", "messages")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise _bad(f"{where}.content must be a string or a list of text parts", "messages")
        out.append({"role": role, "content": content})
    return out


# ----------------------------------------------------------------------------------------------
# the app
# ----------------------------------------------------------------------------------------------


class _Server:
    def __init__(
        self,
        engine: Engine,
        model_id: str,
        api_key: str | None,
        max_body_bytes: int,
    ) -> None:
        self.engine, self.model_id, self.api_key = engine, model_id, api_key
        self.max_body_bytes = max_body_bytes
        self.created = int(time.time())
        self._ids = 0

    def new_id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}-{self.created:x}{self._ids:06x}"

    def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        given = token.strip() if scheme.lower() == "bearer" else ""
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            raise ApiError(401, "invalid API key", code="invalid_api_key")

    # -- endpoints -----------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        active, waiting = self.engine.load
        return JSONResponse({"status": "ok", "active": active, "waiting": waiting})

    async def models(self, request: Request) -> Response:
        self.authorize(request)
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "llmkernels",
        }

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    # -- generation ----------------------------------------------------------------------

    def _prompt(self, body: Mapping[str, Any], chat: bool) -> tuple[list[int], str | None, str]:
        """(token ids, rendered text or None, the parameter that holds the prompt)."""
        tok = self.engine.tokenizer
        if chat:
            messages = _messages(body)
            if tok.chat_template is None:
                raise _bad("this model's tokenizer has no chat template: use /v1/completions")
            try:
                text = str(tok.apply_chat_template(messages, tokenize=False))
            except Exception as exc:  # jinja2's errors: the template refused the conversation
                raise _bad(f"the chat template failed: {exc}", "messages") from None
            return tok.encode(text, add_special_tokens=False), text, "messages"
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            return tok.encode(prompt), prompt, "prompt"
        if (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt)
        ):
            vocab = self.engine.model.config.vocab_size
            if not all(0 <= i < vocab for i in prompt):
                raise _bad(f"prompt token ids must be in [0, {vocab})", "prompt")
            return list(prompt), None, "prompt"
        raise _bad("prompt must be a string or a list of token ids (one prompt)", "prompt")

    def _request(self, body: Mapping[str, Any], chat: bool) -> tuple[GenerationRequest, dict]:
        _check_fields(body, _CHAT if chat else _COMPLETIONS)
        model = body.get("model")
        if model is not None and model != self.model_id:
            raise ApiError(
                404,
                f"the model {str(model)[:80]!r} does not exist: this server serves "
                f"{self.model_id!r}",
                "model",
                "model_not_found",
            )
        if _int(body, "n", 1) not in (None, 1):
            raise _bad("n must be 1", "n")
        ids, text, where = self._prompt(body, chat)
        if not ids:
            raise _bad("the prompt has no tokens", where)
        ctx = self.engine.ctx
        if len(ids) >= ctx:
            raise _bad(
                f"this server's context is {ctx} tokens; the prompt has {len(ids)}",
                where,
                "context_length_exceeded",
            )
        names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
        given = [(n, _int(body, n, 1)) for n in names]
        param, max_tokens = next(((n, v) for n, v in given if v is not None), ("max_tokens", None))
        if max_tokens is None:
            max_tokens = ctx - len(ids) if chat else min(_COMPLETIONS_MAX_TOKENS, ctx - len(ids))
        elif len(ids) + max_tokens > ctx:
            raise _bad(
                f"this server's context is {ctx} tokens; the prompt has {len(ids)} and "
                f"{param} asks for {max_tokens} more",
                param,
                "context_length_exceeded",
            )
        sampling: dict[str, Any] = {}
        for name in _SAMPLING:
            value = _int(body, name, 0) if name in ("top_k", "seed") else _number(body, name)
            sampling[name] = value
        if sampling["top_k"] == 0:
            sampling["top_k"] = None  # 0: no top-k (as transformers)
        try:
            params = sampling_params("serve", self.engine.tokenizer, **sampling)
        except (TypeError, ValueError) as exc:
            message = str(exc).replace("[serve] ", "")
            param = next((n for n in _SAMPLING if n in message), None)
            raise _bad(message, param) from None
        stream, include_usage = _stream_flags(body)
        ignore_eos = body.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise _bad("ignore_eos must be a boolean", "ignore_eos")
        request = GenerationRequest(
            ids, text, max_tokens, params, _stop(body), push=_no_push, ignore_eos=ignore_eos,
            logprobs=_logprobs(body, chat),
        )  # fmt: skip
        return request, {"stream": stream, "include_usage": include_usage}

    async def _generate(self, request: Request, chat: bool) -> Response:
        self.authorize(request)
        body = await _read_json(request, self.max_body_bytes)
        gen, opts = self._request(body, chat)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[GenerationResponse | BaseException | None] = asyncio.Queue()
        gen.push = lambda item: loop.call_soon_threadsafe(queue.put_nowait, item)
        try:
            self.engine.submit(gen)
        except Overloaded as exc:
            raise ApiError(503, str(exc), code="server_overloaded", kind="server_error") from None
        reply = _Reply(self, chat, gen, queue)
        if opts["stream"]:
            return StreamingResponse(
                reply.events(opts["include_usage"]),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return JSONResponse(await reply.whole(request))


def _no_push(item: Any) -> None:  # (replaced before the request is submitted)
    pass


class _Reply:
    """The pieces of one generation as the engine pushes them, turned into OpenAI objects."""

    def __init__(self, server: _Server, chat: bool, gen: GenerationRequest, queue: Any) -> None:
        self.server, self.chat, self.gen, self.queue = server, chat, gen, queue
        self.id = server.new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())
        self.prompt_tokens = len(gen.ids)
        self.completion_tokens = 0

    async def pieces(self, gone: asyncio.Future | None = None) -> AsyncIterator[GenerationResponse]:
        """The generation's pieces; cancels it when the consumer stops early or ``gone`` (the
        client disconnected) completes first."""
        try:
            while True:
                get = asyncio.ensure_future(self.queue.get())
                waits = {get} if gone is None else {get, gone}
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    return
                item = get.result()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise ApiError(
                        500, f"the generation failed: {type(item).__name__}: {item}",
                        kind="server_error",
                    )  # fmt: skip
                self.prompt_tokens = item.prompt_tokens
                self.completion_tokens = item.generation_tokens
                yield item
        finally:
            self.gen.cancelled.set()  # (a no-op once it ended)

    def _token(self, token: int) -> str:
        return self.server.engine.tokenizer.decode([token])

    def logprobs(self, pieces: list[GenerationResponse], offset: int) -> dict[str, Any] | None:
        """The ``logprobs`` object of a choice over ``pieces`` (None without logprobs): chat's
        ``{"content": [...]}``, or the completions' token lists (``offset``: the characters of
        the completion before these pieces)."""
        if self.gen.logprobs is None:
            return None
        scored = [p for p in pieces if isinstance(p, ScoredResponse) and p.token is not None]
        if self.chat:

            def entry(token: int, logprob: float) -> dict[str, Any]:
                text = self._token(token)
                return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

            content = []
            for p in scored:
                item = entry(p.token, p.logprob)  # type: ignore[arg-type]
                item["top_logprobs"] = [entry(t, lp) for t, lp in p.top_logprobs]
                content.append(item)
            return {"content": content}
        out: dict[str, list[Any]] = {
            "tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []
        }  # fmt: skip
        for p in pieces:
            if isinstance(p, ScoredResponse) and p.token is not None:
                out["tokens"].append(self._token(p.token))
                out["token_logprobs"].append(p.logprob)
                # the most likely tokens, and the sampled one (OpenAI: up to logprobs + 1)
                top = {self._token(t): lp for t, lp in p.top_logprobs}
                top.setdefault(out["tokens"][-1], p.logprob)
                out["top_logprobs"].append(top)
                out["text_offset"].append(offset)
            offset += len(p.text)
        return out

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def _object(self, choice: dict[str, Any], chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion" if self.chat else "text_completion") + (
            ".chunk" if chunk and self.chat else ""
        )
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.server.model_id,
            "choices": [choice],
        }

    async def whole(self, request: Request) -> dict[str, Any]:
        """The non-streamed reply (cancelled if the client disconnects while it is made)."""
        text, reason, got = [], None, []
        watcher = asyncio.ensure_future(_disconnected(request))
        pieces = self.pieces(watcher)
        try:
            async for piece in pieces:
                got.append(piece)
                text.append(piece.text)
                reason = piece.finish_reason or reason
        finally:
            self.gen.cancelled.set()  # (a no-op once it ended)
            watcher.cancel()
            await pieces.aclose()
        content = "".join(text)
        logprobs = self.logprobs(got, 0)
        if self.chat:
            message = {"role": "assistant", "content": content}
            choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": content, "finish_reason": reason, "logprobs": logprobs}
        return {**self._object(choice, False), "usage": self.usage()}

    async def events(self, include_usage: bool) -> AsyncIterator[str]:
        """The streamed reply as server-sent events."""

        def event(obj: dict[str, Any]) -> str:
            return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

        pieces = self.pieces()
        try:
            if self.chat:
                delta = {"role": "assistant", "content": ""}
                yield event(self._object({"index": 0, "delta": delta, "finish_reason": None}, True))
            held: list[GenerationResponse] = []  # pieces of no text yet (their logprobs wait)
            offset = 0  # characters of the completion sent
            try:
                async for piece in pieces:
                    held.append(piece)
                    if not piece.text and piece.finish_reason is None:
                        continue
                    logprobs = self.logprobs(held, offset)
                    held = []
                    offset += len(piece.text)
                    if self.chat:
                        delta = {"content": piece.text} if piece.text else {}
                        choice = {"index": 0, "delta": delta, "logprobs": logprobs}
                    else:
                        choice = {"index": 0, "text": piece.text, "logprobs": logprobs}
                    choice["finish_reason"] = piece.finish_reason
                    yield event(self._object(choice, True))
            except ApiError as exc:  # mid-stream: the error object as the last event
                yield event({"error": {"message": exc.message, "type": exc.kind, "code": None}})
            if include_usage:
                yield event({**self._object({}, True), "choices": [], "usage": self.usage()})
            yield "data: [DONE]\n\n"
        finally:
            # (set here, not only in pieces(): a cancelled stream may not get to run its finally)
            self.gen.cancelled.set()
            await pieces.aclose()


async def _disconnected(request: Request) -> None:
    """Returns when the client of ``request`` has gone."""
    while not await request.is_disconnected():
        await asyncio.sleep(0.25)


def create_app(
    model: Transformer,
    tokenizer: Tokenizer,
    *,
    model_id: str = "llmkernels",
    max_sequences: int = 4,
    queue_size: int = 64,
    ctx: int | None = None,
    kv_dtype: Any = None,
    api_key: str | None = None,
    max_body_bytes: int = 4 << 20,
    prefill_chunk: int = 256,
) -> Starlette:
    """The OpenAI-compatible ASGI app of ``model`` and ``tokenizer`` (from
    :func:`llmkernels.load`): run it with any ASGI server (``uvicorn.run(app)``; the
    ``llmkernels serve`` command does). Its engine starts now, with ``max_sequences`` KV caches
    of ``ctx`` positions (default: the model's ``max_position_embeddings``, at most 4096) and a
    queue of ``queue_size``, prefilling at most ``prefill_chunk`` prompt tokens per step while
    others decode; it drains and stops when the app shuts down."""
    ctx = min(model.config.max_seq_len, 4096) if ctx is None else ctx
    engine = Engine(
        model, tokenizer, max_sequences=max_sequences, queue_size=queue_size, ctx=ctx,
        kv_dtype=kv_dtype, prefill_chunk=prefill_chunk,
    )  # fmt: skip
    server = _Server(engine, model_id, api_key, max_body_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:  # (uvicorn's graceful shutdown has already let the streams end)
            await asyncio.get_running_loop().run_in_executor(None, engine.close, 30.0)

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def internal_error(request: Request, exc: Exception) -> Response:
        message = f"internal error: {type(exc).__name__}"
        return ApiError(500, message, kind="server_error").response()

    routes = [
        Route("/health", server.health, methods=["GET"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/chat/completions", server.chat, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={ApiError: api_error, Exception: internal_error},
    )
    app.state.engine = engine
    return app
