"""``dcut-sim --graph-tokens``: refuse, before any run, a list of captured token counts that cannot
hold the steps the run charges on a cost curve, with one line naming the flag, the value, the batch
size and the valid range per batch size.

At batch size ``bs`` a step verifies from ``bs`` tokens (each request's anchor slot) up to
``bs * B``, and is charged at the smallest captured count >= its tokens
(:class:`~dcut_sched.controller.step_driver.GraphCells`), which the curve must price: at most ``hi``, the
curve's largest token count at ``bs``. So

- a policy restricted to the captured counts (``fine`` without its own ``allowed_num_tokens``,
  :func:`~dcut_sched.controller.step_driver.restrict_to_graph_cells`) needs a count in ``bs .. hi``;
- any other drafting policy pads its budget up, so a step verifying every slot needs a count in
  ``bs * B .. hi`` (a bank that cannot hold it fails at run time, in the simulator as in the
  controller);
- ``ar`` drafts nothing and needs none.

Closed loop checks the run's batch sizes, open loop every batch size up to each maximum (a batch
shrinks as requests finish). A batch size the curve does not cover, or whose full step it does not
price, is left to the simulator's own range errors.
"""

from __future__ import annotations

from .errors import UsageError

__all__ = ["check_graph_tokens"]


def check_graph_tokens(config, cost_path: str) -> None:
    """Check ``config.graph_token_counts`` (a :class:`~dcut_sched.simulator.SimConfig` whose counts
    are not None) against the cost curve in ``cost_path`` and the run's policies (module docstring).

    Raises:
        UsageError: naming ``--graph-tokens``, the value, the batch size and policy that cannot run,
            and the valid range per batch size.
        CostCurveError: the curve file is invalid (the loader's one-line message).
    """
    from .. import policies
    from ..cost_curve import CostCurve, CostCurveRangeError
    from ..simulator.config import policy_specs

    curve = CostCurve.load(cost_path, check_hardware=False)
    block, counts = curve.block_size, sorted(config.graph_token_counts)
    runs = [(name, given.params() if isinstance(given, policies.Policy) else given)
            for _label, name, given in policy_specs(config.policies, config.policy_params) if name != "ar"]
    if not runs:
        return
    # the policies whose budget is padded up to a captured count (restrict_to_graph_cells leaves them
    # as they are): no allowed_num_tokens parameter, or their own
    padded = [name for name, params in runs
              if "allowed_num_tokens" not in policies.param_defaults(name) or params.get("allowed_num_tokens") is not None]
    sizes = (config.batch_sizes if config.mode == "closed"
             else sorted({b for top in config.batch_sizes for b in range(1, top + 1)}))
    need: dict[int, tuple[int, int]] = {}  # bs -> the range a count must fall in
    for bs in sizes:
        try:
            hi = curve.token_range(bs)[1]
        except CostCurveRangeError:
            continue
        low = bs * block if padded else bs
        if low <= hi:
            need[bs] = (low, hi)
    for bs, (low, hi) in need.items():
        if any(low <= k <= hi for k in counts):
            continue
        given = ",".join(map(str, counts))
        given = given if len(given) <= 60 else given[:57] + "..."
        name = "full" if "full" in padded else padded[0] if padded else ""
        why = (f"policy {name} can verify up to {low} tokens ({bs} x B={block}), padded up to a captured count"
               if padded else f"each step verifies at least {bs} tokens (one per request)")
        ranges = ", ".join(f"bs {b}: {lo}..{top}" for b, (lo, top) in list(need.items())[:8])
        raise UsageError(f"--graph-tokens {given}: at batch size {bs} {why}, and the cost curve {cost_path} prices "
                         f"at most {hi} tokens there, so the list needs a count in {low}..{hi}; valid ranges per "
                         f"batch size: {ranges}{' ...' if len(need) > 8 else ''}")
