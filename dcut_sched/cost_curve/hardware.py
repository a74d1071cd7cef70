"""Cost-curve hardware fingerprint: what the times depend on besides the model, and the check
that warns when a run differs from the machine a curve was measured on."""

from __future__ import annotations

import platform
import warnings
from typing import Any

__all__ = ["FINGERPRINT_FIELDS", "CurveHardware", "cpu_model_name"]

#: The fields of :attr:`CostCurve.fingerprint` that :meth:`CostCurve.check_hardware` compares.
FINGERPRINT_FIELDS = ("device_name", "backend", "torch_version", "threads", "dtype", "context_len")


def cpu_model_name() -> str:
    """This machine's CPU model (``model name`` of /proc/cpuinfo, else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


class CurveHardware:
    """The hardware half of :class:`~dcut_sched.cost_curve.CostCurve`."""

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What the times depend on besides the model: ``{device_name, backend, torch_version, threads,
        dtype, context_len}`` (``None`` where the file does not say; see :data:`FINGERPRINT_FIELDS`)."""
        hw = self.hardware
        return {"device_name": hw.get("device_name"), "backend": hw.get("backend"),
                "torch_version": hw.get("torch_version"), "threads": hw.get("threads"),
                "dtype": self.model.get("dtype"), "context_len": self.context_len}

    def check_hardware(self, device_name: str | None = None, *, torch_version: str | None = None,
                       threads: int | None = None, dtype: str | None = None, context_len: int | None = None) -> bool:
        """Warn (one ``UserWarning`` naming both sides) if this run differs from the curve's
        :attr:`fingerprint`.

        Compared, where both sides are known:
            - measured curves (``cuda-graph``, ``cuda-eager``, ``cpu-eager``): the device (the current CUDA
              device, or this machine's CPU model from :func:`cpu_model_name`, when ``device_name`` is
              None) and the torch version (``torch.__version__`` by default, once a device is known);
              CPU curves also the thread count (``torch.get_num_threads()`` by default);
            - every curve (``analytic`` too): ``dtype`` and ``context_len`` when given.

        Returns:
            True when nothing compared differs.
        """
        fp = self.fingerprint
        backend = fp["backend"]
        here: dict[str, Any] = {"dtype": dtype, "context_len": context_len, "device_name": None,
                                "torch_version": None, "threads": None}
        if backend in ("cuda-graph", "cuda-eager", "cpu-eager"):
            import torch

            if device_name is None:
                if backend == "cpu-eager":
                    device_name = cpu_model_name()
                elif torch.cuda.is_available():
                    device_name = torch.cuda.get_device_name()
            here["device_name"] = device_name
            if device_name is not None:
                here["torch_version"] = torch_version or torch.__version__
            if backend == "cpu-eager":
                here["threads"] = torch.get_num_threads() if threads is None else threads
        diffs = [(k, fp[k], here[k]) for k in FINGERPRINT_FIELDS
                 if here.get(k) is not None and fp.get(k) is not None and str(fp[k]) != str(here[k])]
        if not diffs:
            return True
        lead = (f"{self._where()} was measured on {fp['device_name']!r} but this device is {here['device_name']!r}"
                if diffs[0][0] == "device_name" else f"{self._where()} was measured under another setup")
        detail = "; ".join(f"{k}: curve {a!r}, this run {b!r}" for k, a, b in diffs)
        warnings.warn(
            f"{lead} ({detail}); its times may not describe this run (re-profile with dcut-profile --gpu/--cpu "
            f"on this machine, at this dtype, thread count and context length)",
            UserWarning,
            stacklevel=2,
        )
        return False
