"""llama.cpp as a peer: the same safetensors checkpoint converted to GGUF with
llama.cpp's own converter, loaded by llama-cpp-python, its logits validated, then timed.

Set-up, once, outside the repository (llama.cpp takes ~25 min to build on 2 cores)::

    pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d /opt/peers
    tar xzf /opt/peers/llama_cpp_python-0.3.36.tar.gz -C /opt/peers
    CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_BLAS=OFF" pip wheel --no-deps -w /opt/peers/wheels \\
        /opt/peers/llama_cpp_python-0.3.36
    pip install /opt/peers/wheels/llama_cpp_python-*.whl sentencepiece    # extra `peers`
    export LLAMA_CPP_SRC=/opt/peers/llama_cpp_python-0.3.36/vendor/llama.cpp

On a CPU with AMX (Intel Sapphire Rapids and later) this build runs Q8_0 / Q4_0 matrix products
on AMX tiles, and llama-cpp-python 0.3.36 built with GCC dies there with SIGILL at the first
prefill: its ``ggml_tile_config_init`` builds the tile configuration on the stack and GCC drops
the stores ``ldtilecfg`` reads (llama.cpp pull request 26954, open). To measure its AMX path,
build it with that configuration made ``static`` in ``ggml/src/ggml-cpu/amx/mmq.cpp`` (an
``asm volatile("" : : "r"(&tc) : "memory")`` before ``_tile_loadconfig`` keeps the stores).

``LLAMA_CPP_SRC`` is the llama.cpp source tree (its ``convert_hf_to_gguf.py`` and
``gguf-py``, the converter's own version of the GGUF writer). Without llama-cpp-python or the
source tree :func:`unavailable` says what is missing and the benchmarks skip this peer.

The converter needs a tokenizer: :func:`write_tokenizer` trains a small SentencePiece model
(the converter pads the vocabulary to the config's ``vocab_size``); the benchmarks feed token
ids directly, so the tokenizer only has to exist. Q4_0 is made from the F32 GGUF with
``llama_model_quantize`` (the ``llama-quantize`` tool's function). GGUF's RoPE layout
permutes q/k rows; the converter does that, so logits match llmkernels' on the same weights
(checked before timing: :func:`LlamaCpp.logits`; ``.scores`` is stale unless
``logits_all=True``, so logits are read with ``llama_get_logits_ith``).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

# GGUF file type per precision name, as the converter (--outtype) or the quantizer makes it
CONVERTER_TYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0"}
QUANTIZED_TYPES = {"Q4_0": 2}  # llama_ftype LLAMA_FTYPE_MOSTLY_Q4_0
DEFAULT_SRC = "/work/peers/llama_cpp_python-0.3.36/vendor/llama.cpp"


def source_dir() -> Path:
    return Path(os.environ.get("LLAMA_CPP_SRC", DEFAULT_SRC))


def unavailable() -> str | None:
    """Why the peer cannot run here, or None."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (see benchmarks/llamacpp_peer.py)"
    if importlib.util.find_spec("sentencepiece") is None:
        return "sentencepiece is not installed (the GGUF converter needs a tokenizer)"
    if not (source_dir() / "convert_hf_to_gguf.py").is_file():
        return f"no llama.cpp source tree at {source_dir()} (set LLAMA_CPP_SRC)"
    # an install whose shared library is missing or was built for another CPU fails (or
    # crashes) on import: find out in a child process, not in the benchmark's
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import llama_cpp"], capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        return "importing llama_cpp did not finish in 120 s"
    if probe.returncode != 0:
        lines = (probe.stderr or "").strip().splitlines() or [f"exit status {probe.returncode}"]
        return f"llama-cpp-python is installed but does not load: {lines[-1]}"
    return None


def write_tokenizer(model_dir: Path, text: str | None = None, vocab: int = 300) -> None:
    """A small SentencePiece ``tokenizer.model`` in ``model_dir`` (BPE with byte fallback)."""
    import sentencepiece as spm

    corpus = model_dir / "_corpus.txt"
    words = text or " ".join(f"w{i} tok{i % 97} piece{i % 13}" for i in range(4000))
    corpus.write_text("\n".join(words[i : i + 200] for i in range(0, len(words), 200)))
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(model_dir / "tokenizer"),
        vocab_size=vocab,
        model_type="bpe",
        byte_fallback=True,
        bos_id=1,
        eos_id=2,
        unk_id=0,
        pad_id=-1,
        minloglevel=2,
    )
    corpus.unlink()
    (model_dir / "tokenizer.vocab").unlink(missing_ok=True)


def make_gguf(model_dir: Path, out_dir: Path, precision: str) -> Path:
    """``model_dir`` (config.json + safetensors + tokenizer.model) as a GGUF of ``precision``
    (F32, F16, BF16, Q8_0 by the converter; Q4_0 quantized from the F32 file)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"model-{precision}.gguf"
    if out.exists():
        return out
    if precision in QUANTIZED_TYPES:
        import llama_cpp

        src = make_gguf(model_dir, out_dir, "F32")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = QUANTIZED_TYPES[precision]
        params.nthread = os.cpu_count() or 1
        rc = llama_cpp.llama_model_quantize(
            str(src).encode(), str(out).encode(), ctypes.byref(params)
        )
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize to {precision} failed ({rc})")
        return out
    src = source_dir()
    env = {**os.environ, "PYTHONPATH": str(src / "gguf-py"), "NO_LOCAL_GGUF": ""}
    proc = subprocess.run(
        [sys.executable, str(src / "convert_hf_to_gguf.py"), str(model_dir), "--outfile",
         str(out), "--outtype", CONVERTER_TYPES[precision]],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf failed:\n{proc.stderr[-3000:]}")
    return out


def read_bytes_per_token(path: Path) -> dict[str, Any]:
    """Bytes a decode step of the GGUF at ``path`` reads: every tensor but the token embedding
    (one row of it), read from the file's tensor table with the source tree's ``gguf-py``; and
    the GGML type of each kind of matrix (llama-quantize keeps ``output.weight`` above Q4_0)."""
    sys.path.insert(0, str(source_dir() / "gguf-py"))
    try:
        from gguf import GGUFReader
    finally:
        sys.path.pop(0)
    total, types = 0, {}
    for t in GGUFReader(str(path)).tensors:
        kind = t.name.split(".")[-2] if t.name.startswith("blk.") else t.name.split(".")[0]
        types.setdefault(kind, t.tensor_type.name)
        if t.name != "token_embd.weight":
            total += int(t.n_bytes)
    return {"bytes": total, "types": types}


class LlamaCpp:
    """One GGUF model in llama-cpp-python, fed token ids (no tokenizer, no sampling)."""

    def __init__(self, path: Path, n_ctx: int, threads: int, f32_kv: bool = False) -> None:
        import llama_cpp

        self._lib = llama_cpp
        kwargs: dict[str, Any] = {}
        if f32_kv:  # an F32 KV cache, for validating against float32 logits
            kwargs.update(type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
        self.llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_batch=512,
            n_ubatch=512,
            n_threads=threads,
            n_threads_batch=threads,
            logits_all=False,
            verbose=False,
            **kwargs,
        )
        self.vocab = self.llm.n_vocab()

    def set_threads(self, n: int) -> None:
        self._lib.llama_set_n_threads(self.llm.ctx, n, n)

    def last_logits(self) -> np.ndarray:
        ptr = self._lib.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.vocab,)).copy()

    def logits(self, tokens: list[int]) -> np.ndarray:
        """Logits of the last position after a fresh prefill of ``tokens``."""
        self.llm.reset()
        self.llm.eval(tokens)
        return self.last_logits()

    def prefill(self, tokens: list[int]) -> float:
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(tokens)
        return time.perf_counter() - t0

    def decode(self, prompt: list[int], steps: int) -> float:
        """Seconds for ``steps`` greedy one-token steps after an untimed prefill of ``prompt``."""
        self.llm.reset()
        self.llm.eval(prompt)
        token = int(np.argmax(self.last_logits()))
        t0 = time.perf_counter()
        for _ in range(steps):
            self.llm.eval([token])
            token = int(np.argmax(self.last_logits()))
        return time.perf_counter() - t0
