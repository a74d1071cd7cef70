"""The cost-curve loader under hostile input: exact types only, clear errors, never another exception.

Hand cases for each class of fault, then property-based fuzzing (hypothesis): random mutations of
good files (types, values, missing and extra fields, truncation, raw bytes) give either a valid load
that round-trips through ``save`` or a :class:`CostCurveError`, never any other exception.
``FUZZ_EXAMPLES=2000 python -m pytest tests/test_cost_curve_fuzz.py`` runs a longer search.
"""

import copy
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcut_sched import CostCurve, CostCurveError
from dcut_sched.cost_curve import ArRow, VerifyRow

ROOT = Path(__file__).resolve().parents[1]
GOOD_FILES = sorted((ROOT / "dcut_sched" / "profiler" / "profiles").glob("*.json"))


def _small_doc():
    return {
        "schema": "dcut.cost-curve/2",
        "hardware": {"device_name": "NVIDIA H20", "backend": "cuda-graph", "torch_version": "2.5.0"},
        "model": {"name": "qwen3-8b", "config": {"hidden_size": 4096}, "dtype": "bfloat16"},
        "block_size": 4,
        "context_len": 64,
        "graph_mode": "full",
        "verify": [{"batch_size": bs, "num_tokens": k, "median_ms": 1.0 + 0.1 * k, "p20_ms": 0.9 + 0.1 * k,
                    "p80_ms": 1.2 + 0.1 * k, "repeats": 5, "provenance": "measured"}
                   for bs in (1, 2) for k in range(bs, 4 * bs + 1)],
        "ar": [{"batch_size": 1, "median_ms": 0.9, "provenance": "measured"},
               {"batch_size": 2, "median_ms": 1.0, "provenance": "measured"}],
        "draft": [{"batch_size": 1, "median_ms": 0.5}, {"batch_size": 2, "median_ms": 0.6}],
        "created": "2026-01-01T00:00:00+00:00",
        "profile_seconds": 1.5,
        "source": "test",
    }


def _load_text(tmp_path, text, name="c.json"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return CostCurve.load(path, check_hardware=False), path


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d["verify"][3].update(median_ms=True), r"verify\[3\]\.median_ms': must be a positive finite number"),
    (lambda d: d["verify"][3].update(batch_size=True), r"verify\[3\]\.batch_size': must be a positive integer"),
    (lambda d: d["draft"][0].update(median_ms=False), r"draft\[0\]\.median_ms'"),
    (lambda d: d["verify"][0].update(median_ms=float("inf")), r"verify\[0\]\.median_ms'"),
    (lambda d: d["verify"][0].update(p80_ms=float("nan")), r"verify\[0\]\.p80_ms'"),
    (lambda d: d["ar"][0].update(median_ms=-0.5), r"ar\[0\]\.median_ms'"),
    (lambda d: d["ar"][0].update(median_ms=0), r"ar\[0\]\.median_ms'"),
    (lambda d: d["verify"][0].update(num_tokens=1.5), r"verify\[0\]\.num_tokens': must be a positive integer"),
    (lambda d: d["verify"][0].update(num_tokens="1"), r"verify\[0\]\.num_tokens'"),
    (lambda d: d["verify"][2].update(repeats=1e308), r"verify\[2\]\.repeats': 1e\+308 is larger than .* \(int64\)"),
    (lambda d: d["ar"][1].update(batch_size=2 ** 64), r"ar\[1\]\.batch_size': 18446744073709551616 is larger"),
    (lambda d: d["verify"][5].update(num_tokens=9), r"verify\[5\]\.num_tokens': 9 > batch_size \* block_size = 8"),
    (lambda d: d.update(hardware="NVIDIA H20"), r"field 'hardware': must be an object, got str"),
    (lambda d: d.update(model=["qwen3-8b"]), r"field 'model': must be an object"),
    (lambda d: d["hardware"].update(backend=1), r"hardware\.backend': unknown backend 1"),
    (lambda d: d["hardware"].update(device_name=20), r"hardware\.device_name': must be a string"),
    (lambda d: d.update(block_size=16.5), r"field 'block_size'"),
    (lambda d: d.update(context_len=-1), r"field 'context_len'"),
    (lambda d: d.update(context_len=True), r"field 'context_len'"),
    (lambda d: d.update(graph_mode="half"), r"field 'graph_mode'"),
    (lambda d: d.update(profile_seconds="fast"), r"field 'profile_seconds'"),
    (lambda d: d.update(source=3), r"field 'source'"),
    (lambda d: d.update(verify="rows"), r"field 'verify': must be a list of rows, got str"),
    (lambda d: d.update(extra=1), r"unknown top-level fields \['extra'\]"),
])
def test_wrong_types_and_values_name_file_row_field(tmp_path, mutate, match):
    doc = _small_doc()
    mutate(doc)
    with pytest.raises(CostCurveError, match=match) as info:
        _load_text(tmp_path, json.dumps(doc))
    assert str(tmp_path / "c.json") in str(info.value)


def test_lossless_casts_are_accepted(tmp_path):
    doc = _small_doc()
    doc["verify"][0].update(batch_size=1.0, num_tokens=1.0, repeats=5.0)
    doc["ar"][0]["median_ms"] = 1  # an int number of ms
    curve, _ = _load_text(tmp_path, json.dumps(doc))
    row = curve.verify[0]
    assert (row.batch_size, row.num_tokens, row.repeats) == (1, 1, 5) and type(row.batch_size) is int
    assert curve.ar_ms(1) == 1.0


def test_unreadable_kinds_of_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "t.parquet")
    with pytest.raises(CostCurveError, match=r"t\.parquet: is a Parquet file, not a cost-curve JSON"):
        CostCurve.load(tmp_path / "t.parquet")
    with pytest.raises(CostCurveError, match=r"b\.json: not a UTF-8 JSON text file"):
        _load_text(tmp_path, bytes(range(256)), "b.json")
    with pytest.raises(CostCurveError, match=r"d\.json: JSON nested too deeply"):
        _load_text(tmp_path, "[" * 100_000 + "]" * 100_000, "d.json")
    with pytest.raises(CostCurveError, match=r"top level must be a JSON object, got list"):
        _load_text(tmp_path, "[1, 2]")
    with pytest.raises(CostCurveError, match=r"c\.json: a number with 5000 characters; at most 64 digits"):
        _load_text(tmp_path, '{"schema": ' + "9" * 5000 + "}")
    with pytest.raises(CostCurveError, match=r"is not a regular file \(a folder, pipe or device\)"):
        CostCurve.load(tmp_path)  # a directory


def test_numpy_values_save_and_load_back(tmp_path):
    curve = CostCurve(
        hardware={"device_name": "t", "backend": "analytic", "threads": np.int64(2), "peak": np.float32(1.5)},
        model={"name": "t", "layers": np.int32(4)}, block_size=np.int64(4), context_len=np.int32(8),
        verify=[VerifyRow(np.int64(1), np.int64(k), np.float64(1.0 + k), repeats=np.int16(3)) for k in (1, 2, 4)],
        ar=[ArRow(np.int64(1), np.float32(0.75))],
    )
    path = tmp_path / "np.json"
    curve.save(path)
    back = CostCurve.load(path)
    assert back.to_dict() == curve.to_dict()
    assert back.hardware["threads"] == 2 and back.block_size == 4 and back.ar_ms(1) == 0.75
    with pytest.raises(CostCurveError, match=r"field 'hardware': not plain finite JSON"):
        CostCurve(hardware={"backend": "analytic", "x": float("nan")}, model={"name": "t"}, block_size=4,
                  context_len=0, verify=[{"batch_size": 1, "num_tokens": 1, "median_ms": 1.0}])
    with pytest.raises(CostCurveError, match=r"verify\[0\]\.batch_size': must be a positive integer, got (np\.)?True"):
        CostCurve(hardware={"backend": "analytic"}, model={"name": "t"}, block_size=4, context_len=0,
                  verify=[{"batch_size": np.bool_(True), "num_tokens": 1, "median_ms": 1.0}])


# ---------------------------------------------------------------- hardware fingerprint
def _cpu_curve(**hw):
    hardware = {"device_name": "AMD EPYC 7B13", "backend": "cpu-eager", "torch_version": "2.5.0", "threads": 1, **hw}
    return CostCurve(hardware=hardware, model={"name": "smollm2-135m", "dtype": "float32"}, block_size=4,
                     context_len=256, verify=[{"batch_size": 1, "num_tokens": 1, "median_ms": 1.0}])


def test_fingerprint_recorded_and_compared():
    curve = _cpu_curve()
    assert curve.fingerprint == {"device_name": "AMD EPYC 7B13", "backend": "cpu-eager", "torch_version": "2.5.0",
                                 "threads": 1, "dtype": "float32", "context_len": 256}
    same = dict(device_name="AMD EPYC 7B13", torch_version="2.5.0", threads=1, dtype="float32", context_len=256)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert curve.check_hardware(**same)
    cases = {
        "device_name": ("Intel Xeon", r"measured on 'AMD EPYC 7B13' but this device is 'Intel Xeon'"),
        "torch_version": ("2.6.0", r"torch_version: curve '2\.5\.0', this run '2\.6\.0'"),
        "threads": (4, r"threads: curve 1, this run 4"),
        "dtype": ("bfloat16", r"dtype: curve 'float32', this run 'bfloat16'"),
        "context_len": (1024, r"context_len: curve 256, this run 1024"),
    }
    for key, (value, match) in cases.items():
        with pytest.warns(UserWarning, match=match):
            assert not curve.check_hardware(**{**same, key: value})
    # the defaults compare this machine: its CPU model, torch version and thread count
    import torch

    from dcut_sched.cost_curve import cpu_model_name

    here = _cpu_curve(device_name=cpu_model_name(), torch_version=torch.__version__, threads=torch.get_num_threads())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert here.check_hardware()
    with pytest.warns(UserWarning, match="threads: curve"):
        _cpu_curve(device_name=cpu_model_name(), torch_version=torch.__version__,
                   threads=torch.get_num_threads() + 1).check_hardware()


def test_analytic_curve_compares_context_and_dtype_only():
    curve = CostCurve(hardware={"device_name": "NVIDIA H200", "backend": "analytic"},
                      model={"name": "m", "dtype": "bfloat16"}, block_size=4, context_len=1024,
                      verify=[{"batch_size": 1, "num_tokens": 1, "median_ms": 1.0}])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert curve.check_hardware("NVIDIA H20")  # an analytic curve names a device it was not measured on
    with pytest.warns(UserWarning, match="context_len: curve 1024, this run 4096"):
        curve.check_hardware(context_len=4096)


# ---------------------------------------------------------------- property-based fuzzing
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _paths(doc, prefix=()):
    """Every (container, key) pair of a JSON document, for mutation."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


def _base_docs():
    docs = [_small_doc()]
    for path in GOOD_FILES:
        docs.append(json.loads(path.read_text()))
    return docs


BASE_DOCS = _base_docs()


@st.composite
def mutated_text(draw):
    doc = copy.deepcopy(BASE_DOCS[draw(st.integers(0, len(BASE_DOCS) - 1))])
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(doc))
        path = paths[draw(st.integers(0, len(paths) - 1))]
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "delete", "extra", "number"]))
        key = path[-1]
        if action == "replace":
            parent[key] = draw(JSON_VALUES)
        elif action == "delete":
            del parent[key]
        elif action == "extra" and isinstance(parent, dict):
            parent[draw(st.text(max_size=6))] = draw(JSON_VALUES)
        elif action == "number":
            parent[key] = draw(st.sampled_from([0, -1, 1, 1.5, True, False, None, "", 2**63, 1e308, -0.0]))
    text = json.dumps(doc)
    how = draw(st.sampled_from(["json", "truncate", "bytes"]))
    if how == "truncate":
        return text[: draw(st.integers(0, len(text)))].encode("utf-8")
    data = bytearray(text.encode("utf-8"))
    if how == "bytes" and data:
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@settings(max_examples=int(__import__("os").environ.get("FUZZ_EXAMPLES", "150")), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=mutated_text())
def test_fuzzed_files_load_and_round_trip_or_raise_cost_curve_error(tmp_path, data):
    path = tmp_path / "fuzz.json"
    path.write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            curve = CostCurve.load(path)  # the fingerprint check runs on whatever hardware the file has
        except CostCurveError as exc:
            assert str(path) in str(exc)
            return
        out = tmp_path / "fuzz-out.json"
        curve.save(out)
        back = CostCurve.load(out, check_hardware=False)
    assert back.to_dict() == curve.to_dict()
    # lookups at measured cells give the stored medians' isotonic fit, never an exception other than range
    for row in curve.verify[:3]:
        assert np.isfinite(curve.verify_ms(row.batch_size, row.num_tokens))
