"""The generation engine of the server: one thread runs the model for every request.

Each running generation holds a *slot*: a :class:`~llmkernels.ChatSession` whose KV cache of
``ctx`` positions is allocated when the engine starts, so the memory of all slots -- the KV
budget -- is fixed up front and no request can make the server allocate more cache. Every
step, requests waiting for a slot join, prompts are prefilled, then **one batched forward**
(:meth:`~llmkernels.Transformer.decode`) advances every running generation by one token: each
projection reads its weights once for all of them, attention reads each one's own cache at its
own length (no padding). Finished and cancelled generations leave between steps (continuous
batching). Requests beyond ``max_sequences`` wait in a queue of ``queue_size``; past that,
:meth:`Engine.submit` raises :class:`Overloaded`.

Prefill is chunked: while other generations are decoding, a step prefills at most
``prefill_chunk`` prompt tokens (the oldest prompts first, each chunk in its own forward into the
slot's cache), so a long prompt delays everyone's next token by one chunk's time, not by the
whole prompt's; with nobody decoding, a prompt is prefilled whole. A prompt cut in chunks gets
logits within float32 rounding of the whole prompt's (attention over the cache sums in another
order; int8 example model, 26 tokens in chunks of 5: 1e-6), so its greedy reply can differ from
``lk.generate``'s at a near-tie.

A request with ``logprobs`` set gets, with each token, its log-probability under the model's
distribution -- the log-softmax of the raw logits, before temperature, penalties and truncation
(what vLLM and OpenAI report) -- and the ``logprobs`` most likely tokens with theirs
(:class:`ScoredResponse`).

A generation's tokens do not depend on which others share its steps where the model's decode
is batch-invariant: with int8 / int4 weights (activations quantized per token, exact integer
sums) greedy output equals ``lk.generate`` run alone, bit for bit (unless its prompt was
chunked, above). With float weights a batched
row can differ from a lone one in the last bits of float32 (``Transformer.decode``), so greedy
output can differ at near-ties. A slot keeps the tokens it holds when its generation ends; a
later prompt that extends them (the next turn of the same conversation, as an OpenAI client
sends it: the whole conversation again) is prefilled from where they end, as
:class:`~llmkernels.ChatSession` does in-process. Any other prompt that shares a prefix with a
free slot's tokens -- a system prompt many conversations share, a prompt sent again to
regenerate a reply -- keeps that prefix's keys and values and prefills the rest (the slot's cache
is cropped to the prefix), as llama.cpp's server does with ``cache_prompt``.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ..nn import Transformer
from ..nn.sampling import Sampling
from ..text import ChatSession, GenerationResponse, TextGeneration
from ..tokenizer import Tokenizer

__all__ = ["Engine", "GenerationRequest", "Overloaded", "ScoredResponse"]


class Overloaded(RuntimeError):
    """The queue is full (or the engine is shutting down): the request was not taken."""


@dataclasses.dataclass
class GenerationRequest:
    """One generation as the engine runs it.

    ``ids``: the prompt's tokens; ``text``: the prompt as rendered text (``None`` for a prompt
    of token ids), which lets a later prompt that extends it reuse the slot's cache.
    ``push`` receives every :class:`~llmkernels.GenerationResponse` piece, then ``None`` when
    the generation ended, or an exception if it failed; it is called from the engine's thread.
    Setting ``cancelled`` stops the generation at its next step and frees its slot.
    """

    ids: list[int]
    text: str | None
    max_tokens: int
    params: Sampling
    stops: list[str]
    push: Callable[[GenerationResponse | BaseException | None], None]
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)
    ignore_eos: bool = False  # generate max_tokens whatever the model says (benchmarks)
    logprobs: int | None = None  # each token's log-probability and this many alternatives


@dataclasses.dataclass
class ScoredResponse(GenerationResponse):
    """A :class:`~llmkernels.GenerationResponse` of a request with ``logprobs``: ``logprob`` is
    the log-probability of ``token`` (the log-softmax of the model's raw logits, in float64),
    ``top_logprobs`` the ``logprobs`` most likely tokens as ``(token, logprob)``, most likely
    first."""

    logprob: float = 0.0
    top_logprobs: list[tuple[int, float]] = dataclasses.field(default_factory=list)


def _scored(piece: GenerationResponse, token: int, logits: np.ndarray, n: int) -> ScoredResponse:
    row = np.asarray(logits, np.float64).reshape(-1)
    top = float(row.max())
    logp = row - (top + np.log(np.exp(row - top).sum()))
    best: list[tuple[int, float]] = []
    if n:
        idx = np.argpartition(-logp, min(n, len(logp)) - 1)[:n]
        idx = idx[np.lexsort((idx, -logp[idx]))]  # most likely first; ties by id
        best = [(int(i), float(logp[i])) for i in idx]
    fields = {f.name: getattr(piece, f.name) for f in dataclasses.fields(GenerationResponse)}
    return ScoredResponse(**fields, logprob=float(logp[token]), top_logprobs=best)


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """The length of the longest common prefix of ``a`` and ``b``, at most ``limit``."""
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return max(n, 0)


@dataclasses.dataclass
class _Active:
    request: GenerationRequest
    slot: ChatSession
    gen: TextGeneration
    pending: int | None = None  # the token sampled last, to feed in the next step
    prefilled: int = 0  # tokens of gen.todo in the cache so far
    reply: list[str] = dataclasses.field(default_factory=list)
    last: GenerationResponse | None = None


class Engine:
    """Runs ``model`` on its own thread for up to ``max_sequences`` generations at a time, each
    in a slot with a KV cache of ``ctx`` positions (``kv_dtype``), with up to ``queue_size``
    requests waiting; a step prefills at most ``prefill_chunk`` prompt tokens while others
    decode."""

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        *,
        max_sequences: int = 4,
        queue_size: int = 64,
        ctx: int = 4096,
        kv_dtype: Any = None,
        prefill_chunk: int = 256,
    ) -> None:
        limits = (("max_sequences", max_sequences), ("queue_size", queue_size),
                  ("prefill_chunk", prefill_chunk))  # fmt: skip
        for name, value in limits:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"[serve] {name} must be an int >= 1, got {value!r}")
        if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 2:
            raise ValueError(f"[serve] ctx must be an int >= 2, got {ctx!r}")
        self.model, self.tokenizer = model, tokenizer
        self.ctx, self.max_sequences, self.queue_size = ctx, max_sequences, queue_size
        self.prefill_chunk = prefill_chunk
        self._slots: list[ChatSession] = []
        for _ in range(max_sequences):
            slot = ChatSession(model, tokenizer, kv_dtype=kv_dtype)
            slot._cache = model.new_cache(1, ctx, slot.kv_dtype)  # the whole budget, now
            self._slots.append(slot)
        self._free = collections.deque(self._slots)  # least recently used first
        self._waiting: collections.deque[GenerationRequest] = collections.deque()
        self._active: list[_Active] = []
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="llmkernels-engine", daemon=True)
        self._thread.start()

    # -- requests ------------------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> None:
        """Queue ``request`` (raises :class:`Overloaded` when ``queue_size`` requests wait)."""
        with self._cond:
            if self._closing:
                raise Overloaded("the server is shutting down")
            if len(self._waiting) >= self.queue_size:
                raise Overloaded(
                    f"the server is busy: {len(self._active)} generations running and "
                    f"{len(self._waiting)} waiting (queue_size {self.queue_size}); retry later"
                )
            self._waiting.append(request)
            self._cond.notify()

    @property
    def load(self) -> tuple[int, int]:
        """(active generations, waiting requests)."""
        with self._cond:
            return len(self._active), len(self._waiting)

    def close(self, timeout: float | None = None) -> None:
        """Take no new request, let the running and waiting ones finish (their clients see
        them end), then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    # -- the engine's thread -------------------------------------------------------------

    def _take_slot(self, request: GenerationRequest) -> tuple[ChatSession, list[int]] | None:
        """A free slot for ``request`` and the ids to run: a slot whose cached conversation
        the rendered prompt extends first; else the slot whose cached tokens share the longest
        prefix with the prompt, if it is the slot's whole cache or a tenth of the prompt
        (llama.cpp's server default); else the least recently used slot. A shared prefix is
        kept in the slot's cache and the rest dropped (``ModelCache.crop``), so only the
        prompt's remaining tokens are prefilled -- at least its last one, whose logits give
        the first token."""
        if not self._free:
            return None
        for slot in self._free:
            ids = slot._continuation(request.text) if request.text is not None else None
            if ids is not None and len(ids) + max(request.max_tokens, 1) <= self.ctx:
                self._free.remove(slot)
                return slot, ids
        ids = request.ids
        best, keep = None, 0
        for slot in self._free:
            cached = slot._cached
            if slot._cache is None or slot._cache.length != len(cached):
                continue
            n = _common_prefix(cached, ids, len(ids) - 1)
            if n > keep and (n == len(cached) or 10 * n >= len(ids)):
                best, keep = slot, n
        if best is not None:
            if keep < len(best._cached):
                try:
                    best._cache.crop(keep)
                except ValueError:  # (a sliding-window cache that wrapped): start afresh
                    best = None
                else:
                    best._cached = ids[:keep]
                    best._unfed = []
                    best._prompt_text, best._reply_end = None, None
            if best is not None:
                self._free.remove(best)
                return best, ids
        return self._free.popleft(), ids

    def _admit(self) -> list[_Active]:
        """Waiting requests into free slots (the engine's lock held): the ones that joined."""
        joined = []
        while self._waiting and self._free:
            request = self._waiting.popleft()
            if request.cancelled.is_set():
                request.push(None)
                continue
            slot, ids = self._take_slot(request)  # type: ignore[misc]
            try:
                gen = TextGeneration(
                    "serve", self.model, self.tokenizer, ids, request.max_tokens,
                    request.params, request.stops, session=slot, ignore_eos=request.ignore_eos,
                )  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - reported to its client
                self._free.append(slot)
                request.push(exc)
                continue
            joined.append(_Active(request, slot, gen))
        self._active += joined
        return joined

    def _finish(self, a: _Active, error: BaseException | None = None) -> None:
        self._active.remove(a)
        try:
            a.gen.close()  # (the slot learns the tokens its cache holds)
        finally:
            a.slot._settle(a.request.text, "".join(a.reply), a.last if error is None else None)
            with self._cond:
                self._free.append(a.slot)
            a.request.push(error)

    def _emit(self, a: _Active, token: int, logits: np.ndarray) -> None:
        """The piece of the token ``a`` sampled (from ``logits``), to its client."""
        piece = a.gen.add(token)
        if a.request.logprobs is not None:
            piece = _scored(piece, token, logits, a.request.logprobs)
        a.reply.append(piece.text)
        a.last = piece
        a.request.push(piece)
        if a.gen.finished:
            self._finish(a)
        else:
            a.pending = token

    def _prefill(self, a: _Active, budget: int | None) -> int:
        """The next ``budget`` tokens (None: all) of a joining generation's prompt, and its
        first token once the prompt is in; returns the tokens prefilled."""
        if a.request.cancelled.is_set() or a.gen.finished:  # (max_tokens 0: nothing to say)
            self._finish(a)
            return 0
        todo = a.gen.todo
        end = len(todo) if budget is None else min(len(todo), a.prefilled + budget)
        try:
            chunk = np.asarray([todo[a.prefilled : end]], np.int64)
            logits = self.model(chunk, cache=a.gen.cache, last_only=True)[:, -1]
            a.prefilled = end
            if end < len(todo):
                return len(chunk[0])
            a.gen.prefilled()
            token = int(a.gen.sampler(logits)[0])
        except Exception as exc:  # noqa: BLE001 - reported to its client; the server goes on
            self._finish(a, exc)
            return 0
        self._emit(a, token, logits[0])
        return len(chunk[0])

    def _prefill_step(self) -> None:
        """Prompts into their caches, oldest first: at most ``prefill_chunk`` tokens while
        other generations decode, else the waiting prompts whole."""
        decoding = any(a.pending is not None for a in self._active)
        budget = self.prefill_chunk if decoding else None
        for a in [a for a in self._active if a.pending is None]:
            if budget is not None and budget <= 0:
                break
            done = self._prefill(a, budget)
            if budget is not None:
                budget -= done

    def _decode(self) -> None:
        """One batched step of every running generation that has a token to feed."""
        for a in [a for a in self._active if a.request.cancelled.is_set()]:
            self._finish(a)
        batch = [a for a in self._active if a.pending is not None]
        if not batch:
            return
        tokens = np.array([a.pending for a in batch], np.int64)
        try:
            logits = self.model.decode(tokens, [a.gen.cache for a in batch])
        except Exception as exc:  # noqa: BLE001 - reported to their clients
            for a in batch:
                self._finish(a, exc)
            return
        for i, a in enumerate(batch):
            a.gen.fed(int(tokens[i]))
            a.pending = None
            self._emit(a, int(a.gen.sampler(logits[i : i + 1])[0]), logits[i])

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._active and not self._waiting and not self._closing:
                    self._cond.wait()
                if self._closing and not self._active and not self._waiting:
                    return
                self._admit()
            self._prefill_step()
            self._decode()
