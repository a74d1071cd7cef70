"""The measuring loop with stand-in workloads: statistics, shuffled order, partial file, resume, OOM."""

import contextlib
import json

import numpy as np
import pytest
import torch

from dcut_sched.profiler.cuda_graphs import GraphTimer, NoCudaError, require_cuda
from dcut_sched.profiler.grid import Cell, build_cells
from dcut_sched.profiler.harness import EagerTimer, PartialMismatch, is_oom, partial_path_for, run_profile, summarise


def test_summarise_percentiles_by_hand():
    # numpy linear percentiles of 1..5: p20 at rank 0.8 -> 1.8, median 3, p80 at rank 3.2 -> 4.2
    assert summarise([5, 1, 3, 2, 4]) == {"median_ms": 3.0, "p20_ms": pytest.approx(1.8),
                                          "p80_ms": pytest.approx(4.2), "repeats": 5}
    for bad in ([], [1.0, float("nan")], [0.0]):
        with pytest.raises(ValueError, match="positive and finite"):
            summarise(bad)


class StepClock:
    """A fake perf_counter: each call to the workload advances it by the cell's scripted duration."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class StandIn:
    """Tiny workload: a call of cell c takes c.num_tokens ms (+ 1 ms on every odd call) on the fake clock."""

    def __init__(self, clock):
        self.clock = clock
        self.calls = []

    def fn_for(self, cell):
        def run():
            self.calls.append(cell.key)
            odd = len(self.calls) % 2
            self.clock.now += (cell.num_tokens + odd) / 1e3
        return run


def test_eager_timer_times_each_call():
    clock = StepClock()
    timer = EagerTimer(StandIn(clock), clock=clock)
    samples = timer.time(Cell("verify", 2, 8), warmups=1, repeats=4)
    # calls 1 (warm-up, odd), then 2..5: even, odd, even, odd -> 8, 9, 8, 9 ms
    np.testing.assert_allclose(samples, [8, 9, 8, 9])
    assert timer.workload.calls == ["verify:2:8"] * 5


def test_run_profile_rows_order_and_partial(tmp_path):
    clock = StepClock()
    work = StandIn(clock)
    cells = build_cells([1, 2], 4)
    partial = tmp_path / "c.json.partial"
    seen = []

    def on_visit(cell, samples):
        seen.append(len(json.loads(partial.read_text())["samples_ms"]) if partial.exists() else 0)

    run = run_profile(EagerTimer(work, clock=clock), cells, warmups=0, repeats=2, seed=7, partial_path=partial,
                      settings={"model": "x"}, progress=False, on_visit=on_visit)
    assert len(run.verify) == 8 and len(run.draft) == 2 and len(run.ar) == 2 and not run.skipped
    # every cell took num_tokens + (0 or 1) ms: the median is num_tokens + 0.5 (an ar cell: bs tokens)
    for row in run.verify:
        assert row["median_ms"] == pytest.approx(row["num_tokens"] + 0.5) and row["repeats"] == 2
    assert [r["batch_size"] for r in run.ar] == [1, 2]
    np.testing.assert_allclose([r["median_ms"] for r in run.ar], [1.5, 2.5])
    assert [r["batch_size"] for r in run.draft] == [1, 2]
    visit = list(dict.fromkeys(work.calls))
    assert sorted(visit) == sorted(c.key for c in cells) and visit != [c.key for c in cells]  # shuffled
    assert all(work.calls[2 * i] == work.calls[2 * i + 1] for i in range(len(cells)))  # rounds=1: back to back
    again = StandIn(StepClock())
    run_profile(EagerTimer(again, clock=again.clock), cells, warmups=0, repeats=2, seed=7, progress=False)
    assert list(dict.fromkeys(again.calls)) == visit  # same seed, same order
    # the partial file grew by one cell after each visit (written before the next visit started)
    assert seen == list(range(len(cells)))
    assert len(json.loads(partial.read_text())["samples_ms"]) == len(cells)


def test_rounds_interleave_cells_and_warm_up_once():
    clock = StepClock()
    work = StandIn(clock)
    cells = build_cells([1, 2], 4, draft=False, ar=False)
    run = run_profile(EagerTimer(work, clock=clock), cells, warmups=2, repeats=3, rounds=3, seed=1, progress=False)
    # 8 cells x (2 warm-ups on the first visit + 3 samples), one sample per cell per pass
    assert len(work.calls) == 8 * 5 and all(r["repeats"] == 3 for r in run.verify)
    first_pass = work.calls[:8 * 3]  # each visit of pass 1 = 2 warm-ups + 1 sample
    assert len(set(first_pass)) == 8
    later = work.calls[24:]
    assert len(later) == 16 and set(later[:8]) == set(later[8:]) == {c.key for c in cells}
    assert later[:8] != later[8:]  # each pass in its own shuffled order
    with pytest.raises(ValueError, match="rounds <= repeats"):
        run_profile(EagerTimer(work, clock=clock), cells, warmups=0, repeats=2, rounds=3, progress=False)


class Interrupting(EagerTimer):
    def __init__(self, workload, clock, after):
        super().__init__(workload, clock=clock)
        self.after = after
        self.timed = 0

    def time(self, cell, warmups, repeats):
        if self.timed == self.after:
            raise KeyboardInterrupt
        self.timed += 1
        return super().time(cell, warmups, repeats)


def test_interrupt_keeps_cells_and_resume_finishes(tmp_path):
    cells = build_cells([1, 2, 4], 4)
    partial = partial_path_for(tmp_path / "c.json")
    assert partial.name == "c.json.partial"
    clock = StepClock()
    with pytest.raises(KeyboardInterrupt):
        run_profile(Interrupting(StandIn(clock), clock, after=5), cells, warmups=0, repeats=3, partial_path=partial,
                    settings={"model": "x", "block_size": 4}, progress=False)
    kept = json.loads(partial.read_text())["samples_ms"]
    assert len(kept) == 5 and all(len(v) == 3 for v in kept.values())
    work = StandIn(StepClock())
    run = run_profile(EagerTimer(work, clock=work.clock), cells, warmups=0, repeats=3, partial_path=partial,
                      settings={"model": "x", "block_size": 4}, resume=True, progress=False)
    assert run.resumed_cells == 5
    assert len(set(work.calls)) == len(cells) - 5 and not set(work.calls) & set(kept)
    assert len(run.verify) + len(run.draft) + len(run.ar) == len(cells)
    with pytest.raises(PartialMismatch, match=r"block_size: 4 -> 8"):
        run_profile(EagerTimer(work, clock=work.clock), cells, warmups=0, repeats=3, partial_path=partial,
                    settings={"model": "x", "block_size": 8}, resume=True, progress=False)
    partial.write_text("{")
    with pytest.raises(PartialMismatch, match="not valid JSON.*--fresh"):
        run_profile(EagerTimer(work, clock=work.clock), cells, warmups=0, repeats=1, partial_path=partial,
                    resume=True, progress=False)


class OomAt(EagerTimer):
    def __init__(self, workload, clock, bad, exc):
        super().__init__(workload, clock=clock)
        self.bad, self.exc = bad, exc

    def time(self, cell, warmups, repeats):
        if cell.key == self.bad:
            raise self.exc
        return super().time(cell, warmups, repeats)


def test_oom_cell_is_skipped_other_errors_raise():
    cells = build_cells([1, 2], 4)
    clock = StepClock()
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    run = run_profile(OomAt(StandIn(clock), clock, "verify:2:8", oom), cells, warmups=0, repeats=1, progress=False)
    assert list(run.skipped) == ["verify:2:8"] and "out of memory" in run.skipped["verify:2:8"]
    assert len(run.verify) == 7 and (2, 8) not in {(r["batch_size"], r["num_tokens"]) for r in run.verify}
    with pytest.raises(ZeroDivisionError):
        run_profile(OomAt(StandIn(clock), clock, "verify:2:8", ZeroDivisionError()), cells, warmups=0, repeats=1,
                    progress=False)
    assert is_oom(MemoryError()) and is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    assert not is_oom(RuntimeError("shape mismatch")) and not is_oom(ValueError("out of memory"))


# ---------------------------------------------------------------- CUDA graphs, with a stand-in torch.cuda
class FakeEvent:
    def __init__(self, log, enable_timing=False):
        assert enable_timing
        self.log = log

    def record(self):
        self.t = self.log["clock"]

    def elapsed_time(self, other):
        return other.t - self.t


class FakeGraph:
    def __init__(self, log):
        self.log = log
        self.fn = None

    def replay(self):
        self.log["replays"].append(self.cell)
        self.log["clock"] += self.cost


class FakeCuda:
    """Just enough of torch.cuda for GraphTimer: records captures, pools, streams and replays."""

    def __init__(self, oom_cells=()):
        self.log = {"clock": 0.0, "replays": [], "captures": [], "pools": [], "warm_stream": [], "empty_cache": 0}
        self.oom_cells = set(oom_cells)
        self.current_cell = None
        self.side = False

    def graph_pool_handle(self):
        return ("pool", 1)

    def Stream(self):
        return self

    def wait_stream(self, other):
        pass

    def current_stream(self):
        return self

    @contextlib.contextmanager
    def stream(self, s):
        self.side = True
        yield
        self.side = False

    def CUDAGraph(self):
        return FakeGraph(self.log)

    @contextlib.contextmanager
    def graph(self, g, pool=None):
        self.log["pools"].append(pool)
        self.capturing = g
        yield
        self.capturing = None

    def Event(self, enable_timing=False):
        return FakeEvent(self.log, enable_timing)

    def synchronize(self):
        pass

    def empty_cache(self):
        self.log["empty_cache"] += 1


class GraphWorkload:
    def __init__(self, cuda):
        self.cuda = cuda
        self.eager_calls = []

    def fn_for(self, cell):
        def run():
            if cell.key in self.cuda.oom_cells:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory")
            g = getattr(self.cuda, "capturing", None)
            if g is not None:
                g.cell, g.cost = cell.key, float(cell.num_tokens)
                self.cuda.log["captures"].append(cell.key)
            else:
                assert self.cuda.side, "warm-up must run on the side stream"
                self.eager_calls.append(cell.key)
        return run


def test_graph_timer_captures_largest_first_in_one_pool_and_times_replays():
    cuda = FakeCuda()
    work = GraphWorkload(cuda)
    timer = GraphTimer(work, cuda=cuda, capture_warmups=2)
    cells = build_cells([1, 2, 4], 4)
    run = run_profile(timer, cells, warmups=3, repeats=4, progress=False)
    assert {c.key for c in timer.graphs} >= {"ar:1", "ar:2", "ar:4"}  # one full graph per plain decode step
    assert [r["median_ms"] for r in run.ar] == [1.0, 2.0, 4.0]
    sizes = [c.num_tokens for c in timer.capture_order]
    assert sizes == sorted(sizes, reverse=True) and len(sizes) == len(cells)
    assert cuda.log["pools"] == [("pool", 1)] * len(cells)
    assert all(work.eager_calls.count(c.key) == 2 for c in cells)
    assert len(cuda.log["replays"]) == len(cells) * (3 + 4)
    assert set(timer.fns) == set(cells)  # the static inputs of every graph stay alive
    for row in run.verify:  # each fake replay "takes" num_tokens ms
        assert row["median_ms"] == row["p20_ms"] == row["p80_ms"] == row["num_tokens"]


def test_graph_capture_oom_skips_cell():
    cuda = FakeCuda(oom_cells={"verify:4:16"})
    timer = GraphTimer(GraphWorkload(cuda), cuda=cuda)
    run = run_profile(timer, build_cells([2, 4], 4, draft=False, ar=False), warmups=0, repeats=1, progress=False)
    assert run.skipped == {"verify:4:16": "out of memory during capture: CUDA out of memory"}
    assert cuda.log["empty_cache"] == 1 and len(run.verify) == 7


def test_require_cuda_message(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NoCudaError, match="--gpu needs a CUDA device.*use --cpu"):
        require_cuda()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_graph_capture_on_cuda():
    from dcut_sched.model.config import PRESETS
    from dcut_sched.profiler.analytic import parse_draft_spec
    from dcut_sched.profiler.workload import ForwardWorkload

    work = ForwardWorkload(PRESETS["tiny"], 4, 32, 2, parse_draft_spec("dflash:1"), dtype=torch.bfloat16, device="cuda")
    timer = GraphTimer(work)
    run = run_profile(timer, build_cells([1, 2], 4), warmups=2, repeats=5, progress=False)
    assert len(run.verify) == 8 and len(run.draft) == 2 and len(run.ar) == 2 and not run.skipped
    assert Cell("ar", 2, 2) in timer.graphs  # the plain decode step is captured as one full graph


def test_resume_in_the_middle_of_a_round(tmp_path):
    cells = build_cells([1, 2], 4, draft=False, ar=False)
    partial = tmp_path / "p.partial"
    first = StandIn(StepClock())
    with pytest.raises(KeyboardInterrupt):
        run_profile(Interrupting(first, first.clock, after=11), cells, warmups=0, repeats=3, rounds=3,
                    partial_path=partial, progress=False)
    kept = json.loads(partial.read_text())["samples_ms"]
    assert sorted(len(v) for v in kept.values()) == [1] * 5 + [2] * 3  # a full pass, then 3 cells of the second
    second = StandIn(StepClock())
    run = run_profile(EagerTimer(second, clock=second.clock), cells, warmups=0, repeats=3, rounds=3,
                      partial_path=partial, resume=True, progress=False)
    assert len(first.calls) + len(second.calls) == 8 * 3
    assert all(r["repeats"] == 3 for r in run.verify) and len(run.verify) == 8


@pytest.mark.parametrize("samples, match", [
    ({"bogus:1": [1.0]}, r"field samples_ms.bogus:1: not a cell of this profile"),
    ("many", r"1,000 samples, more than --repeats 3"),
    ("huge", r"samples_ms\..*less than or equal to 10000000"),
])
def test_resume_refuses_samples_this_profile_would_not_take(tmp_path, samples, match):
    """A partial of the same settings, but samples for a cell this profile lacks, more samples than
    --repeats, or a time no curve row may hold: refused naming the file and the field, kept as it is."""
    cells = build_cells([1, 2], 4)
    partial = partial_path_for(tmp_path / "c.json")
    key = cells[0].key
    if samples == "many":
        samples = {key: [1.0] * 1000}
    elif samples == "huge":
        samples = {key: [1e300, 1e300]}
    partial.write_text(json.dumps({"schema": "dcut.profile-partial/1", "settings": {"model": "x"},
                                   "samples_ms": samples, "skipped": {}, "measure_seconds": 1.0}))
    before = partial.read_bytes()
    work = StandIn(StepClock())
    with pytest.raises(PartialMismatch, match=match):
        run_profile(EagerTimer(work, clock=work.clock), cells, warmups=0, repeats=3, partial_path=partial,
                    settings={"model": "x"}, resume=True, progress=False)
    assert partial.read_bytes() == before and not work.calls
