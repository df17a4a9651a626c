"""Text out of generated tokens: incremental decoding that never shows half a character or a
word transformers would still change (:class:`Detokenizer`), and stop strings cut out of the
stream (:class:`StopText`)."""

from __future__ import annotations

from .tokenizer import Tokenizer, clean_up_tokenization


class Detokenizer:
    """Incremental decoding of one sequence: each call returns the new text of the tokens so
    far. The suffix after a moving offset is decoded with a few tokens of context before it,
    so decoders that treat a leading space or a byte fallback specially see the same thing as
    when decoding everything; a piece ending in U+FFFD (a UTF-8 character split across
    tokens) is held back until the character is complete."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.prefix = 0  # start of the decoded window (context)
        self.read = 0  # tokens up to here are emitted
        # transformers' clean_up_tokenization (" ." -> ".", " n't" -> "n't", ...) removes a
        # space when the text after it arrives: the raw text is decoded piece by piece, the
        # cleaned text of all of it released but for its last 4 characters (the longest
        # pattern), which a later piece may still change
        self.clean = tokenizer.cleans_up
        self.raw = ""
        self.emitted = 0  # characters of the cleaned text released

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    def _cleaned(self, piece: str, final: bool) -> str:
        if not self.clean:
            return piece
        self.raw += piece
        text = clean_up_tokenization(self.raw)
        end = len(text) if final else max(len(text) - 4, self.emitted)
        out, self.emitted = text[self.emitted : end], end
        return out

    def add(self, token: int) -> str:
        return self._cleaned(self._add(token), final=False)

    def flush(self) -> str:
        """What is held back (an incomplete character decodes to U+FFFD, as decode does)."""
        return self._cleaned(self._flush(), final=True)

    def _add(self, token: int) -> str:
        self.tokens.append(token)
        before = self._decode(self.tokens[self.prefix : self.read])
        text = self._decode(self.tokens[self.prefix :])
        if len(text) > len(before) and not text.endswith("\ufffd"):
            piece = text[len(before) :]
            self.prefix, self.read = max(self.read - 4, 0), len(self.tokens)
            if self.read - self.prefix > 8:
                self.prefix = self.read - 4
            return piece
        return ""

    def _flush(self) -> str:
        before = self._decode(self.tokens[self.prefix : self.read])
        text = self._decode(self.tokens[self.prefix :])
        self.read = len(self.tokens)
        return text[len(before) :] if text.startswith(before) else ""


class StopText:
    """The generated text, released only where no stop string can still begin."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.text = ""
        self.released = 0
        self.longest = max((len(s) for s in stops), default=0)

    def add(self, piece: str) -> tuple[str, bool]:
        """Append ``piece``; return the text safe to release and whether a stop string was
        found (the text is then cut before it)."""
        start = max(0, len(self.text) - self.longest + 1)
        self.text += piece
        if self.stops:
            hits = [i for s in self.stops if (i := self.text.find(s, start)) >= 0]
            if hits:
                cut = min(hits)
                out = self.text[self.released : cut]
                self.released = cut
                self.text = self.text[:cut]
                return out, True
        keep = 0
        for s in self.stops:  # a suffix that may grow into a stop string is held back
            for n in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        end = len(self.text) - keep
        out = self.text[self.released : end] if end > self.released else ""
        self.released = max(self.released, end)
        return out, False

    def rest(self) -> str:
        out = self.text[self.released :]
        self.released = len(self.text)
        return out


def late_text(detok: Detokenizer, stop_text: StopText) -> str:
    """Text held back by the detokenizer when an EOS ends the generation."""
    tail, stopped = stop_text.add(detok.flush())
    return tail if stopped else tail + stop_text.rest()
