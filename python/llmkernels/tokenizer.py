"""Text in and out: a tokenizer for a model directory, as transformers reads it.

:class:`Tokenizer` wraps the ``tokenizers`` library's ``tokenizer.json`` (the same Rust
tokenizer transformers' fast tokenizers run) and adds what lives beside it:

* the special tokens (``bos_token``, ``eos_token``, ``pad_token``, ``unk_token``) of
  ``tokenizer_config.json`` / ``special_tokens_map.json``;
* the chat template (``chat_template.jinja``, else ``tokenizer_config.json``'s
  ``chat_template``) rendered with ``jinja2`` exactly as transformers renders it: a sandboxed
  environment with ``trim_blocks``/``lstrip_blocks``, ``raise_exception``, a ``tojson`` that
  does not escape HTML, ``strftime_now``, and the special tokens passed as variables; the
  rendered text is tokenized without adding special tokens (the template holds them);
* the EOS ids and sampling defaults of ``generation_config.json``.

BOS handling is the ``tokenizer.json`` post-processor's (as in transformers): ``encode(text)``
adds what it adds, ``encode(text, add_special_tokens=False)`` adds nothing.

Files are opened first and checked after (a FIFO or device in their place is refused, never
waited on), with size limits; errors read ``"[load] <file>: <problem>"``.
"""

from __future__ import annotations

import json
import numbers
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from ._files import read_small

__all__ = ["Tokenizer", "TokenizerError"]

_MAX_TOKENIZER_BYTES = 512 << 20
_MAX_CONFIG_BYTES = 64 << 20
_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")


class TokenizerError(ValueError):
    """A missing or malformed tokenizer file: ``"[load] <file>: <problem>"``."""


def _err(file: str, problem: str) -> TokenizerError:
    return TokenizerError(f"[load] {file}: {problem}")


def _read_json(path: str, *, required: bool) -> Any:
    if not required and not os.path.lexists(path):
        return None
    raw = read_small(path, _MAX_CONFIG_BYTES, lambda problem: _err(path, problem))
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _err(path, f"not valid JSON ({exc})") from None


def _require(name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise ImportError(
            f"[load] the text API needs the '{name}' package: pip install 'llmkernels[text]' "
            f"(or pip install {name})"
        ) from None


def _token_content(value: Any) -> str | None:
    """A special token as saved by transformers: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


@lru_cache(maxsize=16)
def _compile_template(template: str) -> Any:
    """The template compiled in transformers' environment (chat_template_utils)."""
    _require("jinja2")
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        # jinja's own tojson escapes HTML characters; transformers' does not
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    class GenerationTag(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` (assistant masks in transformers):
        rendered as its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
                lineno
            )

        def _body(self, caller: Any) -> str:
            return caller()

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )

    class TemplateDict:
        """``dict`` for templates, without attribute access to the type (as transformers)."""

        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        """``namespace`` refusing underscore attributes (no way to CPython internals)."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja's signature trick
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot store underscore-prefixed attributes ({name!r})"
                )

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(template)


def _plain(value: Any) -> Any:
    """Template inputs rebuilt from plain JSON types (as transformers does: the sandbox only
    sees data, never objects with methods)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):  # NumPy scalars
        return _plain(value.item())
    return f"<{type(value).__name__}>"


class Tokenizer:
    """A model directory's tokenizer: ``encode``, ``decode``, ``apply_chat_template``.

    Build it with :meth:`from_pretrained` (or get it from :func:`llmkernels.load`).

    Attributes:
        eos_token_ids: every id that ends a generation (the tokenizer's EOS and
            ``generation_config.json``'s ``eos_token_id``, which may be a list).
        bos_token_id, pad_token_id, unk_token_id: ``None`` when the tokenizer has none.
        chat_template: the Jinja template, or ``None``.
        generation_config: ``generation_config.json`` as a dict (empty when absent).

    Examples:
        >>> import tempfile, llmkernels as lk
        >>> from llmkernels.text import write_tiny_model
        >>> tok = lk.Tokenizer.from_pretrained(write_tiny_model(tempfile.mkdtemp()))
        >>> ids = tok.encode("Hi 世界")  # the post-processor adds <s>
        >>> ids[0] == tok.bos_token_id, tok.decode(ids), tok.decode(ids, skip_special_tokens=True)
        (True, '<s>Hi 世界', 'Hi 世界')
        >>> tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
        '<s><|user|>\\nHi<|end|>\\n<|assistant|>\\n'
    """

    def __init__(
        self,
        tokenizer: Any,
        config: Mapping[str, Any] | None = None,
        generation_config: Mapping[str, Any] | None = None,
        chat_template: str | None = None,
    ) -> None:
        self._tok = tokenizer
        self.config = dict(config or {})
        self.generation_config = dict(generation_config or {})
        template = chat_template if chat_template is not None else self.config.get("chat_template")
        self._tool_template: str | None = None
        if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            if not isinstance(named.get("default"), str):
                raise TokenizerError(
                    "[load] tokenizer_config.json: chat_template is a list of templates with no "
                    "'default' one"
                )
            template = named["default"]
            tool = named.get("tool_use")
            self._tool_template = tool if isinstance(tool, str) else None
        if template is not None and not isinstance(template, str):
            raise TokenizerError(
                f"[load] tokenizer_config.json: chat_template must be a string or a list of "
                f"named templates, got {type(template).__name__}"
            )
        self.chat_template: str | None = template
        self.special_tokens: dict[str, str] = {}
        for name in _SPECIAL:
            value = self.config.get(name)
            content = _token_content(value)
            if content is not None:
                self.special_tokens[name] = content
            elif value is not None:
                raise TokenizerError(
                    f"[load] tokenizer_config.json / special_tokens_map.json: {name} must be "
                    "a string or an AddedToken "
                    f"dict (with a 'content' string), got {value!r:.60}"
                )
        self.bos_token_id = self._id_of("bos_token")
        self.pad_token_id = self._id_of("pad_token")
        self.unk_token_id = self._id_of("unk_token")
        eos: list[int] = []
        tok_eos = self._id_of("eos_token")
        if tok_eos is not None:
            eos.append(tok_eos)
        gen_eos = self.generation_config.get("eos_token_id")
        for value in gen_eos if isinstance(gen_eos, list) else [gen_eos]:
            if type(value) is int and value >= 0 and value not in eos:
                eos.append(value)
        self.eos_token_ids: list[int] = eos
        self.eos_token_id = eos[0] if eos else None
        self.clean_up_tokenization_spaces = bool(
            self.config.get("clean_up_tokenization_spaces", False)
        )

    def _id_of(self, name: str) -> int | None:
        content = self.special_tokens.get(name)
        return None if content is None else self._tok.token_to_id(content)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Read ``tokenizer.json`` (required), ``tokenizer_config.json``,
        ``special_tokens_map.json``, ``chat_template.jinja`` and ``generation_config.json``
        (optional) from a directory."""
        RustTokenizer = _require("tokenizers").Tokenizer

        directory = os.fspath(path)
        file = os.path.join(directory, "tokenizer.json")
        if not os.path.lexists(file):
            raise TokenizerError(
                f"[load] {directory}: no tokenizer.json (only fast-tokenizer files are "
                "supported; a directory saved by transformers' save_pretrained has one)"
            )
        raw = read_small(file, _MAX_TOKENIZER_BYTES, lambda problem: _err(file, problem))
        try:
            tok = RustTokenizer.from_str(raw.decode("utf-8"))
        except Exception as exc:  # the Rust parser's errors are plain Exceptions
            raise _err(file, f"not a valid tokenizers file ({str(exc)[:200]})") from None
        config = _read_json(os.path.join(directory, "tokenizer_config.json"), required=False)
        special = _read_json(os.path.join(directory, "special_tokens_map.json"), required=False)
        gen = _read_json(os.path.join(directory, "generation_config.json"), required=False)
        for name, value in (
            ("tokenizer_config.json", config),
            ("special_tokens_map.json", special),
            ("generation_config.json", gen),
        ):
            if value is not None and not isinstance(value, dict):
                raise _err(os.path.join(directory, name), "must hold a JSON object")
        # special_tokens_map.json's (non-null) tokens win over tokenizer_config.json's, as
        # transformers 5 reads them
        merged = dict(config or {})
        merged.update({k: v for k, v in (special or {}).items() if v is not None})
        template_file = os.path.join(directory, "chat_template.jinja")
        template = None
        if os.path.lexists(template_file):
            data = read_small(
                template_file, _MAX_CONFIG_BYTES, lambda problem: _err(template_file, problem)
            )
            try:
                template = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _err(template_file, f"not UTF-8 ({exc})") from None
        return cls(tok, merged, gen, template)

    # ---------------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Ids run from 0 to ``vocab_size - 1`` (added tokens included)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (with the post-processor's BOS etc. unless
        ``add_special_tokens=False``)."""
        if not isinstance(text, str):
            raise TypeError(f"[encode] text must be a str, got {type(text).__name__}")
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    @property
    def cleans_up(self) -> bool:
        """Whether decode applies transformers' ``clean_up_tokenization`` (the config asks for it
        and the model is not BPE: transformers 5 skips it for BPE, where it would strip real
        spaces before punctuation, unless told to corrupt the output anyway)."""
        if not self.clean_up_tokenization_spaces:
            return False
        force = self.config.get(
            "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"
        )
        return type(self._tok.model).__name__ != "BPE" or force is True

    def decode(
        self, ids: Any, skip_special_tokens: bool = False, clean_up_tokenization_spaces: Any = None
    ) -> str:
        """Text of ``ids`` (a sequence of ints or a 1-D array), as transformers decodes it
        (``clean_up_tokenization_spaces``: None for the tokenizer's own setting)."""
        raw = ids.tolist() if hasattr(ids, "tolist") else ids
        seq = []
        for i in raw:  # ints (NumPy's too), in the id range: 1.5 or -1 are errors, not ids
            if isinstance(i, bool) or not isinstance(i, numbers.Integral) or not 0 <= i < 2**32:
                raise ValueError(f"[decode] ids must be non-negative ints, got {i!r:.40}")
            seq.append(int(i))
        text = self._tok.decode(seq, skip_special_tokens=skip_special_tokens)
        clean = (
            self.cleans_up if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        )
        return clean_up_tokenization(text) if clean else text

    def stop_token_ids(self, stops: Sequence[str]) -> set[int]:
        """The tokens whose whole text is one of ``stops`` but which decoding skips (special
        tokens such as ``<|im_end|>``): the generated text never shows them, so a stop string
        naming one is matched on the token (as transformers' ``stop_strings`` does)."""
        out = set()
        for s in stops:
            i = self._tok.token_to_id(s)
            if i is not None and self._tok.decode([i], skip_special_tokens=True) == "":
                out.add(i)
        return out

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tokenize: bool = True,
        **kwargs: Any,
    ) -> list[int] | str:
        """Render a conversation (``[{"role": ..., "content": ...}, ...]``) with the chat
        template; token ids (``tokenize=False``: the text). ``kwargs`` reach the template (as
        in transformers, they override the special tokens of the same name)."""
        if self.chat_template is None:
            raise ValueError(
                "[apply_chat_template] this tokenizer has no chat template (no 'chat_template' "
                "in tokenizer_config.json and no chat_template.jinja): pass a plain prompt"
            )
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise TypeError("[apply_chat_template] messages must be a list of dicts")
        if not messages:
            raise ValueError("[apply_chat_template] messages is empty")
        chat = []
        for m in messages:
            if not isinstance(m, Mapping):
                raise TypeError(f"[apply_chat_template] each message must be a dict, got {m!r}")
            chat.append(_plain({k: v for k, v in m.items() if v is not None}))
        variables = {"tools": None, "documents": None, **self.special_tokens, **_plain(kwargs)}
        template = self.chat_template
        if variables["tools"] is not None and self._tool_template is not None:
            template = self._tool_template  # the list form's "tool_use" entry, as transformers
        # (jinja2's TemplateError -- raise_exception, syntax errors, the sandbox -- reaches the
        # caller as transformers lets it; the CLI reports it as an error)
        try:
            text = _compile_template(template).render(
                messages=chat, add_generation_prompt=bool(add_generation_prompt), **variables
            )
        except RecursionError:
            raise ValueError(
                "[apply_chat_template] the chat template recursed too deeply"
            ) from None
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, bos={self.special_tokens.get('bos_token')!r}"
            f", eos_ids={self.eos_token_ids}, chat_template={self.chat_template is not None})"
        )


def clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (when ``clean_up_tokenization_spaces``)."""
    for a, b in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(a, b)
    return text
