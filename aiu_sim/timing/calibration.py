"""Microbenchmarks that measure the simulator against the calibrated rates of torch-spyre's cost model.

Each probe hand-builds a one-kernel program, times it, and turns the kernel's body time (launch overhead
excluded, as TS-CM's fits exclude it: HW §1 "~0 in the fitted kernel model") into the rate the reference quotes:

| probe                 | reference                                               | source          |
|-----------------------|---------------------------------------------------------|-----------------|
| 2-D matmul            | 1140 MAC/ns/core sustained (compute-dominant, 4-8 cores) | HW §1, TS-CM    |
| default-layout bmm    | ~160 MAC/ns/core (batch just inside the stick)          | HW §3, TS-CM    |
| DRAM read-only        | ~150 GB/s                                               | HW §1-2, TS-CM  |
| DRAM write-only       | ~150 GB/s                                               | HW §1-2, TS-CM  |
| DRAM 1:1 read/write   | ~105 GB/s of read + written bytes                       | HW §1-2, TS-CM  |
| restickify            | ~116 GB/s of read + written bytes                       | HW §7, STACK §7 |
"""

from __future__ import annotations

from dataclasses import dataclass

from aiu_sim.config import HardwareConfig, load_config
from aiu_sim.ir.program import Arg, Buffer, Kernel, KernelProgram
from aiu_sim.timing.simulate import simulate


@dataclass(frozen=True)
class Probe:
    name: str
    simulated: float
    reference: float
    unit: str
    source: str

    @property
    def ratio(self) -> float:
        return self.simulated / self.reference


def matmul_program(m: int, k: int, n: int, split: dict[str, int], dtype: str = "dl16") -> KernelProgram:
    bufs = [Buffer("a", dtype, (m, k)), Buffer("b", dtype, (k, n)), Buffer("c", "dl16", (m, n))]
    kernel = Kernel(
        "matmul",
        "matmul",
        [Arg("a", ("m", "k")), Arg("b", ("k", "n"))],
        [Arg("c", ("m", "n"))],
        {"m": m, "n": n, "k": k},
        reduce_dims=("k",),
        split=split,
    )
    return KernelProgram("matmul", bufs, [kernel])


def bmm_program(batch: int, m: int, k: int, n: int, split: dict[str, int]) -> KernelProgram:
    """A batched matmul with every operand in torch-spyre's default layout (batch = host dim 0, which the
    default layout stores just outside the stick)."""
    bufs = [
        Buffer("a", "dl16", (batch, m, k)),
        Buffer("b", "dl16", (batch, k, n)),
        Buffer("c", "dl16", (batch, m, n)),
    ]
    kernel = Kernel(
        "bmm",
        "matmul",
        [Arg("a", ("b", "m", "k")), Arg("b", ("b", "k", "n"))],
        [Arg("c", ("b", "m", "n"))],
        {"b": batch, "m": m, "n": n, "k": k},
        reduce_dims=("k",),
        split=split,
    )
    return KernelProgram("bmm", bufs, [kernel])


def stream_program(op: str, rows: int, cols: int, cores: int) -> KernelProgram:
    """One DRAM-streaming kernel over a (rows, cols) dl16 tensor split by rows: "read" (a sum over cols: reads
    everything, writes 1/cols of it), "write" (fill), "copy" (unary neg: 1:1), "restickify" (a transpose)."""
    x = Buffer("x", "dl16", (rows, cols))
    space = {"r": rows, "c": cols}
    split = {"r": cores}
    if op == "read":
        y = Buffer("y", "dl16", (rows, 1))
        k = Kernel(
            "sum", "reduce", [Arg("x", ("r", "c"))], [Arg("y", ("r", None))], space, "sum", ("c",), split
        )
    elif op == "write":
        y = Buffer("y", "dl16", (rows, cols))
        k = Kernel("fill", "fill", [], [Arg("y", ("r", "c"))], space, split=split, attrs={"value": 0.0})
        x = None
    elif op == "copy":
        y = Buffer("y", "dl16", (rows, cols))
        k = Kernel("neg", "unary", [Arg("x", ("r", "c"))], [Arg("y", ("r", "c"))], space, "neg", split=split)
    elif op == "restickify":
        y = Buffer("y", "dl16", (cols, rows))
        k = Kernel(
            "transpose", "restickify", [Arg("x", ("r", "c"))], [Arg("y", ("c", "r"))], space, split=split
        )
    else:
        raise ValueError(f"unknown stream probe {op!r}; use read, write, copy or restickify")
    return KernelProgram(f"stream-{op}", [b for b in (x, y) if b is not None], [k])


def broadcast_program(rows: int, cols: int, cores: int) -> KernelProgram:
    """expand: one (1, cols) row copied to (rows, cols), split by rows (the row is multicast)."""
    bufs = [Buffer("x", "dl16", (1, cols)), Buffer("y", "dl16", (rows, cols))]
    k = Kernel(
        "expand",
        "copy",
        [Arg("x", (None, "c"))],
        [Arg("y", ("r", "c"))],
        {"r": rows, "c": cols},
        split={"r": cores},
    )
    return KernelProgram("broadcast", bufs, [k])


def cross_row_program(rows: int, cols: int, cores: int) -> KernelProgram:
    """sum over rows: (rows, cols) -> (1, cols), split by columns (sticks)."""
    bufs = [Buffer("x", "dl16", (rows, cols)), Buffer("y", "dl16", (1, cols))]
    k = Kernel(
        "colsum",
        "reduce",
        [Arg("x", ("r", "c"))],
        [Arg("y", (None, "c"))],
        {"r": rows, "c": cols},
        "sum",
        ("r",),
        split={"c": cores},
    )
    return KernelProgram("cross-row", bufs, [k])


def projection_program(batch: int, m: int, k: int, n: int, cores: int) -> KernelProgram:
    """x (batch, m, k) @ w (k, n): one rank-3 operand (TS-CM's 'projection' class)."""
    bufs = [
        Buffer("x", "dl16", (batch, m, k)),
        Buffer("w", "dl16", (k, n)),
        Buffer("y", "dl16", (batch, m, n)),
    ]
    kern = Kernel(
        "proj",
        "matmul",
        [Arg("x", ("b", "m", "k")), Arg("w", ("k", "n"))],
        [Arg("y", ("b", "m", "n"))],
        {"b": batch, "m": m, "n": n, "k": k},
        reduce_dims=("k",),
        split={"n": cores},
    )
    return KernelProgram("projection", bufs, [kern])


def _body_ns(program: KernelProgram, config: HardwareConfig) -> tuple[float, object]:
    report = simulate(program, config, record_intervals=False)
    step = report.kernels[0]
    return step.timing.duration_ns, step.timing


def matmul_rate(config: HardwareConfig, m=8192, k=2048, n=2048, cores=8) -> float:
    """MAC/ns/core of a compute-dominant 2-D matmul split over N (TS-CM measured on 4-8 cores)."""
    ns, t = _body_ns(matmul_program(m, k, n, {"n": cores}), config)
    return t.macs / ns / cores


def bmm_rate(config: HardwareConfig, batch=64, m=512, k=512, n=512, cores=8) -> float:
    ns, t = _body_ns(bmm_program(batch, m, k, n, {"b": cores}), config)
    return t.macs / ns / cores


def stream_rate(config: HardwareConfig, op: str, rows=8192, cols=8192, cores: int | None = None) -> float:
    """GB/s of DRAM bytes (read + written) of a streaming kernel on all cores."""
    ns, t = _body_ns(stream_program(op, rows, cols, cores or config.num_cores), config)
    return (t.dram_read + t.dram_write) / ns


def calibration_table(config: HardwareConfig | str | None = None) -> list[Probe]:
    cfg = load_config(config)
    return [
        Probe("2-D matmul", matmul_rate(cfg), 1140.0, "MAC/ns/core", "TS-CM mac_peak_per_core_ns (HW §1)"),
        Probe("default-layout bmm", bmm_rate(cfg), 160.0, "MAC/ns/core", "TS-CM (HW §3, STACK §7)"),
        Probe("DRAM read-only", stream_rate(cfg, "read"), 150.0, "GB/s", "TS-CM (HW §2)"),
        Probe("DRAM write-only", stream_rate(cfg, "write"), 150.0, "GB/s", "TS-CM (HW §2)"),
        Probe("DRAM 1:1 read/write", stream_rate(cfg, "copy"), 105.0, "GB/s", "TS-CM alpha (HW §2)"),
        Probe("restickify", stream_rate(cfg, "restickify"), 116.0, "GB/s", "TS-CM (HW §7, STACK §7)"),
    ]


def format_table(probes: list[Probe]) -> str:
    lines = [f"{'probe':22s} {'simulated':>10s} {'reference':>10s} {'ratio':>6s}  unit          source"]
    for p in probes:
        lines.append(
            f"{p.name:22s} {p.simulated:10.1f} {p.reference:10.1f} {p.ratio:6.3f}  {p.unit:13s} {p.source}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_table(calibration_table()))
