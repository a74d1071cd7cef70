"""Sweeps: :func:`~.simulate.simulate` over traces x cost curves x batch sizes, in parallel processes.

One job is one (trace file, cost-curve file, batch size) with every policy, so each job holds its own
``ar`` baseline and the same request sequence for every policy. Jobs go to any
:class:`concurrent.futures.Executor`; by default a :class:`~concurrent.futures.ProcessPoolExecutor`
with ``jobs`` workers. Workers receive file paths and load them themselves (cached per process).

On a cluster the same call runs unchanged with an executor from an existing engine:
:func:`dask_executor` opens a ``distributed.Client`` on a Dask scheduler address and hands back its
``get_executor()`` (``dcut-sim --sweep --scheduler dask --scheduler-address tcp://HOST:8786``). The
workers must be able to import ``dcut_sched`` and read the trace and curve paths (a shared file
system); the project has no scheduler of its own.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import socket
import threading
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from typing import Any, Callable, Iterator, Mapping, Sequence

import pandas as pd

from ..cost_curve import CostCurve
from ..traces import Trace
from .config import SimConfig, SimulationError
from .parallel import worker_ignores_signals
from .results import CLOSED_COLUMNS, OPEN_COLUMNS
from .simulate import check_simulation, sim_config, simulate

__all__ = ["dask_executor", "sweep", "sweep_job"]


@functools.lru_cache(maxsize=8)
def _load_trace(path: str) -> Trace:
    return Trace.load(path)


@functools.lru_cache(maxsize=8)
def _load_cost(path: str) -> CostCurve:
    return CostCurve.load(path, check_hardware=False)


#: Default of ``dask_executor(timeout_s=...)`` and ``dcut-sim --scheduler-timeout``, seconds.
DEFAULT_SCHEDULER_TIMEOUT_S = 10.0


def _connect_client(address: str, timeout_s: float):
    """``distributed.Client(address)`` under a hard deadline of ``timeout_s`` seconds.

    ``Client(timeout=...)`` bounds the TCP connect but not the handshake that follows: an address
    that accepts connections and never answers (a listening socket, an HTTP server) blocks the
    constructor without end. The constructor therefore runs in a daemon thread and this call waits
    for it at most ``timeout_s``; a client that connects after the deadline is closed by its thread.

    Raises:
        ValueError: no scheduler answered in time, or the connection failed (the cause is named).
    """
    from distributed import Client

    box: dict[str, Any] = {}
    done, abandoned = threading.Event(), threading.Event()

    class _Client(Client):
        """A client whose half-built instance (its constructor raised) is closed here, quietly and
        within a bound, instead of by its ``__del__`` later (a traceback after the error line)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            box["half"] = self
            super().__init__(*args, **kwargs)

        def __del__(self) -> None:
            with contextlib.suppress(Exception):
                super().__del__()

    def connect() -> None:
        try:
            client = _Client(address, timeout=timeout_s, set_as_default=False)
        except Exception as exc:  # reported by the waiting thread
            box["error"] = exc
            _close_half_built(box.pop("half", None))
        else:
            box.pop("half", None)
            box["client"] = client
            if abandoned.is_set():
                client.close()
        finally:
            done.set()

    threading.Thread(target=connect, name="dcut-dask-connect", daemon=True).start()
    answered = done.wait(timeout_s)
    if not answered:
        abandoned.set()
        if done.is_set() and "client" in box:  # connected in the instant between wait and set
            box["client"].close()
    fix = "check the address, or allow longer with --scheduler-timeout SECONDS"
    if not answered:
        raise ValueError(f"no Dask scheduler answered at {address!r} within {timeout_s:g} s "
                         f"(--scheduler-timeout); {fix}")
    if "error" in box:
        error = box["error"]
        if isinstance(error, (OSError, TimeoutError)):  # refused, reset, closed, timed out: the cause says which
            cause = " ".join(str(error).split())[:200] or type(error).__name__
        else:  # a reply that is not Dask's protocol: its decoder's complaint (sizes, dimensions) means nothing here
            cause = "something answered there, but not a Dask scheduler: its reply is not the Dask protocol"
        raise ValueError(f"no Dask scheduler answered at {address!r} within {timeout_s:g} s "
                         f"(--scheduler-timeout) ({cause}); {fix}")
    return box["client"]


def _close_half_built(client: Any) -> None:
    """Close a client whose constructor raised, at most about a second, with nothing printed: its
    own close waits on a connection that never opened (``2 x timeout``), so the loop is stopped
    and the client marked closed, leaving its ``__del__`` nothing to do."""
    if client is None:
        return
    with contextlib.suppress(Exception):
        client.close(timeout=1)
    with contextlib.suppress(Exception):
        client.status = "closed"
        client._loop_runner.stop()


def _check_address(address: str) -> None:
    """Refuse an address ``distributed`` cannot parse (``tcp://::::``, a missing host or port) or that is
    not plain TCP (``tls://`` needs a security context, ``inproc://``/``ucx://``/``ws://`` other set-ups)
    before connecting: a malformed one otherwise fails inside the client's constructor,
    whose half-built client then blocks interpreter exit on its own close."""
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        protocol, location = parse_address(address)  # no scheme: tcp, as the client does
        if protocol != "tcp":  # tls needs a security context, inproc/ucx/ws other set-ups: none is passed here
            raise ValueError(f"protocol {protocol!r} is not supported here, only tcp://")
        host, port = parse_host_port(location)
        if not host:
            raise ValueError("no host")
        if not 0 < port < 65536:
            raise ValueError(f"port {port} is not in 1..65535")
    except ValueError as exc:
        raise ValueError(f"--scheduler-address {address[:80]!r} is not a Dask scheduler address ({exc}); "
                         f"give e.g. tcp://10.0.0.5:8786") from None


@contextlib.contextmanager
def dask_executor(address: str, *, timeout_s: float = DEFAULT_SCHEDULER_TIMEOUT_S) -> Iterator[Executor]:
    """A :class:`concurrent.futures.Executor` on the Dask cluster at ``address``, for :func:`sweep`.

    Args:
        address: the scheduler address, e.g. ``tcp://10.0.0.5:8786`` (``distributed.LocalCluster``'s
            ``scheduler_address`` in tests).
        timeout_s: the most seconds to wait for the scheduler to connect and answer; finite and > 0.
            The wait is bounded whatever listens at ``address`` (nothing, a socket that never
            answers, another protocol's server).

    Yields:
        ``distributed.Client(address).get_executor()``; the client is closed on exit (the cluster
        keeps running: it is not ours).

    Raises:
        ValueError: ``timeout_s`` is not a finite positive number, ``distributed`` is not installed
            (``pip install 'dcut-sched[cluster]'``), or no scheduler answered at ``address`` within
            ``timeout_s`` (the message names the address and ``--scheduler-timeout``).
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
            math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s={timeout_s!r}: give a finite number of seconds > 0")
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise ValueError(
            "--scheduler dask needs the 'distributed' package: pip install 'dcut-sched[cluster]' "
            "(or pip install distributed)"
        ) from None
    _check_address(address)
    client = _connect_client(address, float(timeout_s))
    try:
        yield client.get_executor()
    finally:
        client.close()


def sweep_job(trace_path: str, cost_path: str, batch_size: int, config: SimConfig | Mapping[str, Any]) -> pd.DataFrame:
    """One sweep cell: :func:`simulate` on the files at one batch size.

    ``config``: the sweep's :class:`~.config.SimConfig` (one picklable object; a dict of its fields
    is accepted too). A plain module-level function of picklable arguments, so any executor or
    cluster engine can run it. ``trace_path``/``cost_path`` are absolute (:func:`sweep` resolves
    them before submitting), since a worker's working folder is its own.

    Raises:
        SimulationError: a file this worker cannot see, naming its host, process and working
            folder (the workers must see the paths dcut-sim read, e.g. on a shared file system).
    """
    if not isinstance(config, SimConfig):
        config = SimConfig.from_dict(config)
    for flag, path in (("--trace", trace_path), ("--cost", cost_path)):
        if not os.path.isfile(path):  # checked by the client before submitting: this worker sees another file system
            raise SimulationError(
                f"{flag} {path}: no such file in the view of the sweep worker on {socket.gethostname()} (pid "
                f"{os.getpid()}, working folder {os.getcwd()}), though dcut-sim itself read it; the workers must "
                f"see the --trace/--cost paths at the same place (a shared file system)")
    df = simulate(_load_trace(trace_path), _load_cost(cost_path), config.replace(batch_sizes=(int(batch_size),)))
    df["trace"] = trace_path
    df["cost"] = cost_path
    return df


def sweep(
    traces: Sequence[str | os.PathLike],
    costs: Sequence[str | os.PathLike],
    batch_sizes: Sequence[int],
    config: SimConfig | None = None,
    *,
    jobs: int | None = None,
    executor: Executor | None = None,
    on_job: Callable[[int, int], None] | None = None,
    **options: Any,
) -> pd.DataFrame:
    """Run :func:`simulate` for every (trace, cost curve, batch size), in parallel.

    Args:
        traces / costs: file paths (loaded and validated first in this process, so a bad file fails
            fast with its own message).
        batch_sizes: batch sizes (each a job per trace and curve).
        config: the options of every job (:class:`~.config.SimConfig`; its ``batch_sizes`` are
            replaced by ``batch_sizes``), shipped to the workers as one object.
        jobs: worker processes of the default executor (None: ``os.cpu_count()``).
        executor: any ``concurrent.futures.Executor`` (e.g. a Dask ``Client.get_executor()`` on a
            cluster); it is not shut down here.
        on_job: called as ``on_job(done, total)`` after each job.
        **options: SimConfig fields (policies, mode, num_steps, seed, ...), applied over ``config``.

    Returns:
        The rows of every job, ordered by trace, cost curve, batch size, policy; ``trace`` and
        ``cost`` columns name the files.

    Raises:
        TraceError / CostCurveError / SimulationError: as :func:`simulate`, for the first bad job.
    """
    traces = [str(t) for t in traces]
    costs = [str(c) for c in costs]
    config = sim_config(config, **options, batch_sizes=tuple(batch_sizes))
    # Fail fast, in this process, before any worker time: files, block sizes, batch-size ranges, options.
    for t, c in itertools.product(traces, costs):
        trace = _load_trace(t)
        cost = _load_cost(c)
        try:
            check_simulation(trace, cost, config)
        except ValueError as exc:  # a pair that cannot run (e.g. a B = 8 trace beside B = 16 curves): name both
            if len(traces) * len(costs) == 1:
                raise
            raise type(exc)(f"the sweep pairs every --trace with every --cost, and trace {t} (B = "
                            f"{trace.block_size}) with cost curve {c} cannot run: {exc}") from None
    cells = list(itertools.product(traces, costs, config.batch_sizes))
    # a worker runs in its own working folder (a Dask worker started elsewhere): it gets absolute paths,
    # and the rows keep the names as given
    where = {p: os.path.abspath(p) for p in (*traces, *costs)}
    own = executor is None
    workers = jobs if jobs is not None else (os.cpu_count() or 1)
    pool = (ProcessPoolExecutor(max_workers=max(1, min(workers, len(cells))), initializer=worker_ignores_signals)
            if own else executor)  # never more workers than cells
    frames: dict[int, pd.DataFrame] = {}
    try:
        futures = {pool.submit(sweep_job, where[t], where[c], int(bs), config): n for n, (t, c, bs) in enumerate(cells)}
        for done, fut in enumerate(as_completed(futures), start=1):
            n = futures[fut]
            frames[n] = fut.result().assign(trace=cells[n][0], cost=cells[n][1])
            if on_job is not None:
                on_job(done, len(cells))
    except KeyboardInterrupt:
        # Ctrl-C / SIGTERM reach this process; the workers ignore them, so stop them here rather
        # than waiting for their running jobs.
        if own:
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()
        raise
    finally:
        if own:
            pool.shutdown(cancel_futures=True)
    df = pd.concat([frames[n] for n in range(len(cells))], ignore_index=True)
    lead = CLOSED_COLUMNS + (OPEN_COLUMNS if config.mode == "open" else [])
    df = df[["trace", "cost"] + lead + [c for c in df.columns if c not in lead + ["trace", "cost"]]]
    df.attrs["approximate"] = bool(df["approximate"].any())
    df.attrs["mode"] = config.mode
    return df
