"""Command line: ``llmkernels info | generate | chat | serve`` (also ``python -m llmkernels``).

``info`` prints :func:`llmkernels.build_info`: version, SIMD path, threads and BLAS.

``generate --model DIR --prompt TEXT`` loads an HF model directory (:func:`llmkernels.load`),
streams the generated text to stdout (the prompt goes through the chat template when the
tokenizer has one, unless ``--ignore-chat-template``), then prints the prompt and generation
speeds and the peak memory to stderr. ``chat --model DIR`` is a REPL (``/reset`` starts over,
``q``, ``exit`` or end of input quits) that keeps the KV cache across turns: each turn prefills
only the new tokens (:class:`llmkernels.ChatSession`). Both show a progress bar while loading
a large checkpoint on a terminal. ``serve --model DIR`` runs an OpenAI-compatible HTTP server
(:mod:`llmkernels.serve`; the ``serve`` extra) on 127.0.0.1:8000 until Ctrl-C or SIGTERM, which
let the running generations finish first.

The seed demo and the side-by-side timing table are scripts of the source tree
(``examples/demo.py``, ``make demo``), as are the benchmarks (``benchmarks/``, ``make bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import numpy as np

# --------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------


def _info(lk: Any, as_json: bool = False) -> None:
    info = lk.build_info()
    if isinstance(info, dict):
        info = {**info, "numpy": np.__version__, "python": sys.version.split()[0]}
        if as_json:
            print(json.dumps(info, indent=1, default=str))
            return
        width = max(len(str(k)) for k in info)
        for k, v in info.items():
            print(f"{k!s:<{width}}  {v}")
    else:
        print(info)


# (option, keyword argument of stream_generate, type, help); each defaults to None, which is
# generation_config.json's value
_SAMPLING_OPTIONS = (
    ("--temp", "temperature", float, "temperature (0: greedy; default: generation_config.json)"),
    ("--top-p", "top_p", float, "nucleus sampling mass"),
    ("--top-k", "top_k", int, "sample among the k best tokens"),
    ("--min-p", "min_p", float, "min-p sampling threshold"),
    ("--repetition-penalty", "repetition_penalty", float,
     "transformers' repetition penalty (> 1 discourages repeats)"),
    ("--seed", "seed", int, "sampling seed"),
)  # fmt: skip


def _text_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        "-m",
        required=True,
        help="HF model directory (config.json, *.safetensors, tokenizer.json)",
    )
    p.add_argument("--max-tokens", "-n", type=int, default=256, help="tokens to generate")
    p.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=None,
        help="refuse a prompt (chat: the whole conversation) of more tokens than this (default "
        "2**20, llmkernels.text.MAX_PROMPT_TOKENS); one over the model's "
        "max_position_embeddings runs with a warning",
    )
    for flag, _, kind, text in _SAMPLING_OPTIONS:
        p.add_argument(flag, type=kind, default=None, help=text)
    p.add_argument(
        "--dtype",
        default=None,
        choices=("float32", "bfloat16", "float16", "int8", "int4"),
        help="weights dtype (default: the checkpoint's; a bf16 checkpoint stays bf16; int8 / "
        "int4 quantize the projections while loading, groups of 32)",
    )
    p.add_argument(
        "--kv-dtype",
        default=None,
        choices=("float32", "bfloat16", "float16"),
        help="KV cache dtype (default float32; bf16 / f16 halve the cache's memory)",
    )


def _sampling_args(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling keyword arguments of ``stream_generate`` / ``ChatSession.send`` (and
    ``max_prompt_tokens`` when given)."""
    out = {
        name: getattr(args, flag[2:].replace("-", "_")) for flag, name, _, _ in _SAMPLING_OPTIONS
    }
    if args.max_prompt_tokens is not None:
        out["max_prompt_tokens"] = args.max_prompt_tokens
    return out


def _stats(r: Any, prefilled: int | None = None) -> str:
    prompt = r.prompt_tokens if prefilled is None else prefilled
    return (
        f"Prompt: {prompt} tokens, {r.prompt_tps:.1f} tokens-per-sec\n"
        f"Generation: {r.generation_tokens} tokens, {r.generation_tps:.1f} tokens-per-sec\n"
        f"Peak memory: {r.peak_memory:.3f} GB"
    )


def _echo(pieces: Callable[[], Iterable[Any]]) -> tuple[bool, Any]:
    """Prints the text of each piece of ``pieces()`` as it comes, then a newline. Returns
    ``(True, the last piece or None)``, or ``(False, None)`` (the error printed) if the
    arguments were refused."""
    last = None
    try:
        for r in pieces():
            print(r.text, end="", flush=True)
            last = r
    except BrokenPipeError:  # stdout closed: main() ends quietly
        raise
    except _user_errors() as exc:
        print(f"error: {exc}", file=sys.stderr)
        return False, None
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":  # pyo3's (tokenizers): a bad tokenizer.json
            raise
        print(f"error: the tokenizer failed: {str(exc)[:200]}", file=sys.stderr)
        return False, None
    print(flush=True)
    return True, last


def _user_errors() -> tuple[type[BaseException], ...]:
    """What a bad argument, file or template raises (reported as ``error:``, no traceback)."""
    errors: tuple[type[BaseException], ...] = (ValueError, TypeError, OSError)
    try:
        from jinja2 import TemplateError  # a chat template's raise_exception, syntax errors
    except ImportError:
        return errors
    return (*errors, TemplateError)


def _text_command(lk: Any, args: argparse.Namespace) -> int:
    try:
        model, tokenizer = lk.load(args.model, dtype=args.dtype)
    except (ValueError, OSError, ImportError) as exc:  # (ImportError: names the [text] extra)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "generate":
        try:
            text = sys.stdin.read() if args.prompt == "-" else args.prompt
            text.encode("utf-8")  # (a C.UTF-8 locale reads bad bytes as lone surrogates)
        except UnicodeError as exc:
            print(f"error: the prompt is not UTF-8 text ({exc})", file=sys.stderr)
            return 2
        prompt: Any = text
        if tokenizer.chat_template is not None and not args.ignore_chat_template:
            prompt = [{"role": "user", "content": text}]
        ok, last = _echo(
            partial(
                lk.stream_generate,
                model,
                tokenizer,
                prompt,
                args.max_tokens,
                stop=args.stop,
                kv_dtype=args.kv_dtype,
                **_sampling_args(args),
            )
        )
        if last is not None:
            print("==========\n" + _stats(last), file=sys.stderr, flush=True)
        return 0 if ok else 2
    session = lk.ChatSession(model, tokenizer, system=args.system, kv_dtype=args.kv_dtype)
    if tokenizer.chat_template is None:
        print("error: this tokenizer has no chat template", file=sys.stderr)
        return 2
    print("llmkernels chat: type a message ('/reset' starts over, 'q' quits)", file=sys.stderr)
    while True:
        try:
            line = input(">> ")
        except EOFError:
            print()
            return 0
        except UnicodeDecodeError as exc:
            print(f"error: the input is not UTF-8 text ({exc})", file=sys.stderr)
            continue
        try:
            line.encode("utf-8")
        except UnicodeEncodeError as exc:
            print(f"error: the input is not UTF-8 text ({exc})", file=sys.stderr)
            continue
        if line.strip() in ("q", "exit", "quit"):
            return 0
        if line.strip() == "/reset":
            session = lk.ChatSession(model, tokenizer, system=args.system, kv_dtype=args.kv_dtype)
            continue
        if not line.strip():
            continue
        try:
            ok, last = _echo(partial(session.send, line, args.max_tokens, **_sampling_args(args)))
        except KeyboardInterrupt:
            # Ctrl-C during a reply stops the reply, not the chat: the reply so far joins the
            # conversation (ChatSession), a turn interrupted before its reply leaves it as it was
            print("\n[interrupted]", file=sys.stderr, flush=True)
            continue
        if not ok:
            return 2
        if last is not None:
            print(_stats(last, session.prefilled), file=sys.stderr, flush=True)


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", required=True, help="HF model directory")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument(
        "--dtype",
        default=None,
        choices=("float32", "bfloat16", "float16", "int8", "int4"),
        help="weights dtype (default: the checkpoint's)",
    )
    p.add_argument(
        "--kv-dtype", default=None, choices=("float32", "bfloat16", "float16"),
        help="KV cache dtype (default float32)",
    )  # fmt: skip
    p.add_argument(
        "--max-sequences", type=int, default=4, help="generations run at once (default 4)"
    )
    p.add_argument(
        "--queue-size", type=int, default=64,
        help="requests that may wait for a free sequence; more get HTTP 503 (default 64)",
    )  # fmt: skip
    p.add_argument(
        "--ctx", type=int, default=None,
        help="tokens of each sequence's KV cache, prompt + reply (default: the model's "
        "max_position_embeddings, at most 4096); every cache is allocated at start",
    )  # fmt: skip
    p.add_argument(
        "--prefill-chunk", type=int, default=256,
        help="prompt tokens prefilled per step while other sequences decode (default 256)",
    )  # fmt: skip
    p.add_argument(
        "--api-key", default=os.environ.get("LLMKERNELS_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default: $LLMKERNELS_API_KEY; none: open)",
    )  # fmt: skip
    p.add_argument(
        "--model-id", default=None,
        help="the model name clients give (default: the directory's name)",
    )  # fmt: skip


def _serve_command(lk: Any, args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from llmkernels.serve import create_app
    except ImportError as exc:
        print(
            f"error: `serve` needs the serve extra ({exc}): pip install 'llmkernels[serve]'",
            file=sys.stderr,
        )
        return 2
    try:
        model, tokenizer = lk.load(args.model, dtype=args.dtype)
        model_id = args.model_id or os.path.basename(os.path.normpath(args.model))
        app = create_app(
            model, tokenizer, model_id=model_id, max_sequences=args.max_sequences,
            queue_size=args.queue_size, ctx=args.ctx, kv_dtype=args.kv_dtype,
            api_key=args.api_key or None, prefill_chunk=args.prefill_chunk,
        )  # fmt: skip
    except (ValueError, OSError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(app, host=args.host, port=args.port, timeout_graceful_shutdown=30)
    return 0


def _prog() -> str:
    """The name the usage shows: how the command was run (the ``llmkernels`` script, or
    ``python -m llmkernels``)."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m llmkernels" if name in ("", "__main__.py", "-c") else name


def _version() -> str:
    import llmkernels

    return llmkernels.__version__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    parser = argparse.ArgumentParser(
        prog=_prog(),
        description="llmkernels: build info, text generation, chat and an OpenAI-compatible "
        "server for an HF model directory.",
    )
    parser.add_argument("--version", action="version", version=f"llmkernels {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    info_p = sub.add_parser("info", help="version, SIMD path, threads, BLAS (build_info())")
    info_p.add_argument("--json", action="store_true", help="print as JSON")
    gen_p = sub.add_parser("generate", help="generate text from a prompt with an HF model dir")
    _text_arguments(gen_p)
    gen_p.add_argument("--prompt", "-p", required=True, help="the prompt ('-': read stdin)")
    gen_p.add_argument(
        "--ignore-chat-template",
        action="store_true",
        help="tokenize the prompt as it is (default: as a user turn of the chat template, "
        "when the tokenizer has one)",
    )
    gen_p.add_argument(
        "--stop", action="append", default=None, help="stop string (may be repeated)"
    )
    chat_p = sub.add_parser("chat", help="chat REPL with an HF model dir (KV cache kept)")
    _text_arguments(chat_p)
    chat_p.add_argument("--system", default=None, help="system prompt")
    serve_p = sub.add_parser("serve", help="OpenAI-compatible HTTP server for an HF model dir")
    _serve_arguments(serve_p)
    args = parser.parse_args(argv)

    import llmkernels as lk

    try:
        if args.command == "info":
            _info(lk, as_json=args.json)
            return 0
        if args.command == "serve":
            return _serve_command(lk, args)
        return _text_command(lk, args)
    except KeyboardInterrupt:  # Ctrl-C: stop quietly, as a shell tool does
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): nothing more to write
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # (Python's flush at exit would raise again)
        return 0


if __name__ == "__main__":
    sys.exit(main())
