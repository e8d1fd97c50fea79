"""The simulated chip's parameters: one frozen dataclass, presets as TOML data files.

Every default cites ../shared/reference/spyre_hardware.md ("HW §n") or torch_spyre_stack.md ("STACK §n"),
or says it is an assumption. Source keys (TS-CM, AH-RING, ...) are the ones the reference uses.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from aiu_sim.errors import ConfigError
from aiu_sim.numerics.formats import STICK_BYTES  # HW §7: 128 B, aligned; the unit of DRAM<->LX transfer

KIB = 1024
MIB = 1024 * 1024
COLLECTIVE_PATHS = ("p2p", "host")  # how card-to-card data moves (HardwareConfig.collective_path)


@dataclass(frozen=True)
class HardwareConfig:
    name: str = "spyre"

    # --- chip ---
    num_cores: int = 32  # HW §1: 32 active AI cores (TS-DEV, TS-KC)
    corelets_per_core: int = 2  # HW §1 (IBM-BLOG, TS-KC)
    core_clock_ghz: float = 1.1  # HW §2: PT/LX/SFP clock of the DD2 sysconfig (AH-MM); §8 default
    ring_clock_ghz: float = 1.3  # HW §2: data ring and memory node clock (AH-RING); §8 default

    # --- PT systolic array, per corelet ---
    pt_rows: int = 8  # HW §3: 8x8 PEs (IBM-BLOG)
    pt_cols: int = 8
    pt_k_simd_fp16: int = 8  # HW §3: 8-deep K SIMD for fp16 -> 512 MAC/cycle/corelet (AH-MM)
    # HW §1: lower precisions widen only the K SIMD (AH-MM, TS-WD): fp8 x2, int8 x4, int4 x8.
    pt_precision_scale: dict = field(
        default_factory=lambda: {"dl16": 1, "fp32": 1, "fp8_e4m3": 2, "fp8_e5m2": 2, "int8": 4, "int4": 8}
    )
    # STACK §7 / HW §3: a batched matmul in the default layout (batch just inside the stick) sustains
    # ~160 of the 1140 MAC/ns/core a 2-D matmul reaches (TS-CM). Modelled as an efficiency factor.
    bmm_batch_inner_efficiency: float = 160 / 1140
    # HW §3 (TS-CM): the same measurement with the batch outermost gives 460-490 MAC/ns/core (midpoint taken), and a
    # "projection" with one rank-3 operand (x (B, M, K) @ w (K, N)) 705 for B <= 4, 470 above. Also efficiency
    # factors against the 1140 of a 2-D matmul (compute.py says when each applies).
    bmm_batch_outer_efficiency: float = 475 / 1140
    projection_small_batch_efficiency: float = 705 / 1140
    projection_large_batch_efficiency: float = 470 / 1140
    projection_small_batch_max: int = 4  # HW §3: "705 (B <= 4) or 470"
    pt_min_m_rows: int = 8  # HW §3: the per-core M tile must be >= 8 to fill the PT rows (TS-WD)

    # --- SFP vector unit, per corelet ---
    sfp_lanes: int = 64  # HW §3/§8: 64 fp16 lanes per corelet (assumption from ktir-cpu; width not public)
    sfp_transcendental_cost: float = 4.0  # HW §8: 4x cost for exp/log/tanh/... (ktir-cpu estimate)

    # --- LX scratchpad, per core ---
    lx_bytes: int = 2 * MIB  # HW §1: 2 MiB per core (TS-DEV, TS-SP)
    lx_allocatable_bytes: int = 1638 * KIB  # HW §1: "1638 KB budget" after reservations (TS-CM, TS-SP)
    lx_port_bytes_per_cycle: int = 128  # HW §1: one 128 B/cycle port shared by all on-core agents (AH-RING)
    # HW §3 "LX cliff" (AH-MM, medium confidence): in the KG3 dataflow a matmul's PSUM footprint M/m x N/n x 4 B (one
    # core's output slice in fp32) must fit LX; when it does not, "measured wall time grows by 7-15x". A kernel past
    # it (KernelTiming.plan["past_lx_cliff"]) takes this many times its pipelined time. Default 1: TS-CM's sweep of
    # 1,535 configurations fits matmul at 1140 / 705 / 470 MAC/ns/core with no cliff derate (its only LX-spill derate
    # is fused softmax's) and under-predicts matmul by 22-31%, not 7x (STACK §7, HW §6), so the backend it measured
    # did not fall off the cliff on shapes like its sweep's; the tiler's M-outer loop and its extra traffic stand for
    # that. An assumption: ASSUMPTION_RANGES bands it 1..15, AH-MM's measurement at the top.
    lx_cliff_slowdown: float = 1.0
    # HW §3 / STACK §7 (TS-CM fitted): "when a tiled softmax holds several live intermediates, LX starts spilling to
    # DRAM from about 512 KB of working set per core". The tile budget of a fused row op (softmax, and by assumption
    # layernorm / rmsnorm, which hold intermediates too): one whose rows cannot be tiled under it spills, i.e. reads
    # its input twice (kernels.py). "About": ASSUMPTION_RANGES bands it 256 KiB .. the allocatable LX.
    row_op_lx_working_set_bytes: int = 512 * KIB

    # --- data ring (RIU) ---
    ring_bytes_per_cycle: int = 128  # HW §4: per direction (TS-KC, AH-RING)
    ring_hop_latency_cycles: int = 2  # HW §4: assumption (no hop latency is published)
    memory_node_position: int = 0  # HW §4: assumption, memory node at ring position 0

    # --- request ring (RIU request) ---
    # HW §1/§4 (AH-RING): a bidirectional ring of 1 B/cycle per direction at the ring clock carries request headers.
    # Modelled as latency: a DRAM read (load or multicast) waits for its request header to reach the memory node,
    # header bytes at 1 B/cycle plus the hops, before its data leaves; a write is posted (its header travels with the
    # data, an assumption). Not contended: how many requests a transfer needs is not public. Header size not public
    # (HW §4 proposes a 64 B minimum data packet "with its header on the request ring"): assumption 8 B, band 0..64.
    request_ring_bytes_per_cycle: int = 1
    request_header_bytes: int = 8

    # Multicast delivery (HW §4 "Multicast"): an operand several cores share is read from DRAM once and broadcast on
    # the ring; past `multicast_cohort_limit` receivers its delivery is slower by max(1, receivers / limit) ** exponent
    # (TS-WD's _COHORT_LIMIT = 8 and its cohort penalty max(1, max(m, n) / 8), STACK §1.4; "one version uses exponent
    # 0.75", HW §4). The penalty is the real stack's cost model's, not a measurement; that the ring's delivery follows
    # it is an assumption (ASSUMPTION_RANGES: exponent 0, no penalty, to 1). tasks.py charges it on the ring links.
    multicast_cohort_limit: int = 8
    multicast_cohort_exponent: float = 1.0

    # --- partial-sum (SFP) rings ---
    psum_ring_bytes_per_cycle: int = 32  # HW §1: 2 unidirectional rings, 32 B/cycle at core clock (AH-RING)
    psum_hop_latency_cycles: int = 8  # HW §4: 8 cycles per hop per 8x8 fp32 tile (AH-RING)

    # --- DRAM (LPDDR5) ---
    dram_peak_gbps: float = 204.8  # HW §1: 16 ch x 6.4 Gb/s (TS-WD, ISSCC26)
    dram_effective_gbps: float = 150.0  # HW §2: measured read-only or write-only peak (TS-CM)
    dram_turnaround_ns_per_byte: float = 0.00574  # HW §2: alpha*min(R,W) penalty (TS-CM) -> ~105 GB/s at 1:1
    # HW §2: fraction of the shared bus a streaming kernel on n active cores reaches (TS-CM fit).
    dram_active_core_fraction: dict = field(
        default_factory=lambda: {1: 0.11, 2: 0.22, 4: 0.43, 8: 0.54, 16: 0.54, 32: 1.0}
    )
    dram_capacity_gb: float = 128.0  # HW §1 (TS-DEV); ~112 GB usable after ECC (TS-DF)
    core_span_bytes: int = 256 * MIB  # HW §1: per-core addressable span (TS-KC, TS-WD MAX_SPAN_BYTES)

    # --- data movement rates the real stack's cost model calibrated (TS-CM) ---
    restickify_gbps: float = 116.0  # STACK §7: restickify / transpose effective bandwidth
    broadcast_gbps: float = 118.0  # STACK §7: broadcast effective bandwidth (TS-CM), read + written bytes
    # HW §2 (TS-CM fit): streaming-reduction read bandwidth falls with row count, min(150, 114 + 61 exp(-rows/3700))
    # GB/s; the 150 is dram_effective_gbps. dram.py says which reductions and which "rows" (an interpretation).
    reduction_rows_floor_gbps: float = 114.0
    reduction_rows_excess_gbps: float = 61.0
    reduction_rows_scale: float = 3700.0

    # --- host ---
    pcie_gbps: float = 64.0  # HW §1: PCIe Gen5 x16 (TS-DEV)
    kernel_launch_overhead_us: float = 15.0  # HW §1: ~15 us per bundle (TS-SP, derived); 0 in TS-CM's fit

    # --- host runtime outside kernels (reported on their own line; ASSUMPTION_RANGES holds their bands) ---
    # Per program call: JobPlan submission and stream synchronization (STACK §1.6), and the host work between one
    # program and the next (per-token work in a decode loop that calls one program per token). Not public:
    # assumption 0, band up to HW §1's ~100 us "launch floor" (AH-MM, low-medium confidence).
    program_host_us: float = 0.0
    # A CPU fallback island's host compute (HostOp): an eager dispatch cost plus its host bytes (inputs + outputs)
    # at a host streaming rate. Not public: assumptions for one eager PyTorch CPU op on a server core.
    host_op_overhead_us: float = 10.0
    host_compute_gbps: float = 10.0

    # --- card-to-card interconnect (spyreccl collectives; aiu_sim.timing.interconnect models them) ---
    # HW §1-§2 ("Host and scale-out"): cards sit on a PCIe switch fabric with card-to-card RDMA, each behind its own
    # Gen5 x16 link, so a card's link bounds a peer-to-peer transfer: pcie_gbps per direction (TS-DEV). "host"
    # stages every transfer through host memory instead (two link crossings), for systems without peer-to-peer.
    collective_path: str = "p2p"
    # Per transfer step: DMA descriptor setup, the doorbell and the completion handshake of a blocking collective.
    # Not public: an assumption (a few us is typical of PCIe peer DMA); ASSUMPTION_RANGES gives its band.
    collective_step_latency_us: float = 5.0
    # The fraction of pcie_gbps a collective's transfers reach (protocol and DMA efficiency). Not public:
    # assumption 0.8, about what PCIe Gen5 x16 peer DMA achieves of its ~64 GB/s raw.
    collective_link_efficiency: float = 0.8

    def __post_init__(self) -> None:
        _validate(self)

    def __hash__(self) -> int:  # the dict fields are not hashable; timing memoizes on the config
        return hash(self.token)

    @property
    def token(self) -> str:
        """A canonical string of every field: equal configs give equal tokens (memo keys). Computed once."""
        cached = self.__dict__.get("_token")
        if cached is None:
            cached = json.dumps(self.to_dict(), sort_keys=True, default=str)
            object.__setattr__(self, "_token", cached)  # frozen dataclass: cache outside the fields
        return cached

    # --- derived quantities ---
    @property
    def ring_nodes(self) -> int:
        """Cores plus the memory node (HW §4: 33 nodes for 32 cores)."""
        return self.num_cores + 1

    def pt_macs_per_cycle(self, dtype: str = "dl16") -> int:
        """MACs per core-clock cycle of one core (both corelets)."""
        scale = self.pt_precision_scale.get(dtype, 1)
        return self.corelets_per_core * self.pt_rows * self.pt_cols * self.pt_k_simd_fp16 * scale

    def peak_tflops(self, dtype: str = "dl16") -> float:
        return 2 * self.pt_macs_per_cycle(dtype) * self.num_cores * self.core_clock_ghz / 1e3

    def dram_fraction(self, active_cores: int) -> float:
        """Interpolated active-core fraction g(n) of the DRAM bus (TS-CM), clamped to the table's range."""
        table = sorted((int(k), float(v)) for k, v in self.dram_active_core_fraction.items())
        if active_cores <= table[0][0]:
            return table[0][1] * active_cores / table[0][0]
        for (n0, g0), (n1, g1) in zip(table, table[1:], strict=False):
            if active_cores <= n1:
                return g0 + (g1 - g0) * (active_cores - n0) / (n1 - n0)
        return table[-1][1]

    def replace(self, **overrides) -> HardwareConfig:
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown HardwareConfig field(s) {sorted(unknown)}; known: {_field_names()}")
        return dataclasses.replace(self, **overrides)

    @classmethod
    def from_toml(cls, path: str | Path) -> HardwareConfig:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"hardware config file {path} does not exist")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path} is not valid TOML: {e}") from e
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: dict, source: str = "<dict>") -> HardwareConfig:
        base_name = data.pop("base", None)
        base = preset(base_name) if base_name else cls()
        unknown = set(data) - set(_field_names())
        if unknown:
            raise ConfigError(f"{source}: unknown key(s) {sorted(unknown)}; known keys: {_field_names()}")
        for key in ("pt_precision_scale", "dram_active_core_fraction"):
            if key in data:  # TOML keys are strings; the core-fraction table is keyed by core count
                data[key] = {
                    (int(k) if key == "dram_active_core_fraction" else k): v for k, v in data[key].items()
                }
        return base.replace(**data)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        lines = [
            f"{self.name}: {self.num_cores} cores x {self.corelets_per_core} corelets, "
            f"core {self.core_clock_ghz} GHz, ring {self.ring_clock_ghz} GHz",
            f"  PT: {self.pt_rows}x{self.pt_cols} PEs x {self.pt_k_simd_fp16}-deep K SIMD per corelet = "
            f"{self.pt_macs_per_cycle()} fp16 MAC/cycle/core; peak {self.peak_tflops():.1f} TFLOPS fp16, "
            f"{self.peak_tflops('fp8_e4m3'):.1f} fp8",
            f"  SFP: {self.sfp_lanes} lanes/corelet, transcendental cost x{self.sfp_transcendental_cost}",
            f"  LX: {self.lx_bytes / MIB:.2f} MiB/core ({self.lx_allocatable_bytes / MIB:.2f} MiB allocatable), "
            f"port {self.lx_port_bytes_per_cycle} B/cycle; LX cliff x{self.lx_cliff_slowdown}",
            f"  ring: {self.ring_nodes} nodes, {self.ring_bytes_per_cycle} B/cycle/direction, "
            f"hop {self.ring_hop_latency_cycles} cycles; psum rings {self.psum_ring_bytes_per_cycle} B/cycle; "
            f"multicast penalty past {self.multicast_cohort_limit} receivers, exponent {self.multicast_cohort_exponent}; "
            f"request ring {self.request_ring_bytes_per_cycle} B/cycle, {self.request_header_bytes} B headers",
            f"  DRAM: {self.dram_capacity_gb:.0f} GB LPDDR5, {self.dram_peak_gbps} GB/s peak, "
            f"{self.dram_effective_gbps} GB/s effective one-way; per-core span {self.core_span_bytes // MIB} MiB",
            f"  host: PCIe {self.pcie_gbps} GB/s; kernel launch overhead {self.kernel_launch_overhead_us} us; "
            f"per program {self.program_host_us} us; CPU fallback op {self.host_op_overhead_us} us + "
            f"{self.host_compute_gbps} GB/s",
            f"  cards: collectives over {self.collective_path}, {self.collective_link_efficiency:.0%} of PCIe, "
            f"{self.collective_step_latency_us} us per step",
        ]
        return "\n".join(lines)

    def multicast_penalty(self, receivers: int) -> float:
        """How much slower a multicast to `receivers` cores is delivered than one to a single core (HW §4)."""
        return max(1.0, receivers / self.multicast_cohort_limit) ** self.multicast_cohort_exponent


@dataclass(frozen=True)
class Assumption:
    """A config field whose value is not public: its plausible range, and why."""

    low: float
    high: float
    why: str


# The fields a band report varies (aiu_sim.timing.band): each default is an assumption, not a measurement.
ASSUMPTION_RANGES: dict[str, Assumption] = {
    "kernel_launch_overhead_us": Assumption(
        0.0, 100.0, "HW §1: ~0 in TS-CM's fit, ~15 TS-SP, ~100 'launch floor'"
    ),
    "program_host_us": Assumption(0.0, 100.0, "not public; up to HW §1's ~100 us launch floor (AH-MM)"),
    "host_op_overhead_us": Assumption(2.0, 50.0, "not public: one eager CPU op's dispatch"),
    "host_compute_gbps": Assumption(2.0, 50.0, "not public: one eager CPU op's streaming rate"),
    "ring_hop_latency_cycles": Assumption(0, 8, "HW §4: no hop latency is published"),
    "lx_cliff_slowdown": Assumption(
        1.0,
        15.0,
        "HW §3: measured 7-15x past the KG3 PSUM fit (AH-MM); 1: TS-CM's sweep shows no such derate",
    ),
    "request_header_bytes": Assumption(
        0, 64, "HW §4: request header size not public (1 B/cycle request ring)"
    ),
    "row_op_lx_working_set_bytes": Assumption(
        256 * KIB,
        1638 * KIB,
        "HW §3: TS-CM's fused-softmax spill from 'about 512 KB'; up to all allocatable LX",
    ),
    "multicast_cohort_exponent": Assumption(
        0.0, 1.0, "HW §4: TS-WD's delivery penalty past 8 receivers (exponent 1, one version 0.75); 0 = none"
    ),
    "sfp_lanes": Assumption(32, 128, "HW §3: SFP width not public (64 is ktir-cpu's estimate)"),
    "sfp_transcendental_cost": Assumption(1.0, 8.0, "HW §3/§8: ktir-cpu's 4x is an estimate"),
    "collective_step_latency_us": Assumption(
        1.0, 20.0, "not public: PCIe peer DMA setup + completion per step"
    ),
    "collective_link_efficiency": Assumption(0.5, 0.95, "not public: PCIe Gen5 peer DMA efficiency"),
}


def _field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(HardwareConfig)]


def _require(cfg: HardwareConfig, name: str, ok: bool, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"HardwareConfig.{name} = {getattr(cfg, name)!r} is invalid; allowed: {allowed}")


def _validate(cfg: HardwareConfig) -> None:
    positive_ints = [
        "num_cores",
        "corelets_per_core",
        "pt_rows",
        "pt_cols",
        "pt_k_simd_fp16",
        "sfp_lanes",
        "lx_port_bytes_per_cycle",
        "ring_bytes_per_cycle",
        "psum_ring_bytes_per_cycle",
        "multicast_cohort_limit",
        "request_ring_bytes_per_cycle",
    ]
    for name in positive_ints:
        value = getattr(cfg, name)
        _require(
            cfg,
            name,
            isinstance(value, int) and not isinstance(value, bool) and value >= 1,
            "an integer >= 1",
        )
    _require(cfg, "num_cores", cfg.num_cores <= 1024, "1..1024")
    positive_floats = [
        "core_clock_ghz",
        "ring_clock_ghz",
        "dram_peak_gbps",
        "dram_effective_gbps",
        "dram_capacity_gb",
        "restickify_gbps",
        "broadcast_gbps",
        "reduction_rows_floor_gbps",
        "reduction_rows_scale",
        "pcie_gbps",
        "sfp_transcendental_cost",
        "host_compute_gbps",
        "lx_cliff_slowdown",
    ]
    for name in positive_floats:
        value = getattr(cfg, name)
        _require(cfg, name, isinstance(value, int | float) and value > 0, "a number > 0")
    _require(cfg, "dram_effective_gbps", cfg.dram_effective_gbps <= cfg.dram_peak_gbps, "<= dram_peak_gbps")
    _require(cfg, "lx_cliff_slowdown", cfg.lx_cliff_slowdown >= 1, ">= 1 (a slowdown)")
    for name in (
        "bmm_batch_inner_efficiency",
        "bmm_batch_outer_efficiency",
        "projection_small_batch_efficiency",
        "projection_large_batch_efficiency",
    ):
        _require(cfg, name, 0 < getattr(cfg, name) <= 1, "0 < x <= 1")
    _require(cfg, "projection_small_batch_max", cfg.projection_small_batch_max >= 1, ">= 1")
    _require(cfg, "reduction_rows_excess_gbps", cfg.reduction_rows_excess_gbps >= 0, ">= 0")
    _require(
        cfg,
        "lx_bytes",
        isinstance(cfg.lx_bytes, int) and cfg.lx_bytes >= STICK_BYTES,
        f">= one stick ({STICK_BYTES} B)",
    )
    _require(
        cfg,
        "lx_allocatable_bytes",
        STICK_BYTES <= cfg.lx_allocatable_bytes <= cfg.lx_bytes,
        f"{STICK_BYTES}..lx_bytes",
    )
    _require(cfg, "core_span_bytes", cfg.core_span_bytes >= STICK_BYTES, f">= {STICK_BYTES}")
    _require(
        cfg,
        "row_op_lx_working_set_bytes",
        cfg.row_op_lx_working_set_bytes >= STICK_BYTES,
        f">= {STICK_BYTES}",
    )
    _require(cfg, "ring_hop_latency_cycles", cfg.ring_hop_latency_cycles >= 0, ">= 0")
    _require(cfg, "psum_hop_latency_cycles", cfg.psum_hop_latency_cycles >= 0, ">= 0")
    _require(cfg, "multicast_cohort_exponent", cfg.multicast_cohort_exponent >= 0, ">= 0")
    _require(cfg, "request_header_bytes", cfg.request_header_bytes >= 0, ">= 0")
    _require(cfg, "dram_turnaround_ns_per_byte", cfg.dram_turnaround_ns_per_byte >= 0, ">= 0")
    for name in ("kernel_launch_overhead_us", "program_host_us", "host_op_overhead_us"):
        _require(cfg, name, getattr(cfg, name) >= 0, ">= 0")
    _require(
        cfg, "memory_node_position", 0 <= cfg.memory_node_position <= cfg.num_cores, f"0..{cfg.num_cores}"
    )
    _require(cfg, "pt_min_m_rows", cfg.pt_min_m_rows >= 1, ">= 1")
    _require(cfg, "collective_path", cfg.collective_path in COLLECTIVE_PATHS, " or ".join(COLLECTIVE_PATHS))
    _require(cfg, "collective_step_latency_us", cfg.collective_step_latency_us >= 0, ">= 0")
    _require(cfg, "collective_link_efficiency", 0 < cfg.collective_link_efficiency <= 1, "0 < x <= 1")
    fractions = cfg.dram_active_core_fraction
    _require(
        cfg,
        "dram_active_core_fraction",
        bool(fractions) and all(int(k) >= 1 and 0 < float(v) <= 1 for k, v in fractions.items()),
        "a non-empty table {cores >= 1: fraction in (0, 1]}",
    )


def preset_names() -> list[str]:
    return sorted(
        p.name.removesuffix(".toml")
        for p in resources.files("aiu_sim.presets").iterdir()
        if p.name.endswith(".toml")
    )


@functools.lru_cache(maxsize=64)
def preset(name: str = "spyre") -> HardwareConfig:
    """A named preset from aiu_sim/presets/<name>.toml."""
    if name not in preset_names():
        raise ConfigError(f"unknown hardware preset {name!r}; available: {preset_names()}")
    data = tomllib.loads(resources.files("aiu_sim.presets").joinpath(f"{name}.toml").read_text())
    if data.get("base") == name:
        data.pop("base")
    return HardwareConfig.from_dict(data, source=f"preset {name}")


def load_config(spec: str | Path | HardwareConfig | None = None) -> HardwareConfig:
    """A config from a preset name, a TOML path, an existing config, or None (the default `spyre`)."""
    if spec is None:
        return preset("spyre")
    if isinstance(spec, HardwareConfig):
        return spec
    if str(spec).endswith(".toml") or Path(str(spec)).exists():
        return HardwareConfig.from_toml(spec)
    return preset(str(spec))
