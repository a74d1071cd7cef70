"""Public peak figures of the GPUs the analytic cost model knows (dense bf16 FLOP/s, HBM bandwidth).

Every figure is the vendor's public datasheet number for the SXM (or, for the H20, the only) board;
"dense" means without the 2:4 structured-sparsity doubling that datasheets often quote first.
They are *peaks*: the analytic model (:mod:`dcut_sched.profiler.analytic`) multiplies them by efficiency
factors that :mod:`dcut_sched.profiler.efficiency_fit` can fit to a measured or published curve.

Sources:
    h200: NVIDIA H200 Tensor Core GPU datasheet (H200 SXM: BF16 Tensor Core 1,979 TFLOPS with
          sparsity, i.e. 989 TFLOPS dense; 141 GB HBM3e at 4.8 TB/s).
    h100: NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: BF16 1,979 TFLOPS with sparsity, i.e.
          989 TFLOPS dense; 80 GB HBM3 at 3.35 TB/s).
    h20:  NVIDIA HGX H20 product brief as reported publicly (BF16 148 TFLOPS dense; 96 GB HBM3 at
          4.0 TB/s).
    a100: NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM: BF16 312 TFLOPS dense; HBM2e at
          2,039 GB/s).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["DEVICES", "DeviceSpec", "get_device"]


@dataclass(frozen=True)
class DeviceSpec:
    """One GPU's public peaks.

    Attributes:
        key: short name used on the command line (``h200``).
        name: the name ``torch.cuda.get_device_name()`` reports for it (used in curve files, so that
            :meth:`dcut_sched.CostCurve.check_hardware` compares like with like).
        peak_bf16_tflops: dense bf16 tensor-core peak, 1e12 FLOP/s.
        hbm_tb_per_s: HBM bandwidth, 1e12 bytes/s.
        memory_gb: HBM capacity, 1e9 bytes (for information).
        source: where the figures come from.
    """

    key: str
    name: str
    peak_bf16_tflops: float
    hbm_tb_per_s: float
    memory_gb: float
    source: str

    @property
    def peak_flops(self) -> float:
        """Dense bf16 peak in FLOP/s."""
        return self.peak_bf16_tflops * 1e12

    @property
    def bytes_per_s(self) -> float:
        """HBM bandwidth in bytes/s."""
        return self.hbm_tb_per_s * 1e12

    def to_dict(self) -> dict:
        return asdict(self)


DEVICES: dict[str, DeviceSpec] = {
    "h200": DeviceSpec("h200", "NVIDIA H200", 989.0, 4.8, 141.0,
                       "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM (1,979 TFLOPS bf16 with sparsity)"),
    "h100": DeviceSpec("h100", "NVIDIA H100 80GB HBM3", 989.0, 3.35, 80.0,
                       "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM (1,979 TFLOPS bf16 with sparsity)"),
    "h20": DeviceSpec("h20", "NVIDIA H20", 148.0, 4.0, 96.0,
                      "NVIDIA HGX H20 public specifications (148 TFLOPS bf16 dense, 4.0 TB/s HBM3)"),
    "a100": DeviceSpec("a100", "NVIDIA A100-SXM4-80GB", 312.0, 2.039, 80.0,
                       "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM"),
}


def get_device(key: str) -> DeviceSpec:
    """The :class:`DeviceSpec` for ``key`` (case-insensitive).

    Raises:
        KeyError: unknown device; the message lists the known ones.
    """
    try:
        return DEVICES[key.lower()]
    except KeyError:
        raise KeyError(f"unknown device {key!r}; known devices: {', '.join(DEVICES)}") from None
