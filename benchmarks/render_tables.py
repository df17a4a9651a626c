#!/usr/bin/env python
"""Regenerate the benchmark tables of the documentation's performance page
(``docs/performance.md``) from ``benchmarks/results/*.json``.

Usage::

    python benchmarks/render_tables.py            # rewrite the tables in docs/performance.md
    python benchmarks/render_tables.py --check    # exit 1 (and show the diff) if they differ

The tables stand between marker comments in docs/performance.md: ``<!-- bench:ops -->`` …
``<!-- /bench:ops -->`` (from ``ops.json`` and ``attention.json``) and ``<!-- bench:blocks -->``
… ``<!-- /bench:blocks -->`` (from ``blocks.json``). Which cases the page shows, and the
words around the numbers, are the row specifications below; every number comes from the
results. ``make bench`` runs this after the benchmark scripts.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness as h

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LK = h.LK

Json = Mapping[str, Any]


# --------------------------------------------------------------------------------------
# ops and attention
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpRow:
    """One row of the performance page's op table: the case (by its name in the results), the label
    (from the case and the run's configuration), the torch-side peer and the words beside
    its ratio, the digits of the ratios, and what follows the roofline fraction."""

    case: str  # the case's "op", or its start followed by "*"
    label: Callable[[Json, Json], str]  # (case, config) -> label
    torch: str  # the peer compared in the "vs torch" column
    torch_words: str = ""
    digits: int = 1
    roof_words: str = ""  # after the 1T fraction ("of triad", a footnote mark)
    roof_2t: bool = False  # also the 2T fraction


def _shape(case: Json, _cfg: Json) -> str:
    return f"`{case['op']}` {case['shape']}"


OP_ROWS = (
    OpRow("rms_norm", _shape, "torch", "`F.rms_norm`", roof_words=" of triad"),
    OpRow("layer_norm", _shape, "torch", "`F.layer_norm`"),
    OpRow("silu", _shape, "torch", "`F.silu`"),
    OpRow("swiglu", _shape, "torch", "`F.silu(g)*u`", roof_words="¹"),
    OpRow(
        "rope",
        lambda c, _: "`rope` q and k " + c["shape"].removeprefix("q, k: "),
        "HF apply_rotary_pos_emb",
        "HF `apply_rotary_pos_emb`²",
    ),
    OpRow(
        "swiglu_ffn",
        lambda _, cfg: "`swiglu_ffn` ({}, {}) → {}".format(*cfg["ffn_shape"]),
        "torch",
        digits=2,
        roof_words=" of FMA peak",
    ),
    OpRow(
        "attention prefill",
        lambda _, cfg: "`attention` prefill ({}, {}, {}, {})".format(*cfg["attn_prefill_shape"]),
        "torch SDPA",
        "SDPA",
        digits=2,
        roof_2t=True,
    ),
    OpRow(
        "attention prefill, causal",
        lambda *_: "`attention` prefill, causal",
        "torch SDPA",
        "SDPA",
        digits=2,
    ),
    OpRow(
        "attention decode (cold*",
        lambda _, cfg: "`attention` decode Hq {1} / Hkv {2}, Tk {3} (cold)".format(
            *cfg["attn_decode_shape"]
        ),
        "torch SDPA",
        "SDPA (GQA)",
        digits=2,
        roof_2t=True,
    ),
)


def _find(cases: Sequence[Json], name: str) -> Json:
    for case in cases:
        op = str(case["op"])
        if op == name or (name.endswith("*") and op.startswith(name[:-1])):
            return case
    raise KeyError(f"render_tables: no case {name!r} in the results")


def _rate(v: float) -> str:
    return f"{v:.1f}" if v < 100 else f"{v:.0f}"


def _pct(v: float) -> str:
    return f"{100 * v:.0f}%"


def ops_table(ops: Json, attention: Json) -> list[str]:
    """The performance page's op table: llmkernels at 1 thread, its fraction of the roofline, the
    time ratios of torch and NumPy to it, and its 2T/1T speed-up."""
    sources = [(c, ops["config"]) for c in ops["ops"]]
    sources += [(c, attention["config"]) for c in attention["attention"]["cases"]]
    rows = []
    for spec in OP_ROWS:
        case = _find([c for c, _ in sources], spec.case)
        cfg = next(cf for c, cf in sources if c is case)
        impls = case["impls"]
        one = impls[LK]["1"]
        roof = _pct(one["fraction_of_roof"]) + spec.roof_words
        if spec.roof_2t:
            roof += f" (2T: {_pct(impls[LK]['2']['fraction_of_roof'])})"
        vs_torch = f"{impls[spec.torch]['1']['time_vs_llmkernels']:.{spec.digits}f}×"
        vs_numpy = f"{impls['NumPy']['1']['time_vs_llmkernels']:.{spec.digits}f}×"
        rows.append(
            [
                spec.label(case, cfg),
                f"{h.fmt_time(one['median_s'])}, {_rate(one['rate'])} {case['metric']}",
                roof,
                f"{vs_torch} {spec.torch_words}".rstrip(),
                vs_numpy,
                h.fmt(impls[LK]["thread_speedup"]),
            ]
        )
    header = ["op, shape", "llmkernels 1T", "fraction of roof (1T)", "vs torch (1T)"]
    header += ["vs NumPy (1T)", "2T / 1T"]
    return h.md_table(header, rows)


# --------------------------------------------------------------------------------------
# blocks
# --------------------------------------------------------------------------------------

HF = "HF transformers"


def _time_pair(a: float, b: float) -> str:
    """Two times in the unit of the larger: ``287 / 144 ms``, ``411 / 159 µs``."""
    big = max(a, b)
    unit, scale = next(
        ((u, s) for u, s in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)) if big >= s), ("ns", 1e-9)
    )
    return f"{a / scale:.3g} / {b / scale:.3g} {unit}"


def _pair(case: Json, key: str, name: str, form: Callable[[float], str]) -> str:
    return " / ".join(form(case["threads"][t]["impls"][name][key]) for t in ("1", "2"))


def _peer_cells(case: Json) -> list[str]:
    """llmkernels' and HF's times, 1T / 2T, and HF's time over llmkernels'."""
    lk_t = [case["threads"][t]["impls"][LK]["median_s"] for t in ("1", "2")]
    hf_t = [case["threads"][t]["impls"][HF]["median_s"] for t in ("1", "2")]
    return [
        _time_pair(*lk_t),
        _time_pair(*hf_t),
        _pair(case, "time_vs_llmkernels", HF, lambda v: f"{v:.2f}"),
    ]


def _block_label(shape: Json) -> str:
    return f"{shape['dim']}, {shape['n_heads']}/{shape['n_kv_heads']}"


def blocks_table(blocks: Json) -> list[str]:
    """The performance page's blocks table: the TinyLlama-like block's prefill and decode step, the
    small block's, and the whole model's greedy decoding, llmkernels vs HF at 1 / 2 threads."""
    cfg = blocks["config"]
    rows = []
    big, small = blocks["big"], blocks["small"]

    pre = big["prefill"]
    fraction = _pair(pre, "fraction_of_roof", LK, _pct)
    gemms = "NumPy's BLAS"
    lk_faster = all(
        pre["threads"][t]["impls"][LK]["median_s"]
        < pre["threads"][t]["impls"]["GEMMs only (NumPy BLAS)"]["median_s"]
        for t in ("1", "2")
    )
    versus_gemms = (
        f"faster than its four GEMMs alone on {gemms}"
        if lk_faster
        else f"{_pair(pre, 'time_vs_llmkernels', 'GEMMs only (NumPy BLAS)', _ratio)} "
        f"its four GEMMs alone on {gemms}"
    )
    b = cfg["big"]
    rows.append(
        [
            f"TinyLlama-like block ({b['dim']}, {b['n_heads']}/{b['n_kv_heads']} heads, "
            f"{b['hidden']}) prefill T={pre['T']}",
            *_peer_cells(pre),
            f"{fraction} of FMA peak; "
            f"{_pair(pre, 'time_vs_llmkernels', 'NumPy block', _ratio)} a NumPy block³; "
            + versus_gemms,
        ]
    )
    dec = big["decode"]
    rows.append(
        [
            f"same block, one decode step at {dec['cache_tokens']} cached tokens",
            *_peer_cells(dec),
            f"weights read at {_pair(dec, 'rate', LK, lambda v: f'{v:.1f}')} GB/s "
            f"({_pair(dec, 'fraction_of_roof', LK, _pct)} of triad)",
        ]
    )
    s = cfg["small"]
    pre = small["prefill"]
    rows.append(
        [
            f"small block ({_block_label(s)}, {s['hidden']}) prefill T={pre['T']}",
            *_peer_cells(pre),
            f"{_pair(pre, 'fraction_of_roof', LK, _pct)} of FMA peak; "
            "projections on the package's own GEMM",
        ]
    )
    dec = small["decode"]
    rows.append(
        [
            f"small block decode step (from {dec['cache_tokens']} cached, consecutive)",
            *_peer_cells(dec),
            f"weights ({dec['weight_bytes'] / 2**20:.0f} MiB) read from the last-level cache",
        ]
    )
    model = blocks["model"]
    mc = model["config"]
    per = {t: model["threads"][t]["impls"] for t in ("1", "2")}
    rows.append(
        [
            f"{mc['n_layers']}-layer model (vocab {mc['vocab_size']}, dim {mc['dim']}) greedy, "
            f"{mc['new_tokens']} tokens",
            " / ".join(f"{per[t][LK]['tokens_per_s']:.0f}" for t in per) + " tok/s",
            " / ".join(f"{per[t][HF]['tokens_per_s']:.0f}" for t in per) + " tok/s",
            " / ".join(f"{per[t][HF]['median_s'] / per[t][LK]['median_s']:.2f}" for t in per),
            "identical tokens" if model.get("tokens_equal") else "tokens differ from HF's",
        ]
    )
    header = ["case", "llmkernels 1T / 2T", "HF 1T / 2T", "× HF (1T / 2T)", "notes"]
    return h.md_table(header, rows)


def _ratio(v: float) -> str:
    return f"{v:.2f}×"


# --------------------------------------------------------------------------------------
# the page
# --------------------------------------------------------------------------------------


def tables(results: Path = RESULTS) -> dict[str, list[str]]:
    """Each marked section's lines, from the JSON in ``results``."""
    ops, attention, blocks = (
        h.load_json(results / f"{n}.json") for n in ("ops", "attention", "blocks")
    )
    return {"ops": ops_table(ops, attention), "blocks": blocks_table(blocks)}


def replace_sections(text: str, sections: Mapping[str, list[str]]) -> str:
    """``text`` with the lines between each ``<!-- bench:NAME -->`` and
    ``<!-- /bench:NAME -->`` replaced by ``sections[NAME]``."""
    for name, lines in sections.items():
        pattern = re.compile(
            rf"(<!-- bench:{re.escape(name)} -->\n).*?(\n<!-- /bench:{re.escape(name)} -->)",
            re.DOTALL,
        )
        if not pattern.search(text):
            raise ValueError(f"render_tables: no <!-- bench:{name} --> markers in the page")
        body = "\n".join(lines)
        text = pattern.sub(lambda m, body=body: m.group(1) + body + m.group(2), text, count=1)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "performance.md")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--check", action="store_true", help="only compare; exit 1 when the page differs"
    )
    args = parser.parse_args(argv)
    old = args.page.read_text(encoding="utf-8")
    new = replace_sections(old, tables(args.results))
    if args.check:
        if new != old:
            sys.stdout.writelines(
                difflib.unified_diff(
                    old.splitlines(True), new.splitlines(True), str(args.page.name), "rendered"
                )
            )
            return 1
        return 0
    if new != old:
        args.page.write_text(new, encoding="utf-8")
        print(f"updated the benchmark tables in {args.page}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
