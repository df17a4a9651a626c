"""Checkpoint loading: peak memory and time of ``Transformer.from_pretrained``.

Targets: peak RSS while loading <= 1.3x the loaded model's size, and load time <= 2x the time
to read the checkpoint files once with the page cache warm. The load is
``from_pretrained(path)`` with the default ``dtype=None``: the checkpoint's precision is kept
(the bf16 checkpoint loads as a bf16 model, its bytes copied, not widened; the f32 one as
float32); the last column says which.

A synthetic LLaMA checkpoint (random weights, default ~124M parameters: 32000 x 768, 12
layers) is written in bf16 (how HF checkpoints ship) and in f32. Each load runs in a fresh
subprocess (so the peak RSS is the load's): VmHWM after the load is the peak RSS; the
baseline (interpreter, NumPy, llmkernels imported) is reported beside it. The file read time
is the best of a few reads of every file into one reused buffer, after a first read that
warms the page cache. Reads and loads are interleaved round by round and the median of the
per-round ratios is reported (the host is shared: single figures move by 2x). ``--old`` also
measures the previous path (the whole state dict read into NumPy arrays, a randomly
initialised model, then ``load_state_dict``).

    python benchmarks/bench_load.py [--layers 12 --dim 768 --vocab 32000] [--old]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CHILD = r"""
import json, sys, time
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
def hwm():
    return status("VmHWM")
import numpy as np
import llmkernels as lk
from llmkernels._checkpoint import load_pretrained
path, mode = sys.argv[1], sys.argv[2]
base = hwm()
t0 = time.perf_counter()
if mode.startswith("new"):  # "new" or "new:<dtype>" (converted while loading)
    dtype = mode.partition(":")[2] or None
    model = lk.Transformer.from_pretrained(path, dtype=dtype, progress=False)
    peak = hwm()
elif mode == "alloc":
    # only what the load spends building the model: the C++ weights are zero-filled vectors
    # (page faults), then left uninitialised by Python
    from llmkernels.nn.module import no_random_init
    from llmkernels._checkpoint import checkpoint_weight_dtype, read_pretrained
    cfg, located = read_pretrained(path)
    t0 = time.perf_counter()
    with no_random_init():
        model = lk.Transformer(cfg, dtype=checkpoint_weight_dtype(located))
    peak = hwm()
else:
    cfg, tensors = load_pretrained(path)
    model = lk.Transformer(cfg, seed=0)
    model.load_state_dict(tensors)
    del tensors
    peak = hwm()
t1 = time.perf_counter()
nbytes = sum(v.nbytes for k, v in model.state_dict().items()
             if not (k == "lm_head.weight" and model.config.tie_embeddings))
nbytes = getattr(model, "nbytes", nbytes)
print(json.dumps({"seconds": t1 - t0, "peak": peak, "base": base, "model_bytes": nbytes,
                  "rss_after": status("VmRSS"), "dtype": str(getattr(model, "dtype", "float32"))}))
"""


def write_checkpoint(d: Path, args: argparse.Namespace, bf16: bool) -> None:
    from llmkernels._config import ModelConfig, hf_key_shapes

    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": args.vocab,
        "hidden_size": args.dim,
        "intermediate_size": args.hidden,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "tie_word_embeddings": False,
    }
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    shapes = hf_key_shapes(ModelConfig.from_dict(cfg))
    rng = np.random.default_rng(0)
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    code, itemsize = ("BF16", 2) if bf16 else ("F32", 4)
    for name, shape in shapes.items():
        n = int(np.prod(shape)) * itemsize
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(d / "model.safetensors", "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for shape in shapes.values():
            x = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
            f.write((x.view(np.uint32) >> 16).astype(np.uint16).tobytes() if bf16 else x.tobytes())


def read_time(d: Path, fresh: bool, repeats: int = 3) -> float:
    """Best time to read every file once (page cache warm) into one reused buffer, or
    (``fresh``) into newly allocated memory, as a loader must (page faults included)."""
    files = [p for p in d.iterdir() if p.is_file()]
    size = max(p.stat().st_size for p in files)
    best = float("inf")
    buf = np.empty(size, np.uint8)
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        for p in files:
            if fresh:
                buf = np.empty(size, np.uint8)
            view = memoryview(buf)
            with open(p, "rb", buffering=0) as f:
                n = p.stat().st_size
                got = 0
                while got < n:
                    got += f.readinto(view[got:n])
        if i:  # the first read warms the page cache
            best = min(best, time.perf_counter() - t0)
        del view
    return best


def run_child(d: Path, mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(d), mode],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def measure(d: Path, mode: str, repeats: int) -> dict:
    """``repeats`` interleaved rounds of (read the files, load in a fresh process): this host is
    shared and noisy, so each load is divided by the read time of its own round and the
    median ratio is reported (with the median times and the highest peak)."""
    rounds = []
    for _ in range(repeats):
        t_read, t_fresh = read_time(d, fresh=False), read_time(d, fresh=True)
        r = run_child(d, mode)
        rounds.append((r["seconds"] / t_read, r["seconds"], t_read, t_fresh, r))
    rounds.sort(key=lambda x: x[0])
    ratio, seconds, t_read, t_fresh, r = rounds[len(rounds) // 2]
    r.update(
        ratio=ratio,
        seconds=seconds,
        read=t_read,
        fresh=t_fresh,
        peak=max(x[4]["peak"] for x in rounds),
        ratios=[round(x[0], 2) for x in rounds],
    )
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--old", action="store_true", help="also measure the previous load path")
    p.add_argument(
        "--dtypes",
        default="",
        help="also load the bf16 checkpoint converted to these dtypes (comma-separated, e.g. "
        "int8,int4,float32): the memory targets, RSS after loading <= 1.15x the "
        "weights + 100 MiB and peak <= 1.5x that",
    )
    args = p.parse_args()
    mib = 1 << 20
    print(
        "| checkpoint | path | file MiB | model MiB | read s | read fresh s | load s | "
        "model alloc s | load/read median (range) | peak RSS MiB | peak/model | (peak-base)/model "
        "| RSS after / (1.15 model + 100 MiB) | peak / (1.5 (1.15 model + 100 MiB)) | weights |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        for bf16 in (True, False):
            d = Path(tmp) / ("bf16" if bf16 else "f32")
            write_checkpoint(d, args, bf16)
            size = sum(f.stat().st_size for f in d.iterdir())
            modes = ["new", "old"] if args.old else ["new"]
            if bf16:
                modes += [f"new:{t}" for t in args.dtypes.split(",") if t]
            for mode in modes:
                r = measure(d, mode, args.repeats)
                m = r["model_bytes"]
                alloc = f"{measure(d, 'alloc', 1)['seconds']:.3f}" if mode == "new" else "-"
                budget = 1.15 * m + 100 * mib
                name = d.name if mode in ("new", "old") else f"{d.name} -> {mode[4:]}"
                path = "old" if mode == "old" else "new"
                print(
                    f"| {name} | {path} | {size / mib:.0f} | {m / mib:.0f} | {r['read']:.3f} | "
                    f"{r['fresh']:.3f} | {r['seconds']:.3f} | {alloc} | "
                    f"{r['ratio']:.2f} ({min(r['ratios']):.2f}-{max(r['ratios']):.2f}) | "
                    f"{r['peak'] / mib:.0f} | {r['peak'] / m:.2f} | "
                    f"{(r['peak'] - r['base']) / m:.2f} | {r['rss_after'] / budget:.2f} | "
                    f"{r['peak'] / (1.5 * budget):.2f} | {r['dtype']} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
