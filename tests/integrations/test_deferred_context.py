"""The deferred DFlash context (``dcut_sched.integrations.vllm.deferred_context``), without vLLM.

A model of vLLM's drafter cache checks the rule: vLLM's own pass writes every step's context tokens
(rejected drafts included, overwritten later); with deferral the undrafted steps write only what
:class:`DeferredContext` returns. At every drafted pass the two caches hold the same values, and after
every step every full block (committed tokens up to its last slot) does.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dcut_sched.integrations.vllm.deferred_context import DeferredContext


def _step(ctx, batch, drafted, prompt=None):
    """batch: [(req_id, first position, token count)]; hidden rows: (position, a random step marker)."""
    positions = torch.cat([torch.arange(p, p + n) for _, p, n in batch])
    hidden = torch.stack([positions.double(), torch.rand(positions.shape[0], dtype=torch.float64)], dim=1)
    return positions, hidden, ctx.step([r for r, _, _ in batch], [n for _, _, n in batch],
                                       [p + n for _, p, n in batch], hidden, drafted=drafted, num_prompt_tokens=prompt)


def test_undrafted_tokens_wait_for_the_next_drafted_pass():
    ctx = DeferredContext(fill_unit=128)
    assert _step(ctx, [("a", 10, 1), ("b", 20, 1)], drafted=False)[2] is None
    assert _step(ctx, [("a", 11, 1), ("b", 21, 1)], drafted=False)[2] is None
    assert ctx.num_waiting == 4
    # the batch reordered and a request joined: rows are this step's, the step's own tokens not returned
    _, _, write = _step(ctx, [("c", 0, 5), ("b", 22, 1), ("a", 12, 1)], drafted=True)
    got = sorted(zip(write.rows.tolist(), write.positions.tolist()))
    assert got == [(1, 20), (1, 21), (2, 10), (2, 11)]
    assert torch.equal(write.hidden[:, 0], write.positions.double())
    assert ctx.num_waiting == 0


def test_a_token_in_a_blocks_last_slot_writes_its_request_now():
    ctx = DeferredContext(fill_unit=4)
    _step(ctx, [("a", 1, 1), ("b", 5, 1)], drafted=False)
    _, _, write = _step(ctx, [("a", 2, 1), ("b", 6, 2)], drafted=False)  # b fills slot 7, the block's last
    assert write.rows.tolist() == [1, 1, 1] and write.positions.tolist() == [5, 6, 7]
    assert ctx.num_waiting == 2  # a's two tokens wait


def test_an_unscheduled_request_keeps_its_tokens_a_forgotten_one_drops_them():
    ctx = DeferredContext(fill_unit=128)
    _step(ctx, [("a", 1, 1), ("b", 1, 1), ("c", 1, 1)], drafted=False)
    _, _, write = _step(ctx, [("b", 2, 1)], drafted=True)       # a and c not scheduled: they keep theirs
    assert write.rows.tolist() == [0] and write.positions.tolist() == [1]
    assert ctx.requests == {"a", "c"} and ctx.num_waiting == 2
    ctx.retain({"a", "b"})                                       # c finished
    _, _, write = _step(ctx, [("c", 0, 3), ("a", 2, 1)], drafted=True)
    assert write.rows.tolist() == [1] and write.positions.tolist() == [1]
    assert ctx.num_waiting == 0


def test_the_later_token_at_a_position_wins():
    ctx = DeferredContext(fill_unit=128)
    _step(ctx, [("a", 10, 4)], drafted=False)          # 10 accepted, 11-13 rejected drafts
    _, later, _ = _step(ctx, [("a", 11, 1)], drafted=False)
    _, _, write = _step(ctx, [("a", 12, 1)], drafted=True)
    assert sorted(write.positions.tolist()) == [10, 11, 12, 13]
    assert write.hidden[write.positions == 11][0, 1] == later[0, 1]


def test_prompt_tokens_are_written_at_once_and_a_resumed_request_forgotten():
    ctx = DeferredContext(fill_unit=128)
    _, _, write = _step(ctx, [("a", 0, 20), ("b", 40, 1)], drafted=False, prompt=[30, 10])  # a prefill chunk
    assert write.rows.tolist() == [0] * 20 and write.positions.tolist() == list(range(20))
    _, _, write = _step(ctx, [("a", 20, 10), ("b", 41, 1)], drafted=False, prompt=[30, 10])
    assert write.positions.tolist() == list(range(20, 30)) and ctx.num_waiting == 2
    ctx.retain({"a", "b"}, drop=["b"])                       # b resumed (or finished, its id used again)
    assert ctx.num_waiting == 0 and ctx.requests == frozenset() and ctx.num_held == 0


def test_too_many_waiting_tokens_write_the_batchs():
    ctx = DeferredContext(fill_unit=128, max_waiting_tokens=5)
    _step(ctx, [("a", 1, 1), ("b", 1, 1)], drafted=False)
    _step(ctx, [("a", 2, 1), ("b", 2, 1)], drafted=False)
    _, _, write = _step(ctx, [("a", 3, 1), ("b", 3, 1)], drafted=False)   # 6 > 5: all written
    assert sorted(zip(write.rows.tolist(), write.positions.tolist())) == \
        [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    assert ctx.num_waiting == 0


def test_the_cap_counts_the_rows_a_step_keeps_together():
    """Two requests' tokens of a step are kept in one tensor: writing one's leaves both rows held."""
    ctx = DeferredContext(fill_unit=4, max_waiting_tokens=4)
    _step(ctx, [("a", 1, 1), ("b", 1, 1)], drafted=False)
    _step(ctx, [("a", 2, 1), ("b", 2, 1)], drafted=False)
    _, _, write = _step(ctx, [("a", 3, 1)], drafted=False)            # a fills its unit; b not scheduled
    assert write.positions.tolist() == [1, 2, 3] and (ctx.num_waiting, ctx.num_held) == (2, 4)
    _, _, write = _step(ctx, [("a", 4, 1)], drafted=False)            # held 4 + 1 > 4: the batch's written
    assert write.rows.tolist() == [0] and ctx.num_held == 4          # b is not in this batch: still held
    ctx.retain({"a"})
    assert (ctx.num_waiting, ctx.num_held) == (0, 0)


def test_waiting_tokens_do_not_hold_the_steps_batch():
    """Only the waiting tokens' hidden states are kept, not the whole step's (a long prefill beside)."""
    ctx = DeferredContext(fill_unit=4096)
    hidden = torch.zeros(1001, 64)
    ctx.step(["p", "d"], [1000, 1], [1000, 51], hidden, drafted=False, num_prompt_tokens=[1000, 10])
    (kept,) = [w.kept.hidden for ws in ctx._waiting.values() for w in ws]
    assert ctx.num_held == 1 and kept.shape == (1, 64) and kept.untyped_storage().nbytes() == 64 * 4


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="2 requests, 2 token counts, 2 sequence lengths and 2 hidden rows"):
        DeferredContext(4).step(["a", "b"], [1, 2], [5, 5], torch.zeros(2, 1), drafted=False)
    with pytest.raises(ValueError, match="fill_unit"):
        DeferredContext(0)


@settings(max_examples=60, deadline=None)
@given(fill_unit=st.sampled_from([1, 2, 4, 8]), cap=st.sampled_from([4, 10**6]),
       plan=st.lists(st.tuples(st.booleans(), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.booleans()),
                                                          min_size=4, max_size=4)), min_size=1, max_size=40),
       seed=st.integers(0, 2**16))
def test_the_cache_matches_vllms_own_writes(fill_unit, cap, plan, seed):
    """A model of four requests over random steps: each step a request is scheduled or not, verifies d
    drafts and accepts a of them; one not scheduled twice in a row is finished (forgotten) and comes
    back as a new request."""
    torch.manual_seed(seed)
    ctx = DeferredContext(fill_unit, max_waiting_tokens=cap)
    own: dict[tuple[str, int], float] = {}       # vLLM's own pass: every step's tokens, at once
    ours: dict[tuple[str, int], float] = {}      # vLLM's pass on drafted steps + what DeferredContext returns
    committed = {f"r{i}": 0 for i in range(4)}
    generation = {f"r{i}": 0 for i in range(4)}
    drafts_next = {r: 0 for r in committed}
    absent = {r: 0 for r in committed}
    for drafted, reqs in plan:
        batch = []
        for i, (d, a, present) in enumerate(reqs):
            r = f"r{i}"
            absent[r] = 0 if present else absent[r] + 1
            if not present:
                if committed[r] and absent[r] == 2:  # finished: forgotten; it returns as a new request
                    ctx.retain({f"r{j}.{generation[f'r{j}']}" for j in range(4)} - {f"{r}.{generation[r]}"})
                    generation[r] += 1
                    committed[r] = 0
                    for store in (own, ours):
                        for key in [k for k in store if k[0].startswith(r + ".")]:
                            del store[key]
                continue
            name = f"{r}.{generation[r]}"
            n = 1 + drafts_next[r] if committed[r] else 3 + d  # a prompt, or the anchor and its drafts
            batch.append((name, committed[r], n))
            committed[r] += (1 + min(a, n - 1)) if committed[r] else n
        if not batch:
            continue
        positions, hidden, write = _step(ctx, batch, drafted, prompt=[3 if b[1] == 0 else 0 for b in batch])
        names = [b[0] for b in batch]
        rows = torch.repeat_interleave(torch.arange(len(batch)), torch.tensor([b[2] for b in batch]))
        for row, p, h in zip(rows.tolist(), positions.tolist(), hidden[:, 1].tolist()):
            own[(names[row], p)] = h
        if write is not None:
            for row, p, h in zip(write.rows.tolist(), write.positions.tolist(), write.hidden[:, 1].tolist()):
                ours[(names[row], p)] = h
        if drafted:
            for row, p, h in zip(rows.tolist(), positions.tolist(), hidden[:, 1].tolist()):
                ours[(names[row], p)] = h
            for name in names:  # every request of a drafted pass reads its whole context
                assert {k: v for k, v in ours.items() if k[0] == name} == {k: v for k, v in own.items() if k[0] == name}
        for name, _, _ in batch:
            full = committed[name.split(".")[0]] // fill_unit * fill_unit
            assert {k: v for k, v in ours.items() if k[0] == name and k[1] < full} == \
                   {k: v for k, v in own.items() if k[0] == name and k[1] < full}
        assert ctx.num_held >= ctx.num_waiting >= 0
        for i, (d, _, present) in enumerate(reqs):
            if present:
                drafts_next[f"r{i}"] = d if drafted else 0
