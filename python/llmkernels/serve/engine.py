"""The generation engine of the server: one thread runs the model for every request.

Each active generation holds a *slot*: a :class:`~llmkernels.ChatSession` whose KV cache of
``ctx`` positions is allocated when the engine starts, so the memory of all slots -- the KV
budget -- is fixed up front and no request can make the server allocate more cache. A step
advances every active generation by one token (its prefill on its first step), then finished
and cancelled generations leave and waiting ones join (continuous scheduling: a request does
not wait for a whole earlier generation to end). Requests beyond ``max_sequences`` wait in a
queue of ``queue_size``; past that, :meth:`Engine.submit` raises :class:`Overloaded`.

Every generation runs the same code as :func:`llmkernels.stream_generate` on its own KV cache,
so its tokens do not depend on the other requests: greedy output equals ``lk.generate`` run
alone. A slot keeps the tokens it holds when its generation ends; a later prompt that extends
them (the next turn of the same conversation, as an OpenAI client sends it: the whole
conversation again) is prefilled from where they end, as :class:`~llmkernels.ChatSession`
does in-process.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..nn import Transformer
from ..nn.sampling import Sampling
from ..text import ChatSession, GenerationResponse, stream_pieces
from ..tokenizer import Tokenizer

__all__ = ["Engine", "GenerationRequest", "Overloaded"]


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


@dataclasses.dataclass
class _Active:
    request: GenerationRequest
    slot: ChatSession
    pieces: Iterator[GenerationResponse]
    reply: list[str] = dataclasses.field(default_factory=list)
    last: GenerationResponse | None = None


class Engine:
    """Runs ``model`` on its own thread for up to ``max_sequences`` generations at a time, each
    in a slot with a KV cache of ``ctx`` positions (``kv_dtype``), with up to ``queue_size``
    requests waiting."""

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        *,
        max_sequences: int = 4,
        queue_size: int = 64,
        ctx: int = 4096,
        kv_dtype: Any = None,
    ) -> None:
        for name, value in (("max_sequences", max_sequences), ("queue_size", queue_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"[serve] {name} must be an int >= 1, got {value!r}")
        if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 2:
            raise ValueError(f"[serve] ctx must be an int >= 2, got {ctx!r}")
        self.model, self.tokenizer = model, tokenizer
        self.ctx, self.max_sequences, self.queue_size = ctx, max_sequences, queue_size
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
        the prompt extends first (its cache is reused), else the least recently used one."""
        if not self._free:
            return None
        for slot in self._free:
            ids = slot._continuation(request.text) if request.text is not None else None
            if ids is not None and len(ids) + max(request.max_tokens, 1) <= self.ctx:
                self._free.remove(slot)
                return slot, ids
            n = len(slot._cached)
            if 0 < n < len(request.ids) and request.ids[:n] == slot._cached:
                self._free.remove(slot)
                return slot, request.ids
        return self._free.popleft(), request.ids

    def _admit(self) -> None:
        while self._waiting and self._free:
            request = self._waiting.popleft()
            if request.cancelled.is_set():
                request.push(None)
                continue
            slot, ids = self._take_slot(request)  # type: ignore[misc]
            pieces = stream_pieces(
                "serve",
                self.model,
                self.tokenizer,
                ids,
                request.max_tokens,
                request.params,
                request.stops,
                session=slot,
            )
            self._active.append(_Active(request, slot, pieces))

    def _finish(self, a: _Active, error: BaseException | None = None) -> None:
        self._active.remove(a)
        try:
            a.pieces.close()  # (the slot learns the tokens its cache holds)
        finally:
            a.slot._settle(a.request.text, "".join(a.reply), a.last if error is None else None)
            with self._cond:
                self._free.append(a.slot)
            a.request.push(error)

    def _step(self, a: _Active) -> None:
        """One token of ``a`` (its prefill first)."""
        if a.request.cancelled.is_set():
            self._finish(a)
            return
        try:
            piece = next(a.pieces)
        except StopIteration:
            self._finish(a)
            return
        except Exception as exc:  # noqa: BLE001 - reported to its client; the server goes on
            self._finish(a, exc)
            return
        a.reply.append(piece.text)
        a.last = piece
        a.request.push(piece)
        if piece.finish_reason is not None:
            self._finish(a)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._active and not self._waiting and not self._closing:
                    self._cond.wait()
                if self._closing and not self._active and not self._waiting:
                    return
                self._admit()
                active = list(self._active)
            for a in active:
                self._step(a)
