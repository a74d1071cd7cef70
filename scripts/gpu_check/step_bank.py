"""Step ``bank``: ``VerifyGraphBank`` captures and replays the project's verification forward.

Model: the Qwen3-8B shape with ``bank_layers`` layers (random weights, bf16; the same kernels as
the full model, a smaller error budget), context ``bank_context_len``, B = 16. Cells: at two batch
sizes, the AR point and the four D-Cut buckets, in the profiler's layout (``input_ids``,
``position_ids``, ``cache_slots`` of shape [bs, ceil(K / bs)]). Padding: token ids 0, positions 0,
cache slot = a scratch slot after the block that no query sees, so padded tokens and padded
requests write nowhere a real query reads.

Checks: the bank captured graphs; for requests on an exact cell, padded along tokens, and padded
along the batch, the replayed logits of the real (request, slot) pairs equal an eager forward of the
unpadded request (relative to the largest logit: <= 2e-2 in bf16, 1e-4 in float32; a request whose
rows are longer than the first candidate cell's buffers is served by a larger cell) and the replay
equals the eager bank on the same padded buffers; the cached context is bit-for-bit unchanged after
every call; a request that no captured buffer can hold is refused with ``ValueError``. Figures:
capture time, replay and eager ms per cell. The dry run runs the bank's eager path (the same padded
buffers) against the plain forward on the CPU in float32.
"""

from __future__ import annotations

import math
import time

from common import StepResult, can_run
from settings import Settings

RATIOS = (0.25, 0.5, 0.75, 1.0)
TOL = {"bfloat16": 2e-2, "float32": 1e-4}


def _rel_err(got, want) -> float:
    scale = float(want.abs().max())
    return float((got.float() - want.float()).abs().max()) / (scale if scale > 0 else 1.0)


def run_bank(res: StepResult, cfg: Settings) -> None:
    if not can_run(res, ("torch", "numpy"), cuda=True, dry_run=cfg.dry_run):
        return
    import torch

    from dcut_sched.controller import VerifyGraphBank
    from dcut_sched.model.config import PRESETS
    from dcut_sched.model.llama import LlamaModel
    from dcut_sched.policies import budget_from_ratio

    gpu = not cfg.dry_run
    dev = torch.device(cfg.device)
    dtype_name = "bfloat16" if gpu else "float32"
    dtype = getattr(torch, dtype_name)
    base = PRESETS["qwen3-8b" if gpu else "tiny"]
    config = base.replace(num_layers=cfg.bank_layers, name=f"{base.name}-{cfg.bank_layers}-layers")
    B, c = cfg.block_size, cfg.bank_context_len
    max_bs = max(cfg.bank_batch_sizes)
    model = LlamaModel.random_init(config, seed=0, dtype=dtype, device=dev)
    scratch = c + B  # one slot after the block: pad writes go there, kv_len never reaches it
    cache = model.new_cache(max_bs, c + B + 1)
    gen = torch.Generator(device=dev).manual_seed(1)
    for t in (cache.k, cache.v):
        t[:, :, :, :c].normal_(0.0, 1.0, generator=gen)
    context = (cache.k[:, :, :, :c].clone(), cache.v[:, :, :, :c].clone())
    res.figure("model", {"name": config.name, "dtype": dtype_name, "context_len": c, "block_size": B})

    def make_inputs(bs: int, num_tokens: int):
        t = math.ceil(num_tokens / bs)
        pos = (c + torch.arange(t, device=dev))[None, :].repeat(bs, 1)
        return torch.zeros(bs, t, dtype=torch.int64, device=dev), pos, pos.clone()

    def verify(ids, pos, slots):
        with torch.inference_mode():
            return model(ids, pos, cache, cache_slots=slots, kv_len=c + ids.shape[1])

    cells = sorted({(bs, k) for bs in cfg.bank_batch_sizes
                    for k in (bs, *(budget_from_ratio(r, bs, B) for r in RATIOS))})
    res.figure("cells", cells)
    pads = [0, 0, scratch]
    t0 = time.perf_counter()
    bank = VerifyGraphBank(verify, cells, make_inputs=make_inputs, pad_values=pads)
    if gpu:
        torch.cuda.synchronize()
    res.measure(f"capture {len(cells)} cells (largest first, one pool)" if gpu else f"build {len(cells)} eager cells",
                round(time.perf_counter() - t0, 3), "s")
    if gpu:
        res.check("bank captured CUDA graphs", bank.enabled and bank.pool is not None, value=repr(bank))
        eager_bank = VerifyGraphBank(verify, cells, make_inputs=make_inputs, pad_values=pads, enabled=False)
    else:
        res.check("bank captured CUDA graphs", None, value=repr(bank), skip_reason="dry run: the eager path stands in")
        eager_bank = None

    b0, b1 = cfg.bank_batch_sizes
    cases = [("exact cell", b0, 4), ("exact cell", b1, 8), ("token padding", b0, 3), ("token padding", b1, 10),
             ("token padding", b0, 13), ("batch padding", b1 - 1, 4), ("batch padding", b0 - 1, 1),
             # rows longer than the first candidate cell's buffers: served by a larger cell (was refused)
             ("longer rows", max(1, b0 // 2), 8)]
    tol = TOL[dtype_name]
    ids_gen = torch.Generator(device=dev).manual_seed(2)
    for kind, bs, t in cases:
        if bs < 1:
            continue
        num_tokens = bs * t  # every request verifies t slots: the padded-to-longest convention
        with res.guard(f"{kind}: {bs} requests x {t} slots"):
            ids = torch.randint(0, config.vocab_size, (bs, t), generator=ids_gen, device=dev)
            pos = (c + torch.arange(t, device=dev))[None, :].repeat(bs, 1)
            cell = bank.cell_for(bs, num_tokens, [ids.shape, pos.shape, pos.shape])
            want = verify(ids, pos, pos.clone()).clone()
            full = bank(bs, num_tokens, ids, pos, pos.clone())
            finite = bool(torch.isfinite(full).all())
            got = full[:bs, :t].clone()
            err = _rel_err(got, want)
            agree = float((got.argmax(-1) == want.argmax(-1)).float().mean())
            detail = f"argmax agreement {agree:.3f}" + ("" if finite else "; NaN/inf in the padded cell's logits")
            if eager_bank is not None:
                same_cell = eager_bank(bs, num_tokens, ids, pos, pos.clone())[:bs, :t]
                detail += f"; replay vs eager at the padded cell {_rel_err(got, same_cell):.2e}"
            res.check(f"{kind}: {bs} x {t} slots -> cell {cell}: replayed logits = eager (max err / max |logit|)",
                      err <= tol and finite, value=err, goal=f"<= {tol:g}", detail=detail)
    with res.guard("cached context unchanged"):
        same = bool(torch.equal(cache.k[:, :, :, :c], context[0]) and torch.equal(cache.v[:, :, :, :c], context[1]))
        res.check("padding writes only the block and the scratch slot: cached context unchanged", same, value=same)
    with res.guard("refusal"):
        bs = max(1, b0 // 2)
        t = max(math.ceil(k / b) for b, k in cells) + 1  # longer than any captured buffer's rows
        name = f"a request no captured buffer holds is refused ({bs} x {t} slots)"
        ids = torch.zeros(bs, t, dtype=torch.int64, device=dev)
        pos = (c + torch.arange(t, device=dev))[None, :].repeat(bs, 1)
        try:
            bank(bs, bs * t, ids, pos, pos.clone())
        except ValueError as exc:
            res.check(name, "does not fit" in str(exc) or "no captured cell" in str(exc), value="ValueError",
                      detail=str(exc)[:200])
        else:
            res.check(name, False, detail="the bank accepted inputs larger than every cell's static buffers")
    with res.guard("timing"):
        _time_cells(res, bank, eager_bank, cells, make_inputs, gpu)


def _time_cells(res: StepResult, bank, eager_bank, cells, make_inputs, gpu: bool) -> None:
    import statistics

    rows = {}
    for cell in cells:
        inputs = make_inputs(*cell)
        replay = _median_ms(lambda: bank(*cell, *inputs), gpu)
        eager = _median_ms(lambda: eager_bank(*cell, *inputs), gpu) if eager_bank is not None else None
        rows[f"{cell[0]}x{cell[1]}"] = {"replay_ms": replay, "eager_ms": eager}
    res.figure("ms_per_cell", rows)
    if gpu:
        ratio = statistics.median(r["eager_ms"] / r["replay_ms"] for r in rows.values())
        res.measure("eager / replay time, median over cells", round(ratio, 2), "x",
                    detail="; ".join(f"{k}: {v['replay_ms']:.3f} vs {v['eager_ms']:.3f} ms" for k, v in rows.items()))
    else:
        res.measure("eager bank call, median over cells", round(statistics.median(r["replay_ms"] for r in rows.values()), 3),
                    "ms")


def _median_ms(fn, gpu: bool, warmups: int = 3, repeats: int = 10) -> float:
    import statistics

    import torch

    for _ in range(warmups):
        fn()
    if gpu:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for s, e in zip(starts, ends):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(out)
