"""Regenerate the results report (analysis/README.md, analysis/figures/*.png, analysis/results/*.csv).

One command, shipped inputs only (dcut_sched/data/traces/*.parquet, dcut_sched/profiler/profiles/*.json), seeded:

    PYTHONPATH=. python analysis/make_report.py

Sections (each also reproducible with the ``dcut-sim`` command the report prints next to it):

0. reproducing the published D-Cut results: the mean-over-five table beside the published one, with
   the draft-cost and calibration-gap sensitivities (report_reproduce); the same headline table is
   written into README.md and docs/simulator.md between their ``<!-- generated:headline -->`` markers;
1. speedup over ``ar`` vs batch size, every registered policy, per trace family (report_speedup);
2. the selection curve at bs = 32 next to the published D-Cut figures (report_selection);
3. budgets chosen step by step by ``dcut`` and ``fine``, and skipped drafts (report_budgets);
4. reliability of raw vs online-calibrated confidence, and ``--calibrate`` throughput (report_calibration);
5. the simulator-fidelity table: ``analysis/fidelity.py predict`` re-run on the committed engine
   measurements (seconds), its figures also written into docs/benchmarks.md and docs/fidelity.md between
   ``<!-- generated:fidelity -->`` markers;
6. the published peer policies next to ``fine`` at bs 1..64 (report_peers).
7. the vLLM benchmark of ``analysis/bench_vllm.py`` (included when its Markdown exists).
8. the sampling section of ``analysis/sampling_report.py`` (included when its Markdown exists).

About two minutes on the project's 2-core machine (one process).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import pandas as pd  # noqa: E402
import report_reproduce  # noqa: E402
from report_budgets import VARIANTS, budget_steps, budget_summary, plot_budgets  # noqa: E402
from report_calibration import CONFIDENCE_POLICIES, calibrated_throughput, plot_reliability, reliability  # noqa: E402
from report_markdown import render_report  # noqa: E402
from report_peers import PEER_FAMILIES, peers_commentary, peers_markdown, plot_peers, policies_run, run_peers  # noqa: E402
from report_selection import PUBLISHED_GSM8K, plot_selection, selection_table  # noqa: E402
from report_speedup import Family, plot_family, run_family  # noqa: E402
from tqdm import tqdm  # noqa: E402

from dcut_sched.cost_curve import CostCurveError  # noqa: E402
from dcut_sched.policies import PEERS  # noqa: E402
from dcut_sched.policies import names as policy_names  # noqa: E402
from dcut_sched.traces import TraceError  # noqa: E402
from dcut_sched.util.atomic import atomic_write_text  # noqa: E402
from dcut_sched.util.tables import write_table  # noqa: E402

H20 = "dcut_sched/profiler/profiles/h20-qwen3-8b-published.json"
CPU = "dcut_sched/profiler/profiles/cpu-smollm2-135m-b16.json"
DFLASH = [f"dcut_sched/data/traces/dflash-qwen3-8b-{n}-b16.parquet" for n in ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench")]
GSM8K = DFLASH[0]
REAL_B16 = ["dcut_sched/data/traces/smollm2-135m-skip14-15-b16.parquet", "dcut_sched/data/traces/smollm2-135m-skip21-22-b16.parquet"]
REAL_ALL = REAL_B16 + ["dcut_sched/data/traces/smollm2-135m-skip14-15-b8.parquet"]
BATCH_SIZES = (4, 8, 16, 32, 64)
CPU_BATCH_SIZES = (4, 8, 16)  # the CPU curve is measured at bs 1..16
FIDELITY_MD = "analysis/results/fidelity.md"
SAMPLING_MD = "analysis/results/sampling.md"
VLLM_MD = "analysis/results/vllm/bench_vllm.md"
#: Section 1 runs the policies of docs/design.md §2; the published peers have their own section (report_peers).
CORE_POLICIES = [p for p in policy_names() if p not in PEERS]


def families() -> list[Family]:
    """The trace families of the speedup section (paths relative to the repository root)."""
    return [
        Family("dflash-h20", "DFlash-like synthetic traces (5 datasets) on the published H20 Qwen3-8B curve",
               DFLASH, H20, BATCH_SIZES,
               note="synthetic traces fitted to published DFlash acceptance figures; calibrated by construction",
               policies=CORE_POLICIES),
        Family("real-h20", "real SmolLM2-135M traces on the H20 Qwen3-8B curve (what-if)", REAL_B16, H20, BATCH_SIZES,
               note="what-if: SmolLM2-135M self-speculative acceptance combined with Qwen3-8B-on-H20 step costs",
               policies=CORE_POLICIES),
        Family("real-cpu", "real SmolLM2-135M traces on their own measured CPU curve", REAL_B16, CPU, CPU_BATCH_SIZES,
               note="consistent pair: the traces' model pair and its cost curve measured on this project's CPU",
               policies=CORE_POLICIES),
    ]


@dataclass
class Settings:
    """What the report was computed with (printed in the report)."""

    num_steps: int = 1500
    warmup_steps: int = 200
    seed: int = 0
    selection_batches: int = 300
    budget_batch_sizes: tuple = BATCH_SIZES
    budget_plot_batch_sizes: tuple = (4, 8, 64)
    cpu_budget_batch_sizes: tuple = (4, 16)


def count_runs(settings: Settings) -> int:
    """Simulated runs (and selection traces) the report does, for the progress bar."""
    n_pol = len(CORE_POLICIES)
    total = sum(len(f.traces) * n_pol * len(f.batch_sizes) for f in families())
    total += sum(len(f.traces) * len(policies_run()) * len(f.batch_sizes) for f in PEER_FAMILIES)
    total += 2  # selection curves: gsm8k, real
    total += 2 * len(settings.budget_batch_sizes) * len(VARIANTS) + len(settings.cpu_budget_batch_sizes) * 2
    total += len(REAL_ALL)  # reliability
    bench = len(report_reproduce.DRAFT_SCALES) * 5 + (len(report_reproduce.CALIBRATION_GAPS) - 1) * 4
    total += 5 * len(BATCH_SIZES) * bench  # reproduce: 5 benchmarks x bs x policies
    k = len(CONFIDENCE_POLICIES) + 1
    total += 2 * k * (len(REAL_B16) * len(BATCH_SIZES) + len(REAL_B16) * len(CPU_BATCH_SIZES) + len(BATCH_SIZES))
    return total


def compute(settings: Settings, bar) -> dict:
    """Run every section; returns the DataFrames the report is rendered from."""
    tick = lambda *_: bar.update(1)  # noqa: E731
    s = settings
    out: dict = {}
    bar.set_description("reproducing the published results")
    out["reproduce"] = report_reproduce.compute(on_run=lambda: bar.update(1))
    speed = []
    for fam in families():
        bar.set_description(f"speedup {fam.key}")
        speed.append(run_family(fam, num_steps=s.num_steps, warmup_steps=s.warmup_steps, seed=s.seed, on_run=tick))
    out["speedup"] = pd.concat(speed, ignore_index=True)

    bar.set_description("selection curve")
    out["selection"] = selection_table([GSM8K, REAL_B16[0]], num_batches=s.selection_batches, seed=s.seed,
                                       published=PUBLISHED_GSM8K, published_trace=GSM8K)
    bar.update(2)

    bar.set_description("budgets dcut vs fine")
    steps = [budget_steps(t, H20, s.budget_batch_sizes, policies=list(VARIANTS), num_steps=s.num_steps, seed=s.seed,
                          on_run=tick)
             for t in (GSM8K, REAL_B16[0])]
    cpu_steps = budget_steps(REAL_B16[0], CPU, s.cpu_budget_batch_sizes, num_steps=s.num_steps, seed=s.seed, on_run=tick)
    out["budget_steps_h20"] = pd.concat(steps, ignore_index=True)
    out["budget_steps_cpu"] = cpu_steps
    summ_h20 = budget_summary(out["budget_steps_h20"], s.warmup_steps)
    summ_h20.insert(1, "cost", "h20")
    summ_cpu = budget_summary(cpu_steps, s.warmup_steps)
    summ_cpu.insert(1, "cost", "cpu")
    out["budget_summary"] = pd.concat([summ_h20, summ_cpu], ignore_index=True)

    bar.set_description("reliability")
    bins, summ = [], []
    for t in REAL_ALL:
        b, m = reliability(t, seed=s.seed)
        bins.append(b)
        summ.append(m)
        bar.update(1)
    out["reliability_bins"] = pd.concat(bins, ignore_index=True)
    out["reliability"] = pd.concat(summ, ignore_index=True)

    bar.set_description("--calibrate throughput")
    kw = dict(num_steps=s.num_steps, warmup_steps=s.warmup_steps, seed=s.seed, on_run=tick)
    out["calibrate"] = pd.concat([
        calibrated_throughput(REAL_B16, H20, BATCH_SIZES, **kw),
        calibrated_throughput(REAL_B16, CPU, CPU_BATCH_SIZES, **kw),
        calibrated_throughput([GSM8K], H20, BATCH_SIZES, **kw),
    ], ignore_index=True)

    bar.set_description("published peers")
    out["peers"] = run_peers(PEER_FAMILIES, num_steps=s.num_steps, warmup_steps=s.warmup_steps, seed=s.seed,
                             on_run=tick)
    return out


def write_outputs(results: dict, settings: Settings, out_dir: Path) -> list[Path]:
    """CSV files, figures and the Markdown report under ``out_dir``; returns the paths written."""
    res, fig = out_dir / "results", out_dir / "figures"
    res.mkdir(parents=True, exist_ok=True)
    fig.mkdir(parents=True, exist_ok=True)
    written = []

    def csv(name: str, df: pd.DataFrame) -> None:
        path = res / name
        write_table(df, path, float_format="%.6g")
        written.append(path)

    speed = results["speedup"]
    csv("speedup.csv", speed.drop(columns=[c for c in ("trace", "cost") if c in speed.columns])
        .assign(cost=speed["cost"].map(lambda p: Path(str(p)).stem)))
    csv("selection_curve.csv", results["selection"])
    csv("budgets_summary.csv", results["budget_summary"])
    csv("reliability_bins.csv", results["reliability_bins"])
    csv("reliability.csv", results["reliability"])
    csv("calibrate_throughput.csv", results["calibrate"])
    csv("peers.csv", results["peers"])
    csv("reproduce.csv", results["reproduce"]["rows"])

    for fam in families():
        path = fig / f"speedup-{fam.key}.png"
        plot_family(speed[speed["family"] == fam.key], path, title=f"{fam.title}\n(gmean over its traces)")
        written.append(path)
    for path, fn in ((fig / "selection-curve.png", lambda p: plot_selection(results["selection"], p)),
                     (fig / "budgets-h20.png", lambda p: plot_budgets(
                         results["budget_steps_h20"], p, first_step=settings.warmup_steps,
                         batch_sizes=settings.budget_plot_batch_sizes)),
                     (fig / "budgets-cpu.png", lambda p: plot_budgets(results["budget_steps_cpu"], p,
                                                                      first_step=settings.warmup_steps)),
                     (fig / "reliability.png", lambda p: plot_reliability(results["reliability_bins"],
                                                                          results["reliability"], p)),
                     (fig / "peers.png", lambda p: plot_peers(results["peers"], p))):
        fn(path)
        written.append(path)

    fidelity_path = res / "fidelity.md"
    fidelity = fidelity_path.read_text() if fidelity_path.exists() else None
    summary_path = res / "fidelity_summary.json"
    peers = peers_markdown(results["peers"], commentary=peers_commentary(results["peers"]))
    vllm_path = ROOT / VLLM_MD
    vllm = vllm_path.read_text() if vllm_path.exists() else None
    sampling_path = ROOT / SAMPLING_MD
    sampling = sampling_path.read_text() if sampling_path.exists() else None
    text = render_report(results, families(), settings, fidelity=fidelity, peers=peers, vllm=vllm, sampling=sampling)
    atomic_write_text(out_dir / "README.md", text)
    written.append(out_dir / "README.md")
    blocks = {"headline": report_reproduce.headline_markdown(results["reproduce"])}
    if summary_path.exists():
        blocks["fidelity"] = fidelity_sentence(json.loads(summary_path.read_text()))
    if out_dir.resolve() == (ROOT / "analysis").resolve():  # the project's own report: update the docs too
        for doc in (ROOT / "README.md", ROOT / "docs" / "simulator.md", ROOT / "docs" / "fidelity.md",
                    ROOT / "docs" / "benchmarks.md"):
            if any([report_reproduce.update_generated_block(doc, key, text) for key, text in blocks.items()]):
                written.append(doc)
    return written


def fidelity_sentence(summary: dict) -> str:
    """The fidelity figures the README and docs/fidelity.md quote, from ``fidelity_summary.json``."""
    before, after, sp = summary["tokens_per_s_before"], summary["tokens_per_s_after"], summary["speedup_after"]
    way = "over" if before["mean_signed"] > 0 else "under"
    return (f"The simulator as is (timed with the curve the engine planned with, `dcut_sched/profiler/profiles/"
            f"cpu-smollm2-135m-b8.json`; see its recorded load) {way}-predicts the engine's decode tokens/s by a "
            f"median **{100 * before['median_abs']:.1f} %** (max {100 * before['max_abs']:.0f} %); timed with the "
            "all-bs curve at the engine's context and counting the drafter's lazy prompt prefill as prefill and adding "
            "the engine's per-step time outside the model forwards (measured on held-out prompts), the **median "
            f"absolute error is {100 * after['median_abs']:.1f} %** (mean {100 * after['mean_abs']:.1f} %, max "
            f"{100 * after['max_abs']:.0f} %) over every (policy, bs) run, and {100 * sp['median_abs']:.1f} % on "
            "speedup over `ar` (from `analysis/results/fidelity_summary.json`, regenerated by "
            "`analysis/make_report.py`).")


def run_fidelity_predict(out_dir: Path) -> None:
    """``analysis/fidelity.py predict`` on the committed engine measurements, into the report's results folder
    (seconds), so the report and the docs quote the figures of this run."""
    import contextlib
    import io

    import fidelity

    measurements = ROOT / "analysis" / "results"
    if not (measurements / "fidelity_engine_runs.csv").exists():
        return
    with contextlib.redirect_stdout(io.StringIO()):
        fidelity.main(["predict", "--measurements", str(measurements), "--out-dir", str(out_dir / "results")])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Writes analysis/README.md, analysis/figures/*.png, analysis/results/*.csv.")
    ap.add_argument("--out-dir", default=str(ROOT / "analysis"), help="report folder (default: analysis/)")
    ap.add_argument("--steps", type=int, default=Settings.num_steps, help="simulated steps per run (default 1500)")
    ap.add_argument("--warmup", type=int, default=Settings.warmup_steps, help="warm-up steps left out (default 200)")
    ap.add_argument("--seed", type=int, default=Settings.seed, help="seed of request order and sampling (default 0)")
    ap.add_argument("--selection-batches", type=int, default=Settings.selection_batches,
                    help="sampled batches per selection-curve point (default 300)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if not 0 <= args.warmup < args.steps:
        ap.error(f"need 0 <= --warmup ({args.warmup}) < --steps ({args.steps})")
    settings = Settings(num_steps=args.steps, warmup_steps=args.warmup, seed=args.seed,
                        selection_batches=args.selection_batches)
    import os

    os.chdir(ROOT)  # the shipped inputs are named relative to the repository root
    start = time.perf_counter()
    try:
        with tqdm(total=count_runs(settings), unit="run", disable=args.no_progress) as bar:
            results = compute(settings, bar)
    except (TraceError, CostCurveError, ValueError, FileNotFoundError) as exc:
        print(f"make_report: error: {exc}", file=sys.stderr)
        return 2
    run_fidelity_predict(Path(args.out_dir))
    elapsed = time.perf_counter() - start
    written = write_outputs(results, settings, Path(args.out_dir))
    print(f"report computed in {elapsed:.0f} s; wrote {len(written)} files, e.g. {written[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
