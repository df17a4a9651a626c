#!/usr/bin/env python
"""Draw ``benchmarks/run.py``'s results as PNG plots beside its markdown and JSON.

Usage::

    python benchmarks/plot_results.py                       # benchmarks/results/results.json
    python benchmarks/plot_results.py path/to/results.json  # -> path/to/benchmarks.png

Writes ``benchmarks.png`` (rate of every op and implementation against the roofline, per
thread count, plus pure Python at toy sizes) and ``benchmarks_time.png`` (median time per call,
log scale, with the roofline's least possible time per op) next to the JSON, using
:func:`llmkernels.plot.benchmark_plot`. Needs matplotlib (``pip install -e .[notebook]``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from llmkernels.plot import benchmark_plot
except ImportError as exc:
    sys.exit(f"benchmarks/plot_results.py: {exc} (pip install -e .[bench] or .[notebook])")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "results",
        nargs="?",
        type=Path,
        default=Path("benchmarks/results/results.json"),
        help="results.json written by benchmarks/run.py (default: %(default)s)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory (default: the JSON's)"
    )
    parser.add_argument("--dpi", type=int, default=110)
    args = parser.parse_args(argv)
    if not args.results.is_file():
        print(f"no {args.results}: run benchmarks/run.py first", file=sys.stderr)
        return 1
    out = args.out or args.results.parent
    out.mkdir(parents=True, exist_ok=True)
    for kind, name in (("rate", "benchmarks.png"), ("time", "benchmarks_time.png")):
        fig = benchmark_plot(args.results, kind=kind)
        fig.savefig(out / name, dpi=args.dpi)
        plt.close(fig)
        print(f"wrote {out / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
