"""benchmarks/bench_precision.py: float32 vs bf16 vs f16 weights, decode and prefill."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import llmkernels as lk
from conftest import run_bench


def test_bench_precision_quick_writes_every_row(tmp_path: Path) -> None:
    """``--quick``: a row per thread count and weight dtype with tokens/s, bytes per token and
    the fraction of the triad bandwidth (no figure is asserted: speed lives in the report)."""
    proc = run_bench("bench_precision.py", "--quick", "--out", str(tmp_path), "--quiet-wait", "0")
    assert proc.returncode == 0, proc.stderr
    res = json.loads((tmp_path / "precision.json").read_text())
    rows = {(r["threads"], r["dtype"]): r for r in res["rows"]}
    threads = res["config"]["threads"]
    # int8 / int4 rows join when the package can quantize a model
    assert set(rows) >= {(t, d) for t in threads for d in ("float32", "bfloat16", "float16")}
    for (_, dtype), r in rows.items():
        assert r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0 and r["of_triad"] > 0
        assert r["prefill_of_fma"] > 0  # the prefill's GFLOP/s against the FMA probe
        # 16-bit weights: half the matrix bytes of float32 per decoded token (norms stay float32)
        if dtype in ("bfloat16", "float16"):
            f32 = rows[(r["threads"], "float32")]["bytes_per_token"]
            assert 0.5 * f32 <= r["bytes_per_token"] < 0.51 * f32
    md = (tmp_path / "precision.md").read_text()
    assert "| threads | weights | decode tok/s |" in md
    # every target is listed, met or not (an unmet one with what it needs of the machine)
    assert "| bfloat16 | decode >= 1.8x our float32 |" in md


def test_prefill_flops_counts_the_model() -> None:
    """The prefill's FLOPs, counted independently, token by token: 2 x the projection weights a
    token passes through, the causal attention's QK^T and PV over i + 1 keys for query i, the
    head once (last logits). In the last layer ours computes the last token's query, attention,
    o and MLP only (k and v for all); llama.cpp skips the MLP of the other tokens only."""
    bench = str(Path(__file__).resolve().parents[2] / "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import bench_precision as bp

    cfg = bp.QUICK
    hd = cfg.dim // cfg.n_heads
    kv = cfg.n_kv_heads * hd
    q_o = 2 * 2 * cfg.dim * cfg.dim  # (out, in) each
    k_v = 2 * 2 * kv * cfg.dim
    mlp = 3 * 2 * cfg.hidden * cfg.dim
    for peer in (False, True):
        total = 2 * cfg.dim * cfg.vocab
        for layer in range(cfg.layers):
            for i in range(cfg.prefill):
                everything = layer < cfg.layers - 1 or i == cfg.prefill - 1
                total += k_v
                total += q_o if everything or peer else 0
                total += mlp if everything else 0
                total += cfg.n_heads * 2 * 2 * hd * (i + 1) if everything or peer else 0
        assert bp.prefill_flops(cfg, peer=peer) == total


def test_cases_are_timed_beside_their_peer() -> None:
    """Each of ours is followed by its llama.cpp peer (decode, then prefill), so the ratio pairs
    samples taken side by side; without peers the order is ours alone."""
    bench = str(Path(__file__).resolve().parents[2] / "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import bench_precision as bp

    ours = [
        f"{k} {d}"
        for d in ("float32", "bfloat16", "float16", "int8")
        for k in ("decode", "prefill")
    ]
    # bfloat16's peer: BF16 where the CPU has AVX512_BF16 (llama.cpp's vdpbf16ps path), else F16
    bf16_peer = bp.PEER_OF["bfloat16"]
    assert bf16_peer == ("BF16" if lk._core.cpu_has_avx512_bf16 else "F16")
    types = ("F32", "F16", "Q8_0") + (("BF16",) if bf16_peer == "BF16" else ())
    peers = [f"{k} llama.cpp {p}" for p in types for k in ("decode", "prefill")]
    order = bp.case_order(ours + peers)
    assert sorted(order) == sorted(ours + peers)
    sixth = "decode llama.cpp F16" if bf16_peer == "BF16" else "decode int8"
    assert order[:6] == ["decode float32", "decode llama.cpp F32", "decode bfloat16",
                         f"decode llama.cpp {bf16_peer}", "decode float16", sixth]  # fmt: skip
    assert order[-1].startswith("prefill")
    assert bp.case_order(ours) == [n for n in ours if n.startswith("decode")] + [
        n for n in ours if n.startswith("prefill")
    ]


def test_llamacpp_peer_that_does_not_load_is_unavailable(tmp_path: Path, monkeypatch) -> None:
    """A llama-cpp-python whose library fails to load makes the peer unavailable (the
    benchmarks then run without it), found out in a child process."""
    bench = str(Path(__file__).resolve().parents[2] / "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import llamacpp_peer

    fake = tmp_path / "site" / "llama_cpp"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise OSError('libllama.so: cannot open shared object')\n")
    (tmp_path / "sentencepiece").mkdir()
    (tmp_path / "sentencepiece" / "__init__.py").write_text("")
    src = tmp_path / "src"
    src.mkdir()
    (src / "convert_hf_to_gguf.py").write_text("")
    monkeypatch.setenv("LLAMA_CPP_SRC", str(src))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.syspath_prepend(str(tmp_path))
    why = llamacpp_peer.unavailable()
    assert why is not None and "does not load" in why and "libllama.so" in why
