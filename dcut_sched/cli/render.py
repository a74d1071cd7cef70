"""Every table the command-line tools print (rich): dcut-sim's speedup, open-loop, benchmark, seed and
selection-curve tables, dcut-engine's summary and dcut-drafter eval's tau table. Imported after the flags are parsed (``--help``
stays light); the figures come from :mod:`dcut_sched.simulator` and the engine's result.
"""

from __future__ import annotations

from rich import box
from rich.table import Table

from dcut_sched.simulator import benchmark_table, speedup_table
from dcut_sched.util.console import make_console


def empty_speedup_table(title: str, sizes, open_loop: bool, **table_kwargs):
    """An empty speedup table: a policy column, one column per batch size, the geomean."""
    table = Table(title=title, **table_kwargs)
    table.add_column("policy", style="bold")
    for bs in sizes:
        table.add_column(f"bs {bs}" + (" (max)" if open_loop else ""), justify="right")
    table.add_column("geomean", justify="right", style="bold")
    return table


def speedup_text(s: float) -> str:
    """``1.23x``, green above 1, red below (rich markup)."""
    color = "green" if s > 1.0 + 1e-9 else ("red" if s < 1.0 - 1e-9 else "")
    return f"[{color}]{s:.2f}x[/{color}]" if color else f"{s:.2f}x"


def render_speedup(df, console, title: str, caption: str) -> None:

    open_loop = df.attrs.get("mode") == "open"
    speed = speedup_table(df)
    second = speedup_table(df, "tpot_ms_p50" if open_loop else "tokens_per_s")
    sizes = [c for c in speed.columns if c != "geomean"]
    table = empty_speedup_table(title, sizes, open_loop)
    for policy, row in speed.iterrows():
        cells = []
        for bs in sizes:
            s, v = row[bs], second.loc[policy, bs]
            detail = f"{v:,.2f}" if open_loop else f"{v:,.0f}"
            head = speedup_text(s)
            cells.append(f"{head}\n[dim]{detail}[/dim]")
        table.add_row(policy, *cells, f"{row['geomean']:.2f}x")
    console.print(table)
    console.print(caption, highlight=False, soft_wrap=True)


def render_open(df, console, title: str, caption: str) -> None:
    """Open loop: one row per (max batch size, policy) with what the speedup ratio hides."""
    table = Table(title=title)
    for name, justify in (("max bs", "right"), ("arrivals req/s", "right"), ("policy", "left"),
                          ("TPOT speedup", "right"),
                          ("mean batch", "right"), ("goodput tok/s", "right"), ("TPOT p50 ms", "right"),
                          ("TPOT p90 ms", "right"), ("TPOT p99 ms", "right"), ("TTFT p50 ms", "right"),
                          ("TTFT p99 ms", "right"), ("SLO met", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    for i, (bs, rows) in enumerate(df.groupby("batch_size", sort=True)):
        if i:
            table.add_section()
        for r in rows.itertuples(index=False):
            s = float(r.speedup_vs_ar)
            color = "green" if s > 1.0 + 1e-9 else ("red" if s < 1.0 - 1e-9 else "")
            speed = f"[{color}]{s:.2f}x[/{color}]" if color else f"{s:.2f}x"
            slo = "-" if r.slo_tpot_ms != r.slo_tpot_ms else f"{r.slo_met_frac:.0%}"  # NaN: no SLO given
            table.add_row(str(bs), f"{r.rate_rps:.2f}", r.policy, speed, f"{r.mean_batch_size:.1f}", f"{r.goodput_tokens_per_s:,.0f}",
                          f"{r.tpot_ms_p50:.2f}", f"{r.tpot_ms_p90:.2f}", f"{r.tpot_ms_p99:.2f}",
                          f"{r.ttft_ms_p50:.1f}", f"{r.ttft_ms_p99:.1f}", slo)
    console.print(table)
    console.print(caption, highlight=False, soft_wrap=True)


def render_open_benchmarks(df, console, num_benchmarks: int, prog: str) -> None:
    """Open loop over several benchmarks: the open-loop table of the per-benchmark means."""
    cols = ["rate_rps", "speedup_vs_ar", "mean_batch_size", "goodput_tokens_per_s", "tpot_ms_p50", "tpot_ms_p90",
            "tpot_ms_p99", "ttft_ms_p50", "ttft_ms_p99", "slo_tpot_ms", "slo_met_frac"]
    mean = df.groupby(["batch_size", "policy"], sort=False)[cols].mean().reset_index()
    render_open(mean, console, f"{prog} open loop: latency and goodput per max batch size, mean over "
                                      f"{num_benchmarks} benchmarks",
                       "each cell: the mean over the benchmarks of that benchmark's figure (a percentile column is "
                       "the mean of the per-benchmark percentiles). TPOT speedup = ar's mean TPOT / the policy's "
                       "at the same arrivals: faster decoding per request, not more throughput; faster policies run "
                       "smaller batches (mean batch) and below saturation goodput is about the offered load.")


def _values(column) -> str:
    """The distinct values of an integer row column, in order: ``400`` or ``400/800``."""
    return "/".join(str(int(v)) for v in sorted(set(column)))


def open_runs_note(df) -> str:
    """What each open-loop run ran, from the rows' own ``measured_requests``, ``warmup_requests`` and
    ``steps``: the arrivals per run, those left out of the latencies, and the engine steps (these vary)."""
    steps = df["steps"]
    arrivals = df["measured_requests"] + df["warmup_requests"]
    return (f"{_values(arrivals)} Poisson arrivals per run, first {_values(df['warmup_requests'])} left out "
            f"of latencies (warm-up); {int(steps.min()):,}-{int(steps.max()):,} engine steps per run (until the "
            f"last request finished)")


def render_benchmarks(df, console, args, cost: str, prog: str) -> None:
    """The published protocol's table: mean speedup over the benchmarks per policy and batch size."""
    mean = benchmark_table(df)
    lo = benchmark_table(df.groupby(["policy", "batch_size"], sort=False)["speedup_vs_ar"].min()
                         .rename("speedup_vs_ar").reset_index().assign(benchmark="min"))
    hi = benchmark_table(df.groupby(["policy", "batch_size"], sort=False)["speedup_vs_ar"].max()
                         .rename("speedup_vs_ar").reset_index().assign(benchmark="max"))
    names = df.attrs.get("benchmarks", [])
    open_loop = args.mode == "open"
    approx = "  [bold yellow]APPROXIMATE (step-indexed trace)[/bold yellow]" if df.attrs.get("approximate") else ""
    sizes = [c for c in mean.columns if c != "geomean"]
    table = empty_speedup_table(f"{prog} {'open' if open_loop else 'closed'} loop: mean speedup over ar, "
                           f"{len(names)} benchmarks{approx}", sizes, open_loop, box=box.SIMPLE_HEAD)
    for policy, row in mean.iterrows():
        cells = []
        for bs in sizes:
            head = speedup_text(row[bs])
            cells.append(f"{head}\n[dim]{lo.loc[policy, bs]:.2f}-{hi.loc[policy, bs]:.2f}[/dim]")
        table.add_row(policy, *cells, f"{row['geomean']:.2f}x")
    console.print(table)
    what = ("speedup = output tokens/s over ar's" if not open_loop else "speedup = ar mean TPOT over the policy's")
    notes = [
        f"cells: mean over the benchmarks of the {what}; below, the lowest-highest benchmark; "
        f"geomean over all {len(names) * len(sizes)} (benchmark, batch size) settings",
        f"benchmarks: {', '.join(names)}",
        f"cost {cost}" + (f" (draft step x{args.draft_scale:g})" if args.draft_scale != 1.0 else "")
        + f"; plain step C_ar: {df['plain_step'].iat[0]}",
        (open_runs_note(df) if open_loop else f"{args.steps} steps per run, first {args.warmup} left out (warm-up)")
        + f"; seed {args.seed}; --out keeps one row per (trace, policy, batch size)",
    ]
    cycles = int(df["trace_cycles"].max())
    if cycles:
        notes.append(f"note: traces ran out and were cycled (up to {cycles} times, fresh offsets): requests "
                     f"replayed more than once")
    console.print("\n".join(notes), highlight=False, soft_wrap=True)


def rate_source(args) -> str:
    """Where an open-loop run's arrival rate came from: ``--rate`` when given, else ``--load``."""
    if getattr(args, "rate", None) is not None:
        return f"--rate {args.rate:g} req/s at every max bs"
    return f"--load {args.load:g} x ar's capacity at each max bs"


def render_runs(df, console, args, traces, costs, prog: str) -> None:
    """One trace and curve per table (one per (trace, cost) of a sweep): closed or open loop."""
    approx = "  [bold yellow]APPROXIMATE (step-indexed trace)[/bold yellow]" if df.attrs.get("approximate") else ""
    loop = "closed loop" if args.mode == "closed" else "open loop"
    groups = df.groupby(["trace", "cost"], sort=False) if args.sweep else [((traces[0], costs[0]), df)]
    for (trace, cost), part in groups:
        part = part.copy()
        part.attrs = dict(df.attrs, approximate=bool(part["approximate"].any()))
        what = ("cells: speedup over ar (output tokens/s ratio), tokens/s below" if args.mode == "closed"
                else "TPOT speedup = ar's mean TPOT / the policy's mean TPOT at the same arrivals (the rate "
                     f"is {rate_source(args)}): how much faster each request decodes, not "
                     "more throughput. Faster policies finish requests sooner, so they run smaller batches "
                     "(mean batch), and below saturation every policy's goodput is about the offered load "
                     "(goodput: output tokens/s of measured requests that meet --slo-tpot-ms, all without "
                     "it). TTFT includes queueing.")
        title = f"{prog} {loop}: speedup over ar{approx}"
        notes = [what, f"trace {trace}", f"cost {cost}; plain step C_ar: {part['plain_step'].iat[0]}"]
        if args.mode == "closed":
            notes.append(f"{args.steps} steps per run, first {args.warmup} left out (warm-up); seed {args.seed}")
        else:
            notes.append(f"{open_runs_note(part)}; prefill: {part['prefill'].iat[0]}; seed {args.seed}")
        cycles = int(part["trace_cycles"].max())
        if cycles:
            notes.append(f"note: the trace ran out and was cycled {cycles} time(s) with a fresh offset "
                         f"(requests replayed more than once)")
        if args.mode == "open":
            render_open(part, console, f"{prog} {loop}: latency and goodput per max batch size{approx}",
                        "\n".join(notes))
        else:
            render_speedup(part, console, title, "\n".join(notes))


def render_selection(df, console, selection_bs: int) -> None:
    """The selection curve: accepted tokens per step at each verification budget, per policy."""
    approx = " (approximate: step-indexed trace)" if bool(df["approximate"].any()) else ""
    table = Table(title=f"selection curve at bs {selection_bs}: accepted tokens per step{approx}")
    table.add_column("budget K", justify="right")
    table.add_column("rho", justify="right")
    policies = list(dict.fromkeys(df["policy"]))
    for name in policies:
        table.add_column(name, justify="right")
    for k, rows in df.groupby("budget", sort=True):
        by = rows.set_index("policy")
        table.add_row(str(k), f"{rows['ratio'].iat[0]:.3f}", *[f"{by.loc[n, 'accepted_tokens']:.1f}" for n in policies])
    console.print(table)


def render_seeds(spread, console, args, prog: str) -> None:
    """``--seeds``: mean, standard deviation and range of the speedup over the seeds."""
    table = Table(title=f"{prog} {args.mode} loop: speedup over ar, mean over {args.seeds} seeds "
                        f"({args.seed}..{args.seed + args.seeds - 1})")
    table.add_column("policy", style="bold")
    sizes = sorted(spread["batch_size"].unique())
    for bs in sizes:
        table.add_column(f"bs {bs}", justify="right")
    for policy, rows in spread.groupby("policy", sort=False):
        by = rows.set_index("batch_size")
        table.add_row(policy, *[f"{by.loc[bs, 'speedup_mean']:.3f}x\n[dim]sd {by.loc[bs, 'speedup_std']:.3f}  "
                                f"{by.loc[bs, 'speedup_min']:.2f}-{by.loc[bs, 'speedup_max']:.2f}[/dim]"
                                for bs in sizes])
    console.print(table)


#: dcut-engine's summary rows, in order (those the run has).
ENGINE_SUMMARY_KEYS = ("cost_source", "sampling", "generated_tokens", "steps", "drafted_steps", "tokens_per_s",
                       "decode_tokens_per_s", "accepted_per_step", "tokens_per_request_step", "mean_ratio",
                       "prefill_ms", "draft_ms", "plan_ms", "verify_ms", "bad_conf_requests", "check")


def render_engine(console, title: str, summary: dict, steps, show_steps: int) -> None:
    """dcut-engine: the summary table, then the first ``show_steps`` step plans."""
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in ENGINE_SUMMARY_KEYS:
        if key in summary:
            v = summary[key]
            table.add_row(key, f"{v:.3f}" if isinstance(v, float) else str(v))
    console.print(table)
    if show_steps > 0 and steps:
        st = Table(title=f"first {min(show_steps, len(steps))} step plans")
        for col in ("step", "bs", "drafted", "lengths", "num_tokens", "ratio", "accepted", "tokens"):
            st.add_column(col, justify="right")
        for s in steps[:show_steps]:
            st.add_row(str(s.step), str(s.batch_size), "yes" if s.drafted else "no", str(s.lengths), str(s.num_tokens),
                       f"{s.ratio:.2f}", str(s.accepted), str(s.committed_tokens))
        console.print(st)


def render_tau(tau: dict[str, dict[str, float]], prompts: int, max_new_tokens: int) -> None:
    """tau per block size (rows) and prompt category (columns) as one rich table."""
    cats = sorted({c for row in tau.values() for c in row} - {"all"}) + ["all"]
    table = Table(title=f"held-out tau ({prompts} prompts x {max_new_tokens} greedy tokens)")
    table.add_column("block / decoding", style="bold")
    for c in cats:
        table.add_column(c, justify="right", style="bold" if c == "all" else None)
    for name, row in tau.items():
        table.add_row(name, *(f"{row[c]:.2f}" if c in row else "-" for c in cats))
    make_console().print(table)
