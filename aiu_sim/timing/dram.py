"""The calibrated DRAM model (HW §2, TS-CM): what one kernel's DRAM traffic costs.

- One-way traffic (read-only or write-only) streams at `dram_effective_gbps` (~150 GB/s measured), not the 204.8 GB/s
  pin peak; the memory node's 166 GB/s ring port explains the ceiling (AH-RING).
- Mixed traffic pays a read/write turnaround of alpha * min(R, W) (alpha = 0.00574 ns/byte), so a 1:1 mix reaches
  ~105 GB/s. The engine charges it incrementally per chunk (engine.py); over a kernel the sum is exactly this formula.
- A kernel whose DRAM traffic comes from n cores reaches only g(n) of the bus (g(1) = 0.11 ... g(32) = 1.0, TS-CM's
  fit for streaming reductions). Modelled as the DRAM server's rate for that kernel: 150 GB/s * g(n). Applying the
  streaming-reduction fit to every kernel class is an assumption.
- Restickify: TS-CM fits this op class its own effective rate (~116 GB/s over read + written bytes, STACK §7). That
  is above the 105 GB/s the turnaround formula gives a 1:1 mix, so the measured transposes evidently do not pay the
  generic turnaround; restickify kernels are charged no turnaround and are capped by `restickify_gbps` instead
  (kernels.py), so the fitted rate is not double counted. A broadcast (a copy whose output has a dim its input does
  not, e.g. expand) is treated the same way with TS-CM's broadcast rate, ~118 GB/s (STACK §7): `class_rate_gbps`.
- Cross-row reductions: TS-CM fits streaming-reduction read bandwidth falling with row count,
  min(150, 114 + 61 exp(-rows/3700)) GB/s (HW §2). The reference does not say what "rows" counts. Read here as the
  reduced extent of a reduction over a dim that is not the stick (a cross-row reduction): that is the one reading
  under which the fit agrees with both the 150 GB/s of read-only traffic (measured on a row sum along the stick)
  and the ~113 GB/s of cross-row reductions (STACK §7), which is the fit's asymptote. An interpretation, marked so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aiu_sim.config import HardwareConfig
from aiu_sim.ir.program import Buffer, Kernel, stick_dims


@dataclass(frozen=True)
class DramModel:
    bandwidth: float  # bytes per ns (= GB/s) for this kernel, after the active-core fraction
    alpha_ns_per_byte: float

    @property
    def ns_per_byte(self) -> float:
        return 1.0 / self.bandwidth

    def time_ns(self, read_bytes: float, write_bytes: float) -> float:
        """Closed form of what the engine charges for a kernel's whole traffic, for reports and tests."""
        return (read_bytes + write_bytes) / self.bandwidth + self.alpha_ns_per_byte * min(
            read_bytes, write_bytes
        )


def kernel_dram_model(
    config: HardwareConfig, active_cores: int, turnaround: bool = True, stream_gbps: float | None = None
) -> DramModel:
    """The DRAM server of a kernel whose traffic comes from `active_cores` cores; `stream_gbps` caps the one-way
    rate below `dram_effective_gbps` (a cross-row reduction's row-count fit)."""
    fraction = config.dram_fraction(max(1, active_cores))
    alpha = config.dram_turnaround_ns_per_byte if turnaround else 0.0
    one_way = min(config.dram_effective_gbps, stream_gbps or config.dram_effective_gbps)
    return DramModel(bandwidth=one_way * fraction, alpha_ns_per_byte=alpha)


def class_rate_gbps(kernel: Kernel, config: HardwareConfig) -> float | None:
    """TS-CM's own effective rate (read + written bytes, all cores) for the kernel's op class, or None when the
    generic DRAM model applies: restickify (~116 GB/s) and broadcast copies (~118 GB/s), STACK §7."""
    if kernel.op == "restickify":
        return config.restickify_gbps
    if kernel.op == "copy":
        read = {d for a in kernel.inputs for d in a.dims if d is not None}
        if any(d is not None and d not in read for a in kernel.outputs for d in a.dims):
            return config.broadcast_gbps
    return None


def reduction_stream_gbps(kernel: Kernel, buffers: dict[str, Buffer], config: HardwareConfig) -> float | None:
    """The row-count fit's one-way rate of a cross-row reduction (module doc), None for any other kernel."""
    if kernel.op != "reduce" or not kernel.reduce_dims:
        return None
    if any(d in stick_dims(kernel, buffers) for d in kernel.reduce_dims):
        return None
    rows = math.prod(kernel.space[d] for d in kernel.reduce_dims)
    return config.reduction_rows_floor_gbps + config.reduction_rows_excess_gbps * math.exp(
        -rows / config.reduction_rows_scale
    )


def mixed_bandwidth_gbps(
    config: HardwareConfig, read_fraction: float, active_cores: int | None = None
) -> float:
    """Bytes per ns of (read + write) traffic at a given read share, from `active_cores` (default: all) cores."""
    model = kernel_dram_model(config, config.num_cores if active_cores is None else active_cores)
    total = 1e9
    return total / model.time_ns(total * read_fraction, total * (1 - read_fraction))
