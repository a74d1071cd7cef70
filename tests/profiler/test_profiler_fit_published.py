"""Efficiency fit (recovering known factors), gap filling, the shipped published curve, interpolation error."""

import warnings
from pathlib import Path

import numpy as np
import pytest

from dcut_sched import CostCurve, CostCurveError
from dcut_sched.profiler.analytic import Efficiency, forward_ms, parse_draft_spec
from dcut_sched.profiler.devices import get_device
from dcut_sched.profiler.efficiency_fit import device_matches, fill_curve, fit_efficiency
from dcut_sched.profiler.grid import verify_tokens
from dcut_sched.profiler.interp_error import interpolation_error, interpolation_points
from dcut_sched.profiler.published import PUBLISHED_H20_QWEN3_8B, build_h20_qwen3_8b, published_rows_curve
from dcut_sched.profiler.shapes import resolve_model

SHIPPED = Path(__file__).resolve().parents[2] / "dcut_sched" / "profiler" / "profiles" / "h20-qwen3-8b-published.json"


def synthetic_curve(eff, device="h100", model="qwen3-8b", batch_sizes=(4, 16, 64), ctx=2048):
    shape, _ = resolve_model(model)
    dev = get_device(device)
    verify = []
    for bs in batch_sizes:
        tokens = np.array(verify_tokens(bs, 16))
        for k, ms in zip(tokens, forward_ms(shape, dev, eff, bs, tokens, ctx)):
            verify.append({"batch_size": bs, "num_tokens": int(k), "median_ms": float(ms)})
    return CostCurve(hardware={"device_name": dev.name, "backend": "cuda-graph"}, model={"name": model},
                     block_size=16, context_len=ctx, verify=verify)


def test_fit_recovers_known_factors():
    truth = Efficiency(eta_compute=0.55, eta_memory=0.8, eta_attention=0.25, overhead_ms=1.5, smoothness=4.0)
    curve = synthetic_curve(truth)
    fit = fit_efficiency(curve, resolve_model("qwen3-8b")[0], get_device("h100"))
    for name in ("eta_compute", "eta_memory", "eta_attention", "overhead_ms"):
        assert getattr(fit.efficiency, name) == pytest.approx(getattr(truth, name), rel=1e-3), name
    assert fit.max_abs_rel_err < 1e-6 and len(fit.residuals) == 15


def test_fit_needs_enough_rows():
    curve = CostCurve(hardware={"device_name": "NVIDIA H20", "backend": "cuda-graph"}, model={"name": "qwen3-8b"},
                      block_size=16, context_len=0,
                      verify=[{"batch_size": 4, "num_tokens": k, "median_ms": m} for k, m in ((16, 8.2), (32, 8.7), (48, 9.7))])
    with pytest.raises(ValueError, match="3 measured/published verify rows; the fit needs at least 4"):
        fit_efficiency(curve, resolve_model("qwen3-8b")[0], get_device("h20"))


def test_fill_keeps_source_rows_and_marks_the_rest_fitted():
    base = published_rows_curve()
    shape, _ = resolve_model("qwen3-8b")
    fit = fit_efficiency(base, shape, get_device("h20"))
    filled = fill_curve(base, shape, fit, batch_sizes=[2, 4], grid_step=16, draft=parse_draft_spec("dflash:5"))
    src = {(r.batch_size, r.num_tokens): r for r in base.verify}
    for row in filled.verify:
        key = (row.batch_size, row.num_tokens)
        if key in src:
            assert row == src[key]
        else:
            assert row.provenance == "fitted"
            assert row.median_ms == pytest.approx(float(forward_ms(shape, fit.device, fit.efficiency, *key, 1024)),
                                                  abs=1e-4)
    assert {(r.batch_size, r.num_tokens) for r in filled.verify if r.provenance == "fitted"} >= {(2, 2), (4, 4), (2, 32)}
    assert [d.batch_size for d in filled.draft] == [2, 4] and all(d.provenance == "fitted" for d in filled.draft)
    assert filled.hardware["fit"]["rms_rel_err"] == pytest.approx(fit.rms_rel_err, abs=1e-5)


def test_device_matches():
    assert device_matches(get_device("h20"), "NVIDIA H20")
    assert not device_matches(get_device("h20"), "NVIDIA H200")
    assert device_matches(get_device("h100"), "NVIDIA H100 80GB HBM3") and device_matches(get_device("a100"), "NVIDIA A100-SXM4-40GB")
    assert not device_matches(get_device("a100"), None)


def test_rebuild_command_writes_the_shipped_curve(tmp_path, capsys):
    from dcut_sched.cli.published_curve import main

    out = tmp_path / "c.json"
    assert main(["--out", str(out)]) == 0
    rebuilt, shipped = CostCurve.load(out, check_hardware=False), CostCurve.load(SHIPPED, check_hardware=False)
    assert [(r.batch_size, r.num_tokens, r.provenance) for r in rebuilt.verify] == \
        [(r.batch_size, r.num_tokens, r.provenance) for r in shipped.verify]
    assert [r.median_ms for r in rebuilt.verify] == pytest.approx([r.median_ms for r in shipped.verify], rel=1e-6)
    printed = " ".join(capsys.readouterr().out.split())  # as one line, however the console wraps it
    assert f"wrote {out}: 35 verify rows, 7 ar rows, 7 draft rows" in printed


def test_shipped_published_curve():
    curve = CostCurve.load(SHIPPED, check_hardware=False)
    published = {(r.batch_size, r.num_tokens): r.median_ms for r in curve.verify if r.provenance == "published"}
    expected = {(bs, rho * bs * 4): ms for bs, times in PUBLISHED_H20_QWEN3_8B.items()
                for rho, ms in zip((1, 2, 3, 4), times)}
    assert published == expected and len(expected) == 20  # exact, not approximate
    assert expected[(8, 32)] == 10.6 and expected[(32, 512)] == 70.1
    assert expected[(64, 1024)] == 133.9 and expected[(4, 16)] == 8.2
    assert {r.provenance for r in curve.verify} == {"published", "fitted"}
    assert curve.batch_sizes == [1, 2, 4, 8, 16, 32, 64] and curve.block_size == 16
    for bs in curve.batch_sizes:  # the num_tokens = bs point exists and the curve never falls with num_tokens
        ms = curve.verify_ms(bs, np.array(curve.token_counts(bs)))
        assert curve.token_counts(bs)[0] == bs and np.all(np.diff(ms) >= 0)
        assert curve.draft_ms(bs) > 0
    # the published plain AR steps, 1000 * bs / throughput, by hand from the tok/s figures
    ar = {r.batch_size: r for r in curve.ar}
    for bs, tok_s in {4: 525.8, 8: 958.7, 16: 1691.3, 32: 2700.2, 64: 3594.4}.items():
        assert ar[bs].provenance == "published" and ar[bs].median_ms == 1000.0 * bs / tok_s
    assert curve.ar_ms(64) == pytest.approx(17.8055, abs=1e-4) and curve.ar_ms(4) == pytest.approx(7.6075, abs=1e-4)
    assert curve.ar_ms(48) == pytest.approx((11.8510 + 17.8055) / 2, abs=1e-4)  # linear between 32 and 64
    assert {ar[1].provenance, ar[2].provenance} == {"fitted"}
    assert curve.ar_provenance == "fitted (bs 1, 2); published (bs 4, 8, 16, 32, 64)"
    assert curve.ar_ms(64) < 0.4 * curve.verify_ms(64, 256)  # the plain step is not the verify intercept
    fam = curve.hardware["fit"]["families"]
    assert fam["verify"]["rows"] == 20 and fam["ar"]["rows"] == 5
    assert fam["verify"]["max_abs_rel_err"] < 0.03 and fam["ar"]["max_abs_rel_err"] < 0.03
    # the file is what the builder makes today (apart from its time stamp)
    rebuilt, fit = build_h20_qwen3_8b()
    for key in ("verify", "draft", "ar"):
        assert rebuilt.to_dict()[key] == curve.to_dict()[key], key
    assert fit.max_abs_rel_err < 0.03 and fit.ar_efficiency is not None
    # controller-side checks the core provides
    with pytest.raises(CostCurveError, match="measured for block size 16, not 8"):
        curve.require_block_size(8)
    with pytest.warns(UserWarning, match="measured on 'NVIDIA H20' but this device is 'NVIDIA H200'"):
        curve.check_hardware("NVIDIA H200")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        curve.check_hardware("NVIDIA H20")


def test_interpolation_error_by_hand():
    # bs=1, B=8: coarse = {1, 2, 4, 6, 8}; dense = {3, 5, 7}; times k^2 (convex)
    verify = [{"batch_size": 1, "num_tokens": k, "median_ms": float(k * k)} for k in range(1, 9)]
    curve = CostCurve(hardware={"device_name": "t", "backend": "analytic"}, model={"name": "t"}, block_size=8,
                      context_len=0, verify=verify)
    pts = interpolation_points(curve)
    assert pts["num_tokens"].tolist() == [3, 5, 7]
    np.testing.assert_allclose(pts["linear_ms"], [10, 26, 50])  # midpoints of 4-16, 16-36, 36-64
    err = interpolation_error(curve)
    assert err.loc[0, "dense_points"] == 3
    assert err.loc[0, "linear_max_ms"] == pytest.approx(1.0)
    assert err.loc[0, "linear_max_pct"] == pytest.approx(100 / 9)
    assert err.loc[0, "linear_mean_pct"] == pytest.approx(100 * (1 / 9 + 1 / 25 + 1 / 49) / 3)
    # a linear curve is interpolated exactly by both lookups
    lin = CostCurve(hardware={"device_name": "t", "backend": "analytic"}, model={"name": "t"}, block_size=8, context_len=0,
                    verify=[{"batch_size": 2, "num_tokens": k, "median_ms": 3.0 + 0.5 * k} for k in range(2, 17)])
    e = interpolation_error(lin)
    assert e.loc[0, "linear_max_ms"] == pytest.approx(0, abs=1e-9) and e.loc[0, "curve_max_ms"] == pytest.approx(0, abs=1e-9)
    assert interpolation_error(published_rows_curve()).empty  # buckets only: nothing to compare


def test_joint_fit_recovers_both_paths():
    """Synthetic verify rows from one Efficiency and ar rows from another sharing eta_compute/eta_memory:
    the joint fit recovers all six factors and reports residuals per family."""
    from dcut_sched.profiler.analytic import ar_step_ms

    truth = Efficiency(eta_compute=0.6, eta_memory=0.85, eta_attention=0.1, overhead_ms=2.5)
    truth_ar = Efficiency(eta_compute=0.6, eta_memory=0.85, eta_attention=0.3, overhead_ms=0.8)
    base = synthetic_curve(truth, device="h20", batch_sizes=(4, 16, 64), ctx=1024)
    shape, _ = resolve_model("qwen3-8b")
    dev = get_device("h20")
    ar = [{"batch_size": bs, "median_ms": float(ar_step_ms(shape, dev, truth_ar, bs, 1024))} for bs in (4, 8, 16, 32, 64)]
    curve = CostCurve(hardware=base.hardware, model=base.model, block_size=16, context_len=1024, verify=base.verify, ar=ar)
    fit = fit_efficiency(curve, shape, dev)
    for name in ("eta_compute", "eta_memory", "eta_attention", "overhead_ms"):
        assert getattr(fit.efficiency, name) == pytest.approx(getattr(truth, name), rel=1e-3), name
        assert getattr(fit.ar_efficiency, name) == pytest.approx(getattr(truth_ar, name), rel=1e-3), name
    fam = fit.family_errors().set_index("family")
    assert fam.loc["verify", "rows"] == 15 and fam.loc["ar", "rows"] == 5 and fam["max_abs_rel_err"].max() < 1e-6
    filled = fill_curve(curve, shape, fit, batch_sizes=[1, 4])
    ar_rows = {r.batch_size: r for r in filled.ar}
    assert ar_rows[1].provenance == "fitted" and ar_rows[4].provenance == "measured"
    assert ar_rows[1].median_ms == pytest.approx(float(ar_step_ms(shape, dev, truth_ar, 1, 1024)), abs=1e-4)
    # one ar row is not enough to fit the decode path: it stays unfitted and no ar rows are invented
    one = CostCurve(hardware=base.hardware, model=base.model, block_size=16, context_len=1024, verify=base.verify,
                    ar=ar[:1])
    fit1 = fit_efficiency(one, shape, dev)
    assert fit1.ar_efficiency is None and set(fit1.residuals["family"]) == {"verify"}
    assert [r.batch_size for r in fill_curve(one, shape, fit1, batch_sizes=[1, 4]).ar] == [4]


def test_fill_derives_a_smaller_block_size():
    from dcut_sched.profiler.analytic import draft_ms

    base = published_rows_curve()
    shape, _ = resolve_model("qwen3-8b")
    fit = fit_efficiency(base, shape, get_device("h20"))
    b8 = fill_curve(base, shape, fit, batch_sizes=[4, 64], grid_step=0, draft=parse_draft_spec("dflash:5"),
                    block_size=8)
    assert b8.block_size == 8
    assert all(r.num_tokens <= 8 * r.batch_size for r in b8.verify)
    published = {(r.batch_size, r.num_tokens) for r in b8.verify if r.provenance == "published"}
    # the B16 buckets at rho 0.25 and 0.5 are the B8 buckets at rho 0.5 and 1.0: kept verbatim
    assert {(4, 16), (4, 32), (64, 256), (64, 512)} <= published and (4, 48) not in published
    assert b8.token_counts(4) == [4, 8, 16, 24, 32]  # bs, and ceil(rho * 4 * 8)
    for row in b8.draft:  # the B8 draft step, not the B16 one
        assert row.median_ms == pytest.approx(float(draft_ms(shape, parse_draft_spec("dflash:5"), fit.device,
                                                             fit.efficiency, row.batch_size, 8, 1024)), abs=1e-4)
    assert b8.ar == fill_curve(base, shape, fit, batch_sizes=[4, 64]).ar  # the plain step does not depend on B
    assert b8.hardware["fit"]["derived_block_size"]["from"] == 16


def test_cli_derives_a_smaller_block_size_from_a_curve_with_engine_rows(tmp_path, capsys):
    """``dcut-profile --fit CURVE --block-size 8`` of a B16 curve with ``draft_first`` and
    ``step_overhead`` rows: draft_first cells above bs * 8 tokens are dropped (and counted in
    ``hardware.fit.derived_block_size``), the rest and every step_overhead row are kept."""
    import json

    from dcut_sched.cli.profile import main

    doc = json.loads(SHIPPED.read_text())
    doc["draft_first"] = [{"batch_size": bs, "num_tokens": k * bs, "median_ms": 1.0 + 0.1 * k * bs}
                          for bs in (1, 2) for k in (1, 4, 8, 16)]
    doc["step_overhead"] = [{"kind": kind, "batch_size": bs, "median_ms": 0.5}
                            for kind in ("plain", "drafted") for bs in (1, 2)]
    src = tmp_path / "b16.json"
    src.write_text(json.dumps(doc))
    before = src.read_bytes()
    out = tmp_path / "b8.json"
    assert main(["--analytic", "--device", "h20", "--fit", str(src), "--block-size", "8", "--out", str(out),
                 "--quiet"]) == 0, capsys.readouterr().err
    assert src.read_bytes() == before
    b8 = CostCurve.load(out, check_hardware=False)
    assert b8.block_size == 8
    assert sorted((r.batch_size, r.num_tokens) for r in b8.draft_first) == [(1, 1), (1, 4), (1, 8),
                                                                            (2, 2), (2, 8), (2, 16)]
    assert len(b8.step_overhead) == 4
    derived = b8.hardware["fit"]["derived_block_size"]
    assert derived["from"] == 16 and derived["to"] == 8 and derived["dropped_draft_first_rows"] == 2
    assert b8.draft_first_ms(2, 16) == pytest.approx(1.0 + 0.1 * 16)
