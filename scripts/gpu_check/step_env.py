"""Steps ``env`` (GPU, driver, CUDA, torch, packages) and ``pytest`` (the CUDA-marked tests)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from common import PACKAGE_USES, REPO, StepResult, can_run, version_of
from settings import Settings

NVIDIA_SMI_FIELDS = ("name", "driver_version", "memory.total", "memory.used", "compute_cap", "clocks.max.sm",
                     "power.limit", "mig.mode.current", "persistence_mode")
MIN_FREE_GIB = 40.0  # 16 GB of bf16 weights, ~10 GB KV cache, logits and graph pools of the profile


def _nvidia_smi(args: list[str]) -> tuple[int, str]:
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError) as exc:
        return -1, f"{type(exc).__name__}: {exc}"
    return out.returncode, (out.stdout + out.stderr).strip()


def run_env(res: StepResult, cfg: Settings) -> None:
    res.figure("python", sys.version.split()[0])
    res.figure("platform", platform.platform())
    res.figure("cpu_count", os.cpu_count())
    versions = {name: version_of(name) for name in PACKAGE_USES}
    res.figure("packages", versions)
    absent = [n for n, v in versions.items() if v is None]
    res.check("packages the steps need", True if not absent else None, value=", ".join(absent) or "all present",
              skip_reason="missing: " + "; ".join(f"{n} ({PACKAGE_USES[n]})" for n in absent) if absent else None)
    if "torch" in absent:
        res.check("torch imports", False, detail="torch is not installed: no step can run",
                  hint="use the machine's own python3 with torch installed")
        return
    import torch

    res.figure("torch", torch.__version__)
    res.figure("torch_cuda", torch.version.cuda)
    res.figure("cudnn", torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    res.measure("python / torch / CUDA build / cuDNN", f"{sys.version.split()[0]} / {torch.__version__} / "
                f"{torch.version.cuda or 'none'} / {res.doc['figures']['cudnn'] or 'none'}")
    if cfg.dry_run:
        res.check("torch sees a CUDA device", None, value=torch.cuda.is_available(),
                  skip_reason="dry run: CPU only")
    else:
        has = torch.cuda.is_available()
        res.check("torch sees a CUDA device", has, value=torch.cuda.device_count() if has else 0,
                  detail="" if has else f"torch {torch.__version__} (CUDA build: {torch.version.cuda}) sees no GPU",
                  hint=None if has else "a CPU-only torch build, or CUDA_VISIBLE_DEVICES hides the GPU")
        if has:
            props = torch.cuda.get_device_properties(0)
            res.figure("gpu", {"name": torch.cuda.get_device_name(0), "capability": f"{props.major}.{props.minor}",
                               "memory_gib": round(props.total_memory / 2**30, 1),
                               "multiprocessors": props.multi_processor_count})
            res.measure("GPU", f"{torch.cuda.get_device_name(0)}, sm {props.major}.{props.minor}, "
                               f"{props.total_memory / 2**30:.1f} GiB, {props.multi_processor_count} SMs")
            res.check("bf16 supported", torch.cuda.is_bf16_supported(), value=torch.cuda.is_bf16_supported())
            free, total = torch.cuda.mem_get_info()
            res.check(f"free GPU memory >= {MIN_FREE_GIB:.0f} GiB", free / 2**30 >= MIN_FREE_GIB,
                      value=round(free / 2**30, 1), unit="GiB",
                      detail=f"of {total / 2**30:.1f} GiB; another process may hold the rest (see nvidia-smi)")
    fields = NVIDIA_SMI_FIELDS
    rc, text = _nvidia_smi([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
    if rc > 0:  # an older driver without one of the fields: ask for the basic ones
        fields = NVIDIA_SMI_FIELDS[:4]
        rc, text = _nvidia_smi([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
    if rc == 0:
        rows = [dict(zip(fields, (x.strip() for x in line.split(",")))) for line in text.splitlines()]
        res.figure("nvidia_smi", rows)
        res.measure("nvidia-smi", "; ".join(", ".join(f"{k} {v}" for k, v in r.items()) for r in rows)[:300])
        rc_apps, apps = _nvidia_smi(["--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"])
        res.figure("gpu_processes", apps.splitlines() if rc_apps == 0 else apps)
        full = res.out / "env" / "nvidia-smi.txt"
        full.parent.mkdir(exist_ok=True)
        full.write_text(_nvidia_smi([])[1] + "\n", encoding="utf-8")
        res.artifact(full)
    else:
        res.figure("nvidia_smi", text.splitlines()[:3])
        if not cfg.dry_run:
            res.check("nvidia-smi runs", False, detail=text.splitlines()[0] if text else f"exit {rc}",
                      hint="the driver version then comes from torch only")


def cuda_test_files() -> list[Path]:
    """Test files that hold a ``@pytest.mark.cuda`` test (collected alone: the rest of the suite may
    need packages a bare GPU image lacks)."""
    return sorted(p for p in (REPO / "tests").rglob("test_*.py") if "pytest.mark.cuda" in p.read_text(encoding="utf-8"))


def _junit(path: Path) -> dict:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    out = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "failed_names": [], "skip_reasons": set()}
    for s in suites:
        for key in ("tests", "failures", "errors", "skipped"):
            out[key] += int(s.get(key, 0))
        for case in s.iter("testcase"):
            for tag in ("failure", "error"):
                for el in case.findall(tag):
                    msg = (el.get("message") or "").strip().splitlines()
                    out["failed_names"].append(f"{case.get('classname')}::{case.get('name')}: "
                                               f"{msg[0][:200] if msg else tag}")
            for el in case.findall("skipped"):
                out["skip_reasons"].add((el.get("message") or "").strip()[:120])
    out["skip_reasons"] = sorted(out["skip_reasons"])
    return out


def run_pytest(res: StepResult, cfg: Settings) -> None:
    if not can_run(res, ("pytest", "torch", "numpy", "scipy"), cuda=False, dry_run=cfg.dry_run):
        return
    import pytest

    files = cuda_test_files()
    res.figure("files", [str(p.relative_to(REPO)) for p in files])
    xml = res.out / "pytest-cuda.xml"
    args = [*map(str, files), "-m", "cuda", "-o", "addopts=", "-p", "no:cacheprovider", "-q", "-rA",
            f"--rootdir={REPO}", f"--junitxml={xml}"]
    res.note("python3 -m pytest " + " ".join(args))
    rc = int(pytest.main(args))
    res.figure("exit_status", rc)
    if not xml.exists():
        res.check("pytest -m cuda ran", False, value=rc, detail="no junit file: pytest stopped before running tests",
                  hint="see logs/pytest.log (a plugin or conftest import error)")
        return
    res.artifact(xml)
    j = _junit(xml)
    ran = j["tests"] - j["skipped"]
    for key in ("tests", "failures", "errors", "skipped"):
        res.figure(key, j[key])
    bad = j["failures"] + j["errors"]
    if bad:
        res.check("cuda-marked tests pass", False, value=f"{bad} of {j['tests']} failed",
                  detail="; ".join(j["failed_names"][:6]), hint="pytest's own report is in logs/pytest.log")
    elif cfg.dry_run:
        res.check("cuda-marked tests pass", None, value=f"{j['tests']} collected, {ran} ran",
                  skip_reason="dry run: no CUDA, the cuda tests skip themselves"
                  + (f" ({'; '.join(j['skip_reasons'])})" if j["skip_reasons"] else ""))
    elif ran == 0:
        res.check("cuda-marked tests pass", False, value=f"0 of {j['tests']} ran",
                  detail="every cuda test was skipped although this is the GPU run: "
                         + "; ".join(j["skip_reasons"]), hint="torch.cuda.is_available() is False in pytest")
    else:
        res.check("cuda-marked tests pass", rc == 0, value=f"{ran} passed", detail=f"pytest exit status {rc}")
