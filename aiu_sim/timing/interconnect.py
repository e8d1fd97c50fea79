"""Time of one card-to-card collective (spyreccl) on the simulated interconnect.

What is public (../shared/reference/spyre_hardware.md §1-§2, torch_spyre_api.md §8): each card sits behind its own
PCIe Gen5 x16 link (~64 GB/s per direction, TS-DEV) on a switch fabric with card-to-card RDMA; spyreccl is single
node, up to 8 cards, blocking, SUM only. Its transport library is closed source, so the algorithms below are
assumptions, the textbook bandwidth-optimal ones NCCL-style libraries use:

    op          algorithm                                  steps       bytes over the busiest card's link
    all_reduce  ring reduce-scatter + ring all-gather       2(N-1)      2(N-1)/N * B
    reduce      ring reduce-scatter + gather to the root    N           2(N-1)/N * B
    broadcast   scatter from the root + ring all-gather     N           2(N-1)/N * B
    all_gather  ring                                        N-1         (N-1) * B
    gather      every rank sends to the root at once        1           (N-1) * B
    send/recv   one transfer                                1           B
    barrier     dissemination                               ceil(log2 N)  0

B is the tensor each rank passes in (for all_gather and gather, one rank's contribution). A step costs
`collective_step_latency_us`; bytes move at `pcie_gbps * collective_link_efficiency`, since the switch is not the
bottleneck and a card's link is. With `collective_path = "host"` every transfer is staged through host memory:
two link crossings, store-and-forward, so steps and bytes cost twice. Not modelled: the adds of a reduction (a few
bytes per element on the device, small beside the link), contention with kernels for DRAM, and switch hops.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from aiu_sim.config import HardwareConfig
from aiu_sim.errors import ConfigError

# the collectives and the card limit are the IR's (a Collective step names one): imported, not spelled twice
from aiu_sim.ir.ops import COLLECTIVES, MAX_CARDS


@dataclass(frozen=True)
class CollectiveTiming:
    op: str
    nbytes: int  # bytes of the tensor each rank passes in
    world_size: int
    path: str  # HardwareConfig.collective_path
    steps: int  # sequential transfer steps
    link_bytes: int  # bytes over the busiest card's link, one direction
    latency_us: float
    transfer_us: float

    @property
    def total_us(self) -> float:
        return self.latency_us + self.transfer_us

    def to_dict(self) -> dict:
        return {**asdict(self), "total_us": self.total_us}


def _steps_and_bytes(op: str, nbytes: int, n: int) -> tuple[int, int]:
    if op in ("send", "recv"):
        return 1, nbytes
    if n == 1:
        return 0, 0
    ring_share = 2 * math.ceil((n - 1) * nbytes / n)
    return {
        "all_reduce": (2 * (n - 1), ring_share),
        "reduce": (n, ring_share),
        "broadcast": (n, ring_share),
        "all_gather": (n - 1, (n - 1) * nbytes),
        "gather": (1, (n - 1) * nbytes),
        "barrier": (math.ceil(math.log2(n)), 0),
    }[op]


def collective_time(op: str, nbytes: int, world_size: int, config: HardwareConfig) -> CollectiveTiming:
    """Simulated time of collective `op` over `world_size` cards, each passing a tensor of `nbytes` bytes."""
    if op not in COLLECTIVES:
        raise ConfigError(f"unknown collective {op!r}; known: {', '.join(COLLECTIVES)}")
    if not isinstance(world_size, int) or not 1 <= world_size <= MAX_CARDS:
        raise ConfigError(f"world size {world_size!r} is out of range: spyreccl runs on 1..{MAX_CARDS} cards")
    if nbytes < 0:
        raise ConfigError(f"a collective moves a non-negative number of bytes, got {nbytes}")
    steps, link_bytes = _steps_and_bytes(op, int(nbytes), world_size)
    crossings = 2 if config.collective_path == "host" else 1
    gbps = config.pcie_gbps * config.collective_link_efficiency  # GB/s == bytes/ns
    return CollectiveTiming(
        op=op,
        nbytes=int(nbytes),
        world_size=world_size,
        path=config.collective_path,
        steps=steps,
        link_bytes=link_bytes,
        latency_us=crossings * steps * config.collective_step_latency_us,
        transfer_us=crossings * link_bytes / gbps / 1e3,
    )
