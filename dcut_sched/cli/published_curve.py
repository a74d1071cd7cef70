"""``python -m dcut_sched.cli.published_curve``: rebuild the shipped H20 / Qwen3-8B cost curve from
the public D-Cut figures (:func:`dcut_sched.profiler.published.build_h20_qwen3_8b`) and print the fit."""

from __future__ import annotations

import argparse
import sys

from ..profiler.published import DEFAULT_OUT, build_h20_qwen3_8b
from ..profiler.report import fit_table
from ..util.console import make_console

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dcut_sched.cli.published_curve",
                                 description="Rebuild the shipped H20 / Qwen3-8B curve from the public D-Cut figures.")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="output JSON (default: %(default)s)")
    args = ap.parse_args(argv)
    curve, fit = build_h20_qwen3_8b()
    curve.save(args.out)

    console = make_console()
    console.print(fit_table(fit, title="fit to the published H20 rows"))
    console.print(f"wrote {args.out}: {len(curve.verify)} verify rows, {len(curve.ar)} ar rows, "
                  f"{len(curve.draft)} draft rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
