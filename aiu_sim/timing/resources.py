"""The chip's timed resources: one index per server, with its name, kind, rate, and the ring paths between them.

Every resource is a single first-come-first-served server (engine.py). Per core: one DMA engine (the MNI that moves
sticks between the data ring and LX), the PT array and the SFP unit of each corelet, and the LX port. Shared: each
data-ring link per direction, each partial-sum ring link per direction, the DRAM (memory node) and PCIe.

Ring geometry (HW §4, AH-RING): the data ring has cores + 1 nodes with the memory node at
`config.memory_node_position` (an assumption: position 0); cores fill the other positions in order. The two
partial-sum rings connect the cores only (an assumption: the memory node takes no part in partial sums); the
clockwise one belongs to corelet 0, the counter-clockwise one to corelet 1 (HW §4).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from aiu_sim.config import HardwareConfig

CW, CCW = 0, 1
DIRECTION_NAMES = ("cw", "ccw")

# Unit kinds, used for per-unit utilization and trace tracks.
DMA, PT, SFP, LX, RING, PSUM, DRAM, PCIE = "dma", "pt", "sfp", "lx", "ring", "psum", "dram", "pcie"


@dataclass(frozen=True)
class ResourceMap:
    """Resource indices for one config. Layout: per-core units first, then ring links, psum links, DRAM, PCIe."""

    config: HardwareConfig

    # --- sizes (cached: the task-graph builder asks for them per task) ---
    @cached_property
    def corelets(self) -> int:
        return self.config.corelets_per_core

    @cached_property
    def units_per_core(self) -> int:
        return 2 + 2 * self.corelets  # DMA, PT x corelets, SFP x corelets, LX port

    @cached_property
    def ring_nodes(self) -> int:
        return self.config.ring_nodes

    @cached_property
    def _ring_base(self) -> int:
        return self.config.num_cores * self.units_per_core

    @cached_property
    def _psum_base(self) -> int:
        return self._ring_base + 2 * self.ring_nodes

    @cached_property
    def dram(self) -> int:
        return self._psum_base + 2 * self.config.num_cores

    @cached_property
    def pcie(self) -> int:
        return self.dram + 1

    @cached_property
    def size(self) -> int:
        return self.pcie + 1

    # --- per-core units ---
    def dma(self, core: int) -> int:
        return core * self.units_per_core

    def pt(self, core: int, corelet: int) -> int:
        return core * self.units_per_core + 1 + corelet

    def sfp(self, core: int, corelet: int) -> int:
        return core * self.units_per_core + 1 + self.corelets + corelet

    def lx(self, core: int) -> int:
        return core * self.units_per_core + 1 + 2 * self.corelets

    # --- links ---
    def ring_link(self, direction: int, node: int) -> int:
        """The data-ring link leaving `node` in `direction` (cw: node -> node+1, ccw: node -> node-1)."""
        return self._ring_base + direction * self.ring_nodes + node

    def psum_link(self, direction: int, core: int) -> int:
        return self._psum_base + direction * self.config.num_cores + core

    # --- rates, bytes per ns (GB/s) ---
    @cached_property
    def dma_rate(self) -> float:
        # Assumption: the MNI moves one ring flit (128 B) per ring cycle, the width of its ring port (HW §4).
        return self.config.ring_bytes_per_cycle * self.config.ring_clock_ghz

    @cached_property
    def lx_rate(self) -> float:
        return (
            self.config.lx_port_bytes_per_cycle * self.config.core_clock_ghz
        )  # HW §1: 128 B/cycle at 1.1 GHz

    @cached_property
    def ring_rate(self) -> float:
        return (
            self.config.ring_bytes_per_cycle * self.config.ring_clock_ghz
        )  # HW §4: 166.4 GB/s per direction

    @cached_property
    def psum_rate(self) -> float:
        return self.config.psum_ring_bytes_per_cycle * self.config.core_clock_ghz  # HW §4: 35.2 GB/s per ring

    @cached_property
    def ring_hop_ns(self) -> float:
        return self.config.ring_hop_latency_cycles / self.config.ring_clock_ghz

    @cached_property
    def request_header_ns(self) -> float:
        """A request header's serialization on the 1 B/cycle request ring (HW §4), before its hops."""
        cfg = self.config
        return cfg.request_header_bytes / (cfg.request_ring_bytes_per_cycle * cfg.ring_clock_ghz)

    def request_ns(self, core: int) -> float:
        """From a core's DMA read request to the memory node starting to serve it: header plus hops (HW §4)."""
        return self.request_header_ns + len(self.path_to_memory(core)) * self.ring_hop_ns

    @cached_property
    def psum_hop_ns(self) -> float:
        return self.config.psum_hop_latency_cycles / self.config.core_clock_ghz

    # --- geometry ---
    def core_node(self, core: int) -> int:
        """Data-ring position of a core: the positions other than the memory node's, in order."""
        return core if core < self.config.memory_node_position else core + 1

    @cached_property
    def _paths_from_memory(self) -> tuple[tuple[int, ...], ...]:
        mem = self.config.memory_node_position
        return tuple(self.ring_path(mem, self.core_node(c)) for c in range(self.config.num_cores))

    @cached_property
    def _paths_to_memory(self) -> tuple[tuple[int, ...], ...]:
        mem = self.config.memory_node_position
        return tuple(self.ring_path(self.core_node(c), mem) for c in range(self.config.num_cores))

    def path_from_memory(self, core: int) -> tuple[int, ...]:
        return self._paths_from_memory[core]

    def path_to_memory(self, core: int) -> tuple[int, ...]:
        return self._paths_to_memory[core]

    def ring_path(self, src: int, dst: int) -> tuple[int, ...]:
        """Data-ring links from node src to node dst along the shorter direction (clockwise on a tie)."""
        return _shorter_path(src, dst, self.ring_nodes, self.ring_link)

    def psum_path(self, src_core: int, dst_core: int) -> tuple[int, ...]:
        """Partial-sum ring links from one core to another, on whichever of the two rings is shorter."""
        return _shorter_path(src_core, dst_core, self.config.num_cores, self.psum_link)

    # --- names and kinds, for reports and traces ---
    @cached_property
    def names(self) -> tuple[str, ...]:
        names: list[str] = []
        for c in range(self.config.num_cores):
            names.append(f"core{c}.dma")
            names += [f"core{c}.pt{j}" for j in range(self.corelets)]
            names += [f"core{c}.sfp{j}" for j in range(self.corelets)]
            names.append(f"core{c}.lx")
        for d in (CW, CCW):
            names += [f"ring.{DIRECTION_NAMES[d]}.{n}" for n in range(self.ring_nodes)]
        for d in (CW, CCW):
            names += [f"psum.{DIRECTION_NAMES[d]}.{c}" for c in range(self.config.num_cores)]
        return (*names, "dram", "pcie")

    @cached_property
    def kinds(self) -> tuple[str, ...]:
        per_core = [DMA] + [PT] * self.corelets + [SFP] * self.corelets + [LX]
        kinds = per_core * self.config.num_cores
        kinds += [RING] * (2 * self.ring_nodes) + [PSUM] * (2 * self.config.num_cores)
        return (*kinds, DRAM, PCIE)

    def core_of(self, rid: int) -> int | None:
        return rid // self.units_per_core if rid < self._ring_base else None


def _shorter_path(src: int, dst: int, nodes: int, link) -> tuple[int, ...]:
    if src == dst:
        return ()
    cw_hops = (dst - src) % nodes
    ccw_hops = (src - dst) % nodes
    if cw_hops <= ccw_hops:
        return tuple(link(CW, (src + h) % nodes) for h in range(cw_hops))
    return tuple(link(CCW, (src - h) % nodes) for h in range(ccw_hops))
