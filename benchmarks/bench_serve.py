"""Serving throughput: aggregate generated tokens/s and time to first token at 1, 4 and 16
concurrent streams, ``llmkernels serve`` against llama.cpp's ``llama-server`` on the same
weights, over HTTP on 127.0.0.1.

Each (server, thread count) runs in its own process with as many sequences as the largest
stream count (``--max-sequences`` / llama-server's ``-np``, continuous batching on both). Every
request is a streamed ``/v1/completions`` call with a fixed prompt of ``--prompt-tokens`` token
ids (a different one for every request of a run, so neither server answers from its prompt
cache: the time to first token includes the prompt's prefill), greedy, ``ignore_eos`` and
``--max-tokens`` new tokens, so both servers generate the same number of tokens. Per stream
count: the aggregate rate is all the generated tokens over the wall time from the first
request sent to the last reply done; the aggregate decode rate is the sum over the streams of
each one's tokens after the first over the time from its first token to its last (1 / its time
per output token, as vLLM's benchmark defines it); the time to first token is the median over
the requests of send -> first streamed token. Rounds repeat the stream counts in turn; the medians
over rounds are reported, with our rate over our single stream's and over llama-server's at
the same stream count (above 1: we are faster).

The model: an HF directory (``--model``; a tokenizer.json is written for it if it has none)
and the GGUF of the same weights for llama-server (``--gguf``: bench_real_size.py's workdir
has them, converted by llama.cpp's own tools). Without ``--llama-server`` (the binary, built
from the vendored llama.cpp's ``tools/server``) only ours runs. ``--quick``: the package's
example model, 1 round, small counts (a smoke run).

    python benchmarks/bench_serve.py --model /tmp/llmk-real-size/tinyllama-22 --dtype int8 \\
        --gguf /tmp/llmk-real-size/gguf-22/model-Q8_0.gguf --llama-server PATH/llama-server \\
        [--threads 1,2] [--streams 1,4,16] [--rounds 2] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_tokenizer(model_dir: Path, vocab: int) -> None:
    """A word-level tokenizer.json of ``vocab`` tokens for a checkpoint that has none (the
    requests send token ids: only the decoding of the replies uses it)."""
    if (model_dir / "tokenizer.json").exists():
        return
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(model_dir / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))


class Server:
    """A server process on 127.0.0.1, up once ``/health`` answers."""

    def __init__(self, cmd: list[str], port: int, env: dict[str, str], timeout: float) -> None:
        import httpx  # (before the process starts: a missing module leaves nothing running)

        self.port = port
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited: {self.proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{cmd[0]} did not come up in {timeout:.0f} s")
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stderr.close()  # type: ignore[union-attr]


def one_request(port: int, prompt: list[int], max_tokens: int, t0: float, out: dict) -> None:
    """A streamed completion: out gets the time of its first token and its end (from t0) and
    the tokens generated."""
    import httpx

    body = {
        "model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    tokens, chunks, first, last = None, 0, None, None
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body,
                      timeout=600) as r:  # fmt: skip
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:500]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]
            if obj.get("choices"):
                chunks += 1
                last = time.perf_counter() - t0
                if first is None:
                    first = last
    out.update(ttft=first, last=last, end=time.perf_counter() - t0, tokens=tokens or chunks)


def run_streams(port: int, prompts: list[list[int]], max_tokens: int) -> dict[str, float]:
    """``len(prompts)`` concurrent streams: aggregate tokens/s, aggregate decode tokens/s and
    the median time to first token."""
    outs: list[dict] = [{} for _ in prompts]
    t0 = time.perf_counter()
    threads = [
        threading.Thread(target=one_request, args=(port, p, max_tokens, t0, o))
        for p, o in zip(prompts, outs, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any("end" not in o for o in outs):
        raise RuntimeError("a request failed")
    wall = max(o["end"] for o in outs)
    # each stream's decode rate after its first token (1 / its time per output token), summed
    decode = sum((o["tokens"] - 1) / (o["last"] - o["ttft"]) for o in outs
                 if o["tokens"] > 1 and o["last"] > o["ttft"])  # fmt: skip
    return {
        "tok_s": sum(o["tokens"] for o in outs) / wall,
        "decode_tok_s": decode,
        "ttft_s": statistics.median(o["ttft"] for o in outs),
        "tokens": sum(o["tokens"] for o in outs),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="HF model directory (ours)")
    p.add_argument("--dtype", default=None, help="our weights dtype (default: checkpoint's)")
    p.add_argument("--gguf", default=None, help="the same weights for llama-server")
    p.add_argument("--llama-server", default=None, help="llama-server binary (peer)")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--streams", default="1,4,16")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="example model, small counts")
    p.add_argument("--out", default=None, help="write serve.json / serve.md here")
    args = p.parse_args(argv)

    import harness
    import llmkernels as lk

    if args.quick:
        args.model = args.model or lk.example_model()
        args.streams, args.rounds, args.max_tokens, args.prompt_tokens = "1,4", 1, 8, 16
    if not args.model:
        p.error("--model is required (or --quick)")
    model_dir = Path(args.model)
    config = json.loads((model_dir / "config.json").read_text())
    vocab = int(config["vocab_size"])
    ensure_tokenizer(model_dir, vocab)
    streams = [int(s) for s in args.streams.split(",")]
    thread_counts = [int(t) for t in args.threads.split(",")]
    n_seq = max(streams)
    ctx = args.prompt_tokens + args.max_tokens + 8
    peer = args.llama_server and args.gguf
    def prompts(first: int, n: int) -> list[list[int]]:
        """Prompts number first .. first + n - 1: every request of a server's run has its own
        (from the first token on), so neither server answers from a prompt it has cached
        (llama-server reuses a slot's KV for a repeated prompt: its TTFT was then one token's)."""
        return [[3 + (97 * s + 13 * i + s * s) % (vocab - 3) for i in range(args.prompt_tokens)]
                for s in range(first, first + n)]  # fmt: skip

    def ours(t: int) -> Server:
        port = free_port()
        cmd = [sys.executable, "-m", "llmkernels", "serve", "--model", str(model_dir),
               "--port", str(port), "--max-sequences", str(n_seq), "--ctx", str(ctx),
               "--queue-size", str(4 * n_seq), "--model-id", "m"]  # fmt: skip
        if args.dtype:
            cmd += ["--dtype", args.dtype]
        env = {**os.environ, "LLMKERNELS_NUM_THREADS": str(t), "LLMKERNELS_API_KEY": ""}
        return Server(cmd, port, env, timeout=900)

    def llama(t: int) -> Server:
        port = free_port()
        cmd = [args.llama_server, "-m", args.gguf, "--host", "127.0.0.1", "--port", str(port),
               "-np", str(n_seq), "-c", str(n_seq * ctx), "-t", str(t), "-tb", str(t),
               "--cont-batching", "--no-warmup"]  # fmt: skip
        return Server(cmd, port, dict(os.environ), timeout=900)

    impls = {"ours": ours, **({"llama-server": llama} if peer else {})}
    results: dict = {}
    for t in thread_counts:
        for name, start in impls.items():
            server = start(t)
            try:
                run_streams(server.port, prompts(0, 1), 4)  # warm-up
                used = 1
                for _ in range(args.rounds):
                    for n in streams:
                        res = run_streams(server.port, prompts(used, n), args.max_tokens)
                        used += n
                        results.setdefault(f"{t}/{n}/{name}", []).append(res)
                        print(f"{t}T {n:2d} streams {name}: {res['tok_s']:.1f} tok/s, "
                              f"decode {res['decode_tok_s']:.1f} tok/s, "
                              f"TTFT {1e3 * res['ttft_s']:.0f} ms", flush=True)  # fmt: skip
            finally:
                server.stop()
    rows = []
    for t in thread_counts:
        one = results.get(f"{t}/1/ours")
        single = statistics.median(x["tok_s"] for x in one) if one else None
        single_dec = statistics.median(x["decode_tok_s"] for x in one) if one else None
        for n in streams:
            row: dict[str, Any] = {"threads": t, "streams": n}
            for name in impls:
                rs = results[f"{t}/{n}/{name}"]
                row[name] = {
                    "tok_s": statistics.median(x["tok_s"] for x in rs),
                    "decode_tok_s": statistics.median(x["decode_tok_s"] for x in rs),
                    "ttft_s": statistics.median(x["ttft_s"] for x in rs),
                }
            if single:
                row["x_our_single"] = row["ours"]["tok_s"] / single
            if single_dec:
                row["x_our_single_decode"] = row["ours"]["decode_tok_s"] / single_dec
            if peer:
                row["x_peer"] = row["ours"]["tok_s"] / row["llama-server"]["tok_s"]
                row["x_peer_decode"] = (
                    row["ours"]["decode_tok_s"] / row["llama-server"]["decode_tok_s"]
                )
            rows.append(row)
    report = {
        "machine": harness.machine_info(),
        "cpu_flags": harness.cpu_flags(),
        "model": str(model_dir),
        "dtype": args.dtype,
        "gguf": args.gguf,
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "rows": rows,
        "python": platform.python_version(),
    }
    md = render(report, peer=bool(peer))
    print(md)
    if args.out:
        harness.write_report(Path(args.out), "serve", report, md)
    return 0


def render(report: dict[str, Any], peer: bool) -> str:
    import harness

    lines = [
        "# Serving: aggregate tokens/s and time to first token",
        "",
        *harness.machine_lines(report["machine"]),
        f"CPU flags: {' '.join(report['cpu_flags'])}",
        "",
        f"{report['model']} ({report['dtype'] or 'as stored'}) against {report['gguf']}; "
        f"{report['prompt_tokens']}-token prompts, {report['max_tokens']} new tokens each "
        f"(greedy, ignore_eos), medians of {report['rounds']} rounds.",
        "",
    ]
    header = ["threads", "streams", "ours tok/s", "x our 1 stream", "ours decode tok/s",
              "decode x our 1 stream", "ours TTFT"]  # fmt: skip
    if peer:
        header += ["llama-server tok/s", "llama-server decode tok/s", "llama-server TTFT",
                   "x llama-server", "decode x llama-server"]  # fmt: skip
    rows = []
    for r in report["rows"]:
        ours = r["ours"]
        row = [str(r["threads"]), str(r["streams"]), harness.fmt(ours["tok_s"], 1),
               harness.fmt(r.get("x_our_single")), harness.fmt(ours.get("decode_tok_s"), 1),
               harness.fmt(r.get("x_our_single_decode")),
               f"{1e3 * ours['ttft_s']:.0f} ms"]  # fmt: skip
        if peer:
            peer_r = r["llama-server"]
            row += [harness.fmt(peer_r["tok_s"], 1), harness.fmt(peer_r.get("decode_tok_s"), 1),
                    f"{1e3 * peer_r['ttft_s']:.0f} ms", harness.fmt(r["x_peer"]),
                    harness.fmt(r.get("x_peer_decode"))]  # fmt: skip
        rows.append(row)
    lines += harness.md_table(header, rows)
    lines += [
        "",
        "tok/s: every generated token over the wall time from the first request sent to the "
        "last reply done (prefills included). decode tok/s: the sum over the streams of each "
        "one's rate after its first token, (tokens - 1) / (last token - first token) -- 1 / "
        "its time per output token, which includes the steps other streams' prefills took.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
