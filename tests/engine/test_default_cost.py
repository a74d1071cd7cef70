"""dcut-engine's default cost curve: the shipped CPU profile of the drafter in use, else the built-in
estimate, with a description that says which."""

from __future__ import annotations

from dcut_sched.cost_curve import CostCurve
from dcut_sched.engine.default_cost import builtin_cpu_curve, default_cost_curve, default_profile_path


def test_each_drafter_gets_its_own_shipped_profile():
    curve, source = default_cost_curve(16, 8, "dflash")
    assert source == "recorded CPU profile cpu-smollm2-135m-dflash-b16.json"
    shipped = CostCurve.load(default_profile_path(16, "dflash"), check_hardware=False)
    assert curve.draft_ms(8) == shipped.draft_ms(8)
    self_curve, self_source = default_cost_curve(16, 8)
    assert self_source == "recorded CPU profile cpu-smollm2-135m-b16.json"
    assert self_curve.draft_ms(8) > 5 * curve.draft_ms(8)  # 15 sequential forwards vs one parallel pass


def test_no_dflash_profile_falls_back_and_says_so():
    curve, source = default_cost_curve(8, 4, "dflash")  # no B8 DFlash profile is shipped
    assert not default_profile_path(8, "dflash").exists()
    assert source.startswith("built-in linear CPU estimate (130 ms + 6.4 ms/token)")
    assert "cpu-smollm2-135m-dflash-b8.json" in source and "pass --cost" in source
    assert curve.draft_ms(4) == builtin_cpu_curve(8, 4).draft_ms(4)
