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
  (kernels.py), so the fitted rate is not double counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiu_sim.config import HardwareConfig


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


def kernel_dram_model(config: HardwareConfig, active_cores: int, turnaround: bool = True) -> DramModel:
    """The DRAM server of a kernel whose traffic comes from `active_cores` cores."""
    fraction = config.dram_fraction(max(1, active_cores))
    alpha = config.dram_turnaround_ns_per_byte if turnaround else 0.0
    return DramModel(bandwidth=config.dram_effective_gbps * fraction, alpha_ns_per_byte=alpha)


def mixed_bandwidth_gbps(
    config: HardwareConfig, read_fraction: float, active_cores: int | None = None
) -> float:
    """Bytes per ns of (read + write) traffic at a given read share, from `active_cores` (default: all) cores."""
    model = kernel_dram_model(config, config.num_cores if active_cores is None else active_cores)
    total = 1e9
    return total / model.time_ns(total * read_fraction, total * (1 - read_fraction))
