"""RatioController on CUDA tensors: at most one host sync per planned step, same plan as on the CPU."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from dcut_sched import RatioController

pytestmark = pytest.mark.cuda
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
@pytest.mark.parametrize("policy", ["dcut", "fine", "topk", "threshold", "full"])
@pytest.mark.parametrize("bs", [4, 16, 64])
def test_one_host_sync_per_step_and_cpu_equal_plan(make_curve, policy, bs):
    block = 8
    curve = make_curve(block_size=block, batch_sizes=(1, 64))
    conf = torch.from_numpy(np.random.default_rng(bs).beta(4, 1, size=(bs, block - 1)).astype(np.float32))
    cpu = RatioController(curve, block, policy=policy).plan(conf)
    ctrl = RatioController(curve, block, policy=policy)
    gpu_conf = conf.cuda()
    ctrl.plan(gpu_conf)  # warm-up: per-shape tables, CUDA context
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plan = ctrl.plan(gpu_conf)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) <= 1, [str(w.message) for w in syncs]
    assert plan.lengths.device.type == "cuda"
    assert plan.lengths.cpu().tolist() == cpu.lengths.tolist()
    assert plan.num_tokens == cpu.num_tokens
