import json
import re
import warnings

import numpy as np
import pytest

from dcut_sched import CostCurve, CostCurveError, CostCurveRangeError
from dcut_sched.cost_curve import AR_ASSUMED_NO_ROWS, AR_ASSUMED_V1, AssumedArWarning


def _doc(**over):
    doc = {
        "schema": "dcut.cost-curve/2",
        "hardware": {"device_name": "NVIDIA H20", "backend": "cuda-graph"},
        "model": {"name": "qwen3-8b", "config": {}},
        "block_size": 16,
        "context_len": 1024,
        "verify": [
            {"batch_size": 16, "num_tokens": 64, "median_ms": 16.0, "provenance": "published"},
            {"batch_size": 16, "num_tokens": 128, "median_ms": 22.7, "provenance": "published"},
            {"batch_size": 16, "num_tokens": 192, "median_ms": 29.8, "provenance": "published"},
            {"batch_size": 16, "num_tokens": 256, "median_ms": 35.8, "provenance": "published"},
            {"batch_size": 64, "num_tokens": 256, "median_ms": 55.2, "provenance": "published"},
            {"batch_size": 64, "num_tokens": 512, "median_ms": 82.2, "provenance": "published"},
            {"batch_size": 64, "num_tokens": 768, "median_ms": 107.9, "provenance": "published"},
            {"batch_size": 64, "num_tokens": 1024, "median_ms": 133.9, "provenance": "published"},
        ],
        "draft": [{"batch_size": 16, "median_ms": 3.0}, {"batch_size": 64, "median_ms": 6.0}],
        # the published plain AR engine: 1691.3 tok/s at bs 16 and 3594.4 tok/s at bs 64
        "ar": [{"batch_size": 16, "median_ms": 9.46, "provenance": "published"},
               {"batch_size": 64, "median_ms": 17.81, "p20_ms": 17.5, "p80_ms": 18.0, "repeats": 5,
                "provenance": "published"}],
    }
    doc.update(over)
    return doc


def _v1_doc():
    doc = _doc(schema="dcut.cost-curve/1")
    doc.pop("ar")
    doc["verify"] += [{"batch_size": 16, "num_tokens": 16, "median_ms": 12.0},
                      {"batch_size": 64, "num_tokens": 64, "median_ms": 40.0}]
    return doc


def test_roundtrip_and_exact_at_measured_cells(tmp_path):
    curve = CostCurve.from_dict(_doc())
    path = tmp_path / "c.json"
    curve.save(path)
    assert not [p for p in tmp_path.iterdir() if p.name != "c.json"], "temp file left behind"
    back = CostCurve.load(path, check_hardware=False)
    assert back.to_dict()["verify"] == curve.to_dict()["verify"]
    assert back.verify_ms(16, 128) == pytest.approx(22.7)
    np.testing.assert_allclose(back.verify_ms(64, np.array([256, 1024])), [55.2, 133.9])
    assert back.batch_sizes == [16, 64]
    assert back.token_counts(16) == [64, 128, 192, 256] and back.token_counts(32) == []


def test_interpolation_monotone_and_between():
    curve = CostCurve.from_dict(_doc())
    grid = np.arange(64, 257)
    ms = curve.verify_ms(16, grid)
    assert np.all(np.diff(ms) >= -1e-12)
    assert 16.0 < curve.verify_ms(16, 96) < 22.7
    # between batch sizes: linear in bs at a fixed ratio. bs=40 is halfway from 16 to 64 at rho=0.5:
    assert curve.verify_ms(40, 320) == pytest.approx((22.7 + 82.2) / 2)
    assert curve.token_range(40) == (160, 640)
    assert curve.draft_ms(40) == pytest.approx(4.5)


def test_isotonic_flattens_noisy_dip():
    doc = _doc(verify=[
        {"batch_size": 4, "num_tokens": 4, "median_ms": 5.0},
        {"batch_size": 4, "num_tokens": 8, "median_ms": 7.0},
        {"batch_size": 4, "num_tokens": 12, "median_ms": 6.0},  # noise: cheaper with more tokens
        {"batch_size": 4, "num_tokens": 16, "median_ms": 9.0},
    ])
    curve = CostCurve.from_dict(doc)
    assert curve.verify_ms(4, 8) == pytest.approx(6.5) and curve.verify_ms(4, 12) == pytest.approx(6.5)
    assert np.all(np.diff(curve.verify_ms(4, np.arange(4, 17))) >= -1e-12)


@pytest.mark.parametrize(
    "bs, tokens, match",
    [(8, 64, r"batch_size=8 is outside the measured batch sizes 16\.\.64"),
     (65, 300, "outside the measured batch sizes"),
     (16, 32, r"num_tokens=32 at batch_size=16 is outside the measured range 64\.\.256"),
     (16, 300, r"measured range 64\.\.256")],
)
def test_out_of_range_raises(bs, tokens, match):
    with pytest.raises(CostCurveRangeError, match=match):
        CostCurve.from_dict(_doc()).verify_ms(bs, tokens)


def test_draft_errors():
    curve = CostCurve.from_dict(_doc(draft=[]))
    with pytest.raises(CostCurveRangeError, match="no draft rows"):
        curve.draft_ms(16)
    with pytest.raises(CostCurveRangeError, match=r"outside the measured range 16\.\.64"):
        CostCurve.from_dict(_doc()).draft_ms(128)


def _load_error(tmp_path, doc: dict, mutate, name: str) -> tuple[str, str]:
    """``mutate(doc)``, write it to ``tmp_path/name`` and load it: (the path, the CostCurveError's message)."""
    mutate(doc)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    with pytest.raises(CostCurveError) as info:
        CostCurve.load(path)
    return str(path), str(info.value)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d.update(schema="dcut.cost-curve/0"), "field 'schema'"),
        (lambda d: d.pop("verify"), "field 'verify': missing"),
        (lambda d: d.update(verify=[]), "field 'verify': no rows"),
        (lambda d: d["verify"][2].update(median_ms=-1.0), r"field 'verify\[2\]\.median_ms'"),
        (lambda d: d["verify"][2].update(median_ms=float("nan")), r"verify\[2\]\.median_ms"),
        (lambda d: d["verify"][1].update(num_tokens=64), "duplicate cell batch_size=16, num_tokens=64"),
        (lambda d: d["verify"][0].update(num_tokens=8), "every request verifies at least its anchor"),
        (lambda d: d["verify"][0].pop("median_ms"), r"verify\[0\]\.median_ms': missing"),
        (lambda d: d["verify"][0].update(provenance="guess"), "provenance"),
        (lambda d: d["verify"][0].update(speed=1), "unknown keys"),
        (lambda d: d["hardware"].update(backend="tpu"), "hardware.backend"),
        (lambda d: d.update(block_size=0), "block_size"),
    ],
)
def test_validation_names_file_and_field(tmp_path, mutate, match):
    path, message = _load_error(tmp_path, _doc(), mutate, "bad.json")
    assert re.search(match, message) and path in message, message


def test_unreadable_files(tmp_path):
    with pytest.raises(CostCurveError, match="cannot read"):
        CostCurve.load(tmp_path / "missing.json")
    (tmp_path / "trunc.json").write_text('{"schema": "dcut.cost-curve/1", "verify": [')
    with pytest.raises(CostCurveError, match="not valid JSON"):
        CostCurve.load(tmp_path / "trunc.json")


def test_block_size_and_hardware_checks():
    curve = CostCurve.from_dict(_doc())
    curve.require_block_size(16)
    with pytest.raises(CostCurveError, match="measured for block size 16, not 8"):
        curve.require_block_size(8)
    with pytest.warns(UserWarning, match="measured on 'NVIDIA H20' but this device is 'NVIDIA H200'"):
        assert not curve.check_hardware("NVIDIA H200")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert curve.check_hardware("NVIDIA H20")


def test_linear_fixture_values(curve4, make_curve):
    assert curve4.ar_ms(8) == pytest.approx(14.0) and not curve4.ar_assumed  # ar rows = C_verify(bs, bs)
    curve = make_curve(ar_ms=False)
    assert curve.verify_ms(4, 10) == pytest.approx(15.0)
    assert curve.draft_ms(4) == pytest.approx(3.0)
    # built without ar rows: the plain step is assumed to be C_verify(bs, bs) = 10 + 0.5 * 8, warned once
    with pytest.warns(AssumedArWarning, match=r"C_ar\(bs\) is ASSUMED to be C_verify\(bs, bs\)"):
        assert curve.ar_ms(8) == pytest.approx(14.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert curve.ar_ms(4) == pytest.approx(12.0)
    assert curve.ar_provenance == AR_ASSUMED_NO_ROWS and curve.ar_assumed


def test_ar_cells_by_hand(tmp_path):
    curve = CostCurve.from_dict(_doc())
    assert curve.has_ar() and not curve.ar_assumed and curve.ar_batch_sizes == [16, 64]
    assert curve.ar_ms(16) == 9.46 and curve.ar_ms(64) == 17.81  # measured cells exactly
    # linear in bs between them: bs 40 is halfway, bs 28 a quarter of the way
    assert curve.ar_ms(40) == pytest.approx((9.46 + 17.81) / 2)
    assert curve.ar_ms(28) == pytest.approx(9.46 + 0.25 * (17.81 - 9.46))
    # not C_verify(bs, bs): the plain step has its own cells
    assert curve.ar_ms(64) != pytest.approx(curve.verify_ms(64, 256))
    assert curve.ar_provenance == "published"
    for bad in (8, 65, float("nan")):
        with pytest.raises(CostCurveRangeError, match=r"outside the measured 'ar' batch sizes 16\.\.64"):
            curve.ar_ms(bad)
    # round trip keeps every ar field
    path = tmp_path / "c.json"
    curve.save(path)
    doc = json.loads(path.read_text())
    assert doc["schema"] == "dcut.cost-curve/2" and doc["ar"] == _doc()["ar"]
    back = CostCurve.load(path)
    assert back.ar == curve.ar and back.ar_ms(40) == curve.ar_ms(40)
    mixed = CostCurve.from_dict(_doc(ar=[{"batch_size": 16, "median_ms": 9.0, "provenance": "fitted"},
                                         {"batch_size": 64, "median_ms": 18.0}]))
    assert mixed.ar_provenance == "fitted (bs 16); measured (bs 64)"


def test_v1_file_loads_with_one_warning(tmp_path):
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(_v1_doc()))
    with pytest.warns(AssumedArWarning) as record:
        curve = CostCurve.load(path)
    assert len(record) == 1
    msg = str(record[0].message)
    assert str(path) in msg and "dcut.cost-curve/1" in msg and "ASSUMED to be C_verify(bs, bs)" in msg
    assert curve.ar_provenance == AR_ASSUMED_V1 == "assumed: C_verify(bs, bs) (v1 curve)"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning on lookups
        assert curve.ar_ms(16) == 12.0 and curve.ar_ms(64) == 40.0  # C_verify(bs, bs), the assumed step
        # between batch sizes: C_verify(40, 40), linear in bs at one token per request
        assert curve.ar_ms(40) == pytest.approx((12.0 + 40.0) / 2)
    # saving writes v2 (ar: []), which loads back with the plain step still assumed
    out = tmp_path / "v2.json"
    curve.save(out)
    assert json.loads(out.read_text())["schema"] == "dcut.cost-curve/2"
    with pytest.warns(AssumedArWarning):
        back = CostCurve.load(out)
        back.ar_ms(64)
    assert back.ar_provenance == AR_ASSUMED_NO_ROWS


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d["ar"][1].update(median_ms=True), r"field 'ar\[1\]\.median_ms': must be a positive finite"),
        (lambda d: d["ar"][1].update(median_ms="17.8"), r"'ar\[1\]\.median_ms'"),
        (lambda d: d["ar"][1].update(median_ms=-1), r"'ar\[1\]\.median_ms'"),
        (lambda d: d["ar"][0].update(batch_size=16.5), r"'ar\[0\]\.batch_size': must be a positive integer"),
        (lambda d: d["ar"][0].pop("batch_size"), r"'ar\[0\]\.batch_size': missing"),
        (lambda d: d["ar"][0].update(num_tokens=16), r"'ar\[0\]': unknown keys \['num_tokens'\]"),
        (lambda d: d["ar"][1].update(p20_ms=19.0), r"'ar\[1\]\.p20_ms': 19.0 > median_ms"),
        (lambda d: d["ar"][1].update(repeats=0), r"'ar\[1\]\.repeats'"),
        (lambda d: d["ar"][1].update(provenance="guess"), r"'ar\[1\]\.provenance': unknown 'guess'"),
        (lambda d: d["ar"][1].update(batch_size=16), r"'ar\[1\]': duplicate ar cell batch_size=16"),
        (lambda d: d["ar"].__setitem__(0, [16, 9.46]), r"'ar\[0\]': must be an object"),
        (lambda d: d.update(ar={"batch_size": 16}), r"field 'ar': must be a list of rows"),
        (lambda d: d.pop("ar"), r"field 'ar': missing"),
        (lambda d: d.update(schema="dcut.cost-curve/1"), r"field 'ar': not part of dcut.cost-curve/1"),
    ],
)
def test_malformed_ar_rows_name_file_row_field(tmp_path, mutate, match):
    path, message = _load_error(tmp_path, _doc(), mutate, "bad-ar.json")
    assert re.search(match, message) and message.startswith(f"cost curve {path}: "), message


def test_saved_file_has_ordinary_permissions(tmp_path):
    import os
    import stat

    path = tmp_path / "c.json"
    CostCurve.from_dict(_doc()).save(path)
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask


def test_nan_lookups_raise():
    curve = CostCurve.from_dict(_doc())
    with pytest.raises(CostCurveRangeError, match="finite"):
        curve.verify_ms(16, float("nan"))
    with pytest.raises(CostCurveRangeError, match="outside the measured batch sizes"):
        curve.verify_ms(float("nan"), 64)


def _engine_rows_doc(**over):
    """``_doc()`` plus the optional per-step rows (docs/design.md §4)."""
    doc = _doc(**over)
    doc["draft_first"] = [{"batch_size": 16, "num_tokens": 16, "median_ms": 2.0},
                          {"batch_size": 16, "num_tokens": 256, "median_ms": 6.0, "p20_ms": 5.5, "p80_ms": 6.5,
                           "repeats": 7},
                          {"batch_size": 64, "num_tokens": 64, "median_ms": 3.0},
                          {"batch_size": 64, "num_tokens": 1024, "median_ms": 9.0}]
    doc["step_overhead"] = [{"kind": "plain", "batch_size": 16, "median_ms": 1.0},
                            {"kind": "plain", "batch_size": 64, "median_ms": 2.0, "p20_ms": -0.5, "p80_ms": 2.5},
                            {"kind": "drafted", "batch_size": 16, "median_ms": 0.0},
                            {"kind": "drafted", "batch_size": 64, "median_ms": 4.0},
                            {"kind": "undrafted", "batch_size": 16, "median_ms": 5.0},
                            {"kind": "undrafted", "batch_size": 64, "median_ms": 7.0}]
    return doc


def test_draft_first_and_step_overhead_rows_by_hand(tmp_path):
    curve = CostCurve.from_dict(_engine_rows_doc())
    assert curve.has_draft_first() and all(curve.has_overhead(k) for k in ("plain", "drafted", "undrafted"))
    # two cells per bs: the PCHIP is the straight line; halfway in tokens at bs 16 -> halfway in ms
    assert curve.draft_first_ms(16, 16) == 2.0 and curve.draft_first_ms(16, 136) == pytest.approx(4.0)
    # between batch sizes: linear in bs at fixed tokens per request (as verify): bs 40 at 1 token/request
    assert curve.draft_first_ms(40, 40) == pytest.approx((2.0 + 3.0) / 2)
    assert curve.overhead_ms("plain", 40) == pytest.approx(1.5) and curve.overhead_ms("undrafted", 16) == 5.0
    with pytest.raises(CostCurveRangeError, match="draft_first num_tokens=8 at batch_size=16"):
        curve.draft_first_ms(16, 8)
    with pytest.raises(CostCurveRangeError, match="plain step overhead batch_size=8 is outside"):
        curve.overhead_ms("plain", 8)
    with pytest.raises(ValueError, match="unknown step kind 'prefill'"):
        curve.overhead_ms("prefill", 16)
    path = tmp_path / "rows.json"
    curve.save(path)
    back = CostCurve.load(path)
    assert back.draft_first == curve.draft_first and back.step_overhead == curve.step_overhead
    assert json.loads(path.read_text())["step_overhead"][1] == {"kind": "plain", "batch_size": 64, "median_ms": 2.0,
                                                                "p20_ms": -0.5, "p80_ms": 2.5, "provenance": "measured"}
    # without the rows: no such keys written, lookups are 0, nothing else changes
    bare = CostCurve.from_dict(_doc())
    assert not bare.has_draft_first() and not bare.has_overhead("plain")
    assert bare.draft_first_ms(16, 128) == 0.0 and bare.overhead_ms("undrafted", 16) == 0.0
    assert "draft_first" not in bare.to_dict() and "step_overhead" not in bare.to_dict()


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d["step_overhead"][0].update(kind="prefill"), r"'step_overhead\[0\]\.kind': unknown step kind 'prefill'"),
        (lambda d: d["step_overhead"][0].pop("kind"), r"'step_overhead\[0\]\.kind': missing"),
        (lambda d: d["step_overhead"][1].update(median_ms="x"), r"'step_overhead\[1\]\.median_ms': must be a finite number of ms \(a signed residual\)"),
        (lambda d: d["step_overhead"][1].update(median_ms=float("inf")), r"'step_overhead\[1\]\.median_ms'"),
        (lambda d: d["step_overhead"][1].update(p20_ms="x"), r"'step_overhead\[1\]\.p20_ms': must be a finite number"),
        (lambda d: d["step_overhead"][1].update(p80_ms=1.0), r"'step_overhead\[1\]\.p80_ms': 1.0 < median_ms"),
        (lambda d: d["step_overhead"][3].update(batch_size=16), r"'step_overhead\[3\]': duplicate cell kind=drafted, batch_size=16"),
        (lambda d: d["step_overhead"][2].update(num_tokens=16), r"'step_overhead\[3\]\.num_tokens': missing, while other drafted rows give it"),
        (lambda d: d["step_overhead"][0].update(num_tokens=16), r"'step_overhead\[0\]\.num_tokens': a plain step verifies anchors only"),
        (lambda d: d["step_overhead"][2].update(extra=1), r"'step_overhead\[2\]': unknown keys \['extra'\]"),
        (lambda d: (d["step_overhead"][2].update(num_tokens=8), d["step_overhead"][3].update(num_tokens=64)),
         r"'step_overhead\[2\]\.num_tokens': 8 < batch_size 16"),
        (lambda d: (d["step_overhead"][2].update(num_tokens=16), d["step_overhead"][3].update(batch_size=16, num_tokens=16)),
         r"'step_overhead\[3\]': duplicate cell batch_size=16, num_tokens=16"),
        (lambda d: d.update(step_overhead={"kind": "plain"}), r"field 'step_overhead': must be a list of rows"),
        (lambda d: d["draft_first"][0].update(num_tokens=8), r"'draft_first\[0\]\.num_tokens': 8 < batch_size 16"),
        (lambda d: d["draft_first"][1].update(num_tokens=257), r"'draft_first\[1\]\.num_tokens': 257 > batch_size \* block_size"),
        (lambda d: d["draft_first"][1].update(num_tokens=16), r"'draft_first\[1\]': duplicate cell batch_size=16, num_tokens=16"),
        (lambda d: d["draft_first"][2].update(median_ms=0), r"'draft_first\[2\]\.median_ms': must be a positive finite"),
        (lambda d: d["draft_first"][2].pop("num_tokens"), r"'draft_first\[2\]\.num_tokens': missing"),
        (lambda d: (d.update(schema="dcut.cost-curve/1"), d.pop("ar")), r"field 'draft_first': not part of dcut.cost-curve/1"),
    ],
)
def test_malformed_engine_step_rows_name_file_row_field(tmp_path, mutate, match):
    path, message = _load_error(tmp_path, _engine_rows_doc(), mutate, "bad-rows.json")
    assert re.search(match, message) and message.startswith(f"cost curve {path}: "), message


def _k_keyed_doc(o16=(2.6, -7.2), o64=(1.0, 3.0)):
    """Drafted overhead keyed by the K bucket: at bs 16, +2.6 ms at K = 16 falling to -7.2 ms at K = 256
    (the residual of a step whose real verify is cheaper than the dummy cell); at bs 64, 1 -> 3 ms."""
    doc = _engine_rows_doc()
    doc["step_overhead"] = [row for row in doc["step_overhead"] if row["kind"] != "drafted"] + [
        {"kind": "drafted", "batch_size": 16, "num_tokens": 16, "median_ms": o16[0]},
        {"kind": "drafted", "batch_size": 16, "num_tokens": 256, "median_ms": o16[1], "p20_ms": -8.0, "p80_ms": -7.0},
        {"kind": "drafted", "batch_size": 64, "num_tokens": 64, "median_ms": o64[0]},
        {"kind": "drafted", "batch_size": 64, "num_tokens": 1024, "median_ms": o64[1]},
    ]
    return doc


def test_drafted_overhead_keyed_by_tokens_by_hand(tmp_path):
    """O_drafted(bs, K): linear in K between two cells (no isotonic step: the residual falls with K),
    linear in bs at fixed tokens per request between batch sizes; StepCosts adds it per budget."""
    from dcut_sched.step_costs import StepCosts

    curve = CostCurve.from_dict(_k_keyed_doc())
    assert curve.overhead_by_tokens() and curve.has_overhead("drafted")
    assert curve.overhead_ms("drafted", 16, 16) == pytest.approx(2.6)
    assert curve.overhead_ms("drafted", 16, 136) == pytest.approx((2.6 - 7.2) / 2)  # halfway in K
    # bs 40 at 1 token per request: halfway between (16, 16) and (64, 64)
    assert curve.overhead_ms("drafted", 40, 40) == pytest.approx((2.6 + 1.0) / 2)
    with pytest.raises(ValueError, match="keyed by num_tokens"):
        curve.overhead_ms("drafted", 16)
    with pytest.raises(CostCurveRangeError, match="drafted step_overhead num_tokens=300 at batch_size=16"):
        curve.overhead_ms("drafted", 16, 300)
    costs = StepCosts(curve, 16)
    k = np.array([64, 160, 256])  # the verify cells at bs 16 start at 64
    by_k = 2.6 + (k - 16) / (256 - 16) * (-7.2 - 2.6)
    fixed = costs.drafted_fixed_ms(16)
    assert fixed == pytest.approx(costs.draft_ms(16))  # no K-independent overhead left
    want = fixed + curve.verify_ms(16, k) + (curve.draft_first_ms(16, k) - curve.draft_first_ms(16, 16)) + by_k
    assert costs.drafted_ms_at(16, k) == pytest.approx(want)
    assert [costs.drafted_ms(16, int(x)) for x in k] == pytest.approx(want)
    path = tmp_path / "k.json"
    curve.save(path)
    back = CostCurve.load(path)
    assert sorted(map(repr, back.step_overhead)) == sorted(map(repr, curve.step_overhead))  # rows are saved sorted
    assert {row.get("num_tokens") for row in json.loads(path.read_text())["step_overhead"]} == {None, 16, 256, 64, 1024}


def test_a_step_priced_at_zero_or_less_is_refused():
    """A signed residual may be negative, but never larger than the forwards it corrects."""
    from dcut_sched.cost_curve import CostCurveError
    from dcut_sched.step_costs import StepCosts

    doc = _k_keyed_doc(o16=(2.6, -1e4))
    doc["step_overhead"][-3].update(p20_ms=None, p80_ms=None)
    # refused when the step costs are built (the engine's start), not at the first step that uses the cell
    with pytest.raises(CostCurveError, match="a drafted step at batch_size=16, num_tokens=256 is priced at"):
        StepCosts(CostCurve.from_dict(doc), 16)
    doc = _engine_rows_doc()
    doc["step_overhead"][0]["median_ms"] = -1e4
    with pytest.raises(CostCurveError, match="a plain step at batch_size=16 is priced at"):
        StepCosts(CostCurve.from_dict(doc), 16)
    doc = _engine_rows_doc()  # a drafted row without num_tokens, as older profiles write
    doc["step_overhead"][3]["median_ms"] = -1e4
    with pytest.raises(CostCurveError, match="a drafted step at batch_size=64, num_tokens=256 is priced at"):
        StepCosts(CostCurve.from_dict(doc), 16)


def test_a_key_given_twice_in_a_row_is_refused(tmp_path):
    from pathlib import Path

    from dcut_sched.cost_curve import CostCurve, CostCurveError

    good = (Path(__file__).resolve().parents[1] / "dcut_sched" / "profiler" / "profiles" / "cpu-smollm2-135m-b8.json").read_text()
    path = tmp_path / "c.json"
    path.write_text(good.replace('"median_ms": ', '"median_ms": -5, "median_ms": ', 1))
    with pytest.raises(CostCurveError, match=r"c.json: key 'median_ms' appears twice"):
        CostCurve.load(path, check_hardware=False)
