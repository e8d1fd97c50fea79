"""Timing fidelity (issue 14 §1): every measured Spyre number in ../shared/reference/, simulated the way it was
measured, against the real stack's own cost model as the yardstick.

Each point hand-builds the program the measurement ran (a microbenchmark kernel, or a matmul divided over the cores
by the emulated stack's work-division passes, as the real stack divides it), times it, converts the simulated time
into the measured quantity (a rate, a time or a ratio) and prints simulated vs measured with the error. Then, per
op class, the RMS error against the RMS error of torch-spyre's own cost model on that class (TS-CM,
`docs/source/compiler/cost_model.md`, quoted per class in issue 14 from STACK §7: broadcast 5%, transport 6%,
reduction 7%, pointwise 8.5%, softmax 21%, tiled/split matmul 25-30%, bmm 26-40%).

What the reference holds and what it does not:
- Rates TS-CM measured or fitted (HW §1-3, §7; STACK §7) are points here. Some are inputs of our model (the six
  calibrated rates, g(n)); their points check that the whole simulator (tiling, ring, LX port, arbitration)
  reproduces them, not that an independent prediction holds.
- Qualitative measurements (AH-GR isolated Granite-3.3-8B matmuls; TS-CM "GELU and exp cost the same as neg") are
  points with the stated quantity; their wording is in the notes column.
- Per-op device times of AH-GR and the TS-SP softmax microbenchmark are withheld from the reference as hidden
  validation points (HW §6), so no softmax point exists here: the softmax class says so.
- Listed at the end, not scored: numbers whose measurement setup is not public enough to rebuild.

    .venv/bin/python benchmarks/bench_fidelity.py [--reduced]

--reduced uses smaller shapes where the quantity does not depend on size, and fewer points (the test runs it).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from aiu_sim.config import HardwareConfig, preset
from aiu_sim.ir.program import Arg, Buffer, Kernel, KernelProgram
from aiu_sim.timing.calibration import (
    bmm_program,
    broadcast_program,
    cross_row_program,
    matmul_program,
    projection_program,
    stream_program,
)
from aiu_sim.timing.simulate import simulate

# The real stack's cost-model RMS error per op class (TS-CM via STACK §7; per-class figures as issue 14 quotes
# them; a range is given as its upper end, the yardstick to beat). None: the class has no public measurement.
YARDSTICK_RMS = {
    "broadcast": 0.05,
    "transport": 0.06,
    "reduction": 0.07,
    "pointwise": 0.085,
    "softmax": 0.21,
    "matmul": 0.30,
    "bmm": 0.40,
}
MAX_POINT_ERROR = 0.20  # issue 14: no point worse than 20%

NOT_SCORED = [
    "softmax 1-core / 4-core times (TS-SP): withheld from the reference as hidden validation points (HW §6)",
    "isolated Granite-3.3-8B matmul times (AH-GR): withheld; only their qualitative statements are points here",
    "PSUM-ring transit near 35.2 GB/s, ~3x slower on LX overflow (AH-RING): the kernel it was measured on is not "
    "public",
    "matmul operand reads repeated on every core, ~2.3 GB/s per core (TS-CM): what was repeated is not public",
    "RIU per-hop cost payload/166 GB/s x (1 + f) (AH-RING): LX->LX ring copies are not a kernel op here",
    "concatenations / block transposes 44-150 GB/s (TS-CM): a range over unpublished shapes",
    "LX spill from ~512 KB of fused-softmax working set (TS-CM), LX cliff 7-15x (AH-MM): modelled (the row-op tile "
    "budget, lx_cliff_slowdown), but the shapes they were measured on are not public",
    "multicast delivery penalty past 8 receivers (TS-WD): a cost-model term, not a measurement",
]


@dataclass(frozen=True)
class Point:
    name: str
    op_class: str
    simulated: float
    measured: float
    unit: str
    source: str
    note: str = ""
    # the measured number is an input of the simulator's config (a calibrated rate or fit): the point checks that
    # the whole simulator reproduces it, not an independent prediction
    fitted: bool = False

    @property
    def error(self) -> float:
        return self.simulated / self.measured - 1.0


def _kernel_ns(program: KernelProgram, config: HardwareConfig):
    """Body time of the program's one kernel: TS-CM's fits exclude the launch overhead (HW §1)."""
    step = simulate(program, config, record_intervals=False).kernels[0]
    return step.timing.duration_ns, step.timing


def _rate(program, config, cores=None) -> float:
    """MAC/ns/core of a one-matmul program."""
    ns, t = _kernel_ns(program, config)
    return t.macs / ns / (cores or len(t.cores))


def _gbps(program, config) -> float:
    ns, t = _kernel_ns(program, config)
    return (t.dram_read + t.dram_write) / ns


def _unary_program(fn: str, rows: int, cols: int, cores: int) -> KernelProgram:
    bufs = [Buffer("x", "dl16", (rows, cols)), Buffer("y", "dl16", (rows, cols))]
    k = Kernel(
        fn,
        "unary",
        [Arg("x", ("r", "c"))],
        [Arg("y", ("r", "c"))],
        {"r": rows, "c": cols},
        fn,
        split={"r": cores},
    )
    return KernelProgram(fn, bufs, [k])


def _batch_outer_bmm(batch: int, m: int, k: int, n: int, cores: int) -> KernelProgram:
    """A bmm whose operands hold the batch outermost on the device: host shape (m, batch, k) puts batch in the
    default layout's outermost device dim (aiu_sim.ir.layout.default_layout), not just outside the stick."""
    bufs = [
        Buffer("a", "dl16", (m, batch, k)),
        Buffer("b", "dl16", (k, batch, n)),
        Buffer("c", "dl16", (m, batch, n)),
    ]
    kern = Kernel(
        "bmm",
        "matmul",
        [Arg("a", ("m", "b", "k")), Arg("b", ("k", "b", "n"))],
        [Arg("c", ("m", "b", "n"))],
        {"b": batch, "m": m, "n": n, "k": k},
        reduce_dims=("k",),
        split={"b": cores},
    )
    return KernelProgram("bmm-outer", bufs, [kern])


def _stack_divided(m: int, k: int, n: int, config: HardwareConfig) -> KernelProgram:
    """x (m, k) @ w (k, n) divided over the cores by the emulated stack's work-division passes (STACK §1.4), as
    torch.compile(backend="spyre") divides `x @ w`; None if the stack cannot be imported (no torch)."""
    from torch_spyre_emu.compiler.context import CompileOptions, ProgramParts
    from torch_spyre_emu.compiler.passes.work_division import work_division

    program = matmul_program(m, k, n, {})
    parts = work_division(ProgramParts(list(program.steps), program.buffers), CompileOptions(hardware=config))
    return KernelProgram("decode-matmul", parts.buffers, parts.steps)


# Granite-3.3-8B projections (hidden 4096, intermediate 12800, 8 kv heads of 128, vocab 49152): AH-GR's shapes.
GRANITE_PROJECTIONS = {
    "q/o": (4096, 4096),
    "k/v": (4096, 1024),
    "up/gate": (4096, 12800),
    "down": (12800, 4096),
}


def points(config: HardwareConfig, reduced: bool = False) -> list[Point]:
    big = 4096 if reduced else 8192
    cm = "TS-CM"
    out = [
        Point(
            "2-D matmul, 8 cores",
            "matmul",
            _rate(matmul_program(8192, 2048, 2048, {"n": 8}), config),
            1140,
            "MAC/ns/core",
            f"{cm} (HW §1)",
            fitted=True,
        ),
        Point(
            "2-D matmul, 4 cores",
            "matmul",
            _rate(matmul_program(8192, 2048, 1024, {"n": 4}), config),
            1140,
            "MAC/ns/core",
            f"{cm} (HW §2)",
        ),
        Point(
            "bmm, default layout",
            "bmm",
            _rate(bmm_program(64, 512, 512, 512, {"b": 8}), config),
            160,
            "MAC/ns/core",
            f"{cm} (HW §3)",
            fitted=True,
        ),
        Point(
            "bmm, batch outermost",
            "bmm",
            _rate(
                _batch_outer_bmm(64, 512, 512, 512, 8),
                config,
            ),
            475,
            "MAC/ns/core",
            f"{cm} (HW §3)",
            "measured 460-490",
            fitted=True,
        ),
        Point(
            "projection, B <= 4",
            "matmul",
            _rate(
                projection_program(4, 1024, 2048, 2048, 8),
                config,
            ),
            705,
            "MAC/ns/core",
            f"{cm} (HW §3)",
            "one rank-3 operand",
            fitted=True,
        ),
        Point(
            "projection, B > 4",
            "matmul",
            _rate(
                projection_program(16, 512, 2048, 2048, 8),
                config,
            ),
            470,
            "MAC/ns/core",
            f"{cm} (HW §3)",
            "one rank-3 operand",
            fitted=True,
        ),
        Point(
            "DRAM read-only",
            "transport",
            _gbps(stream_program("read", big, big, 32), config),
            150,
            "GB/s",
            f"{cm} (HW §2)",
            "a row sum over cols",
            fitted=True,
        ),
        Point(
            "DRAM write-only",
            "transport",
            _gbps(stream_program("write", big, big, 32), config),
            150,
            "GB/s",
            f"{cm} (HW §2)",
            fitted=True,
        ),
        Point(
            "DRAM 1:1 read/write",
            "transport",
            _gbps(stream_program("copy", big, big, 32), config),
            105,
            "GB/s",
            f"{cm} alpha (HW §2)",
            fitted=True,
        ),
        Point(
            "restickify (transpose)",
            "transport",
            _gbps(stream_program("restickify", big, big, 32), config),
            116,
            "GB/s",
            f"{cm} (HW §7, STACK §7)",
            fitted=True,
        ),
        Point(
            "broadcast (expand a row)",
            "broadcast",
            _gbps(broadcast_program(big, big, 32), config),
            118,
            "GB/s",
            f"{cm} (STACK §7)",
        ),
        Point(
            "cross-row reduction",
            "reduction",
            _gbps(cross_row_program(big, big, 32), config),
            113,
            "GB/s",
            f"{cm} (STACK §7)",
        ),
    ]
    # streaming-reduction read bandwidth against row count: min(150, 114 + 61 exp(-rows/3700)) (HW §2), read as
    # the reduced extent of a cross-row reduction (aiu_sim/timing/dram.py says why)
    for rows in (1024, 8192) if reduced else (512, 2048, 8192, 32768):
        cols = max(2048, (big * big // 4) // rows // 64 * 64)
        measured = min(150.0, 114 + 61 * math.exp(-rows / 3700))
        out.append(
            Point(
                f"streaming reduction, {rows} rows",
                "reduction",
                _gbps(cross_row_program(rows, cols, 32), config),
                measured,
                "GB/s",
                f"{cm} fit (HW §2)",
                f"x ({rows}, {cols}), sum over rows",
                fitted=True,
            )
        )
    # the active-core fraction g(n) of a streaming reduction (HW §2): GB/s on n cores / 150 GB/s
    for n, g in (
        ((1, 0.11), (4, 0.43), (8, 0.54))
        if reduced
        else ((1, 0.11), (2, 0.22), (4, 0.43), (8, 0.54), (16, 0.54))
    ):
        rate = _gbps(stream_program("read", 1024, 4096, n), config)
        out.append(
            Point(
                f"g({n}) streaming reduction",
                "reduction",
                rate / config.dram_effective_gbps,
                g,
                "fraction",
                f"{cm} fit (HW §2)",
                fitted=True,
            )
        )
    # elementwise and transcendental ops are memory-bound: GELU and exp cost the same as neg (HW §3)
    neg, _ = _kernel_ns(_unary_program("neg", big, big // 2, 32), config)
    for fn in ("exp", "gelu"):
        ns, _ = _kernel_ns(_unary_program(fn, big, big // 2, 32), config)
        out.append(
            Point(
                f"{fn} / neg time",
                "pointwise",
                ns / neg,
                1.0,
                "ratio",
                f"{cm} (HW §3)",
                "'cost the same as neg'",
            )
        )
    out += _stack_points(config, reduced)
    return out


def _split_text(program: KernelProgram) -> str:
    """The core split of the program's one kernel and the pass that chose it: e.g. "n8 k4 (32 cores, pass 2)"."""
    kern = program.kernels[0]
    dims = " ".join(f"{d}{p}" for d, p in kern.split.items()) or "none"
    by = {"matmul_cost_model": "pass 2", "work_distribution": "pass 3", "span": "pass 1"}
    return f"{dims} ({kern.num_slices} cores, {by.get(kern.attrs.get('work_division'), 'given')})"


def _stack_points(config: HardwareConfig, reduced: bool) -> list[Point]:
    """AH-GR's qualitative statements about isolated Granite-3.3-8B matmuls (HW §6), each matmul divided by the
    emulated stack's work division."""
    try:
        import torch_spyre_emu  # noqa: F401  (the stack's passes import torch)
    except ImportError:
        return []
    out = []
    shapes = {"k/v": GRANITE_PROJECTIONS["k/v"]} if reduced else GRANITE_PROJECTIONS
    for name, (k, n) in shapes.items():
        program = _stack_divided(64, k, n, config)
        ns, t = _kernel_ns(program, config)
        weight_gbps = k * n * 2 / ns
        out.append(
            Point(
                f"decode M=64 {name} {k}x{n}",
                "matmul",
                weight_gbps,
                150.0,
                "GB/s of weights",
                "AH-GR (HW §6)",
                f"'weights stream at roughly 150 GB/s'; stack's split {_split_text(program)}",
            )
        )
    if not reduced:
        k, n = GRANITE_PROJECTIONS["up/gate"]
        program = _stack_divided(512, k, n, config)
        ns, t = _kernel_ns(program, config)
        tflops = 2 * t.macs / ns / 1e3
        nominal = 98.304  # the DL16 peak IBM's tools divide by (HW §1-2)
        out.append(
            Point(
                f"prefill M=512 up {k}x{n}",
                "matmul",
                tflops / nominal,
                0.55,
                "of nominal peak",
                "AH-GR (HW §6)",
                f"'a bit over half of nominal peak' (0.55 taken); stack's split {_split_text(program)}",
            )
        )
    return out


def rms_by_class(pts: list[Point]) -> dict[str, tuple[float, int]]:
    out: dict[str, list[float]] = {}
    for p in pts:
        out.setdefault(p.op_class, []).append(p.error)
    return {c: (math.sqrt(sum(e * e for e in errs) / len(errs)), len(errs)) for c, errs in out.items()}


def format_report(pts: list[Point]) -> str:
    lines = [
        f"{'point':34s} {'class':10s} {'simulated':>10s} {'measured':>9s} {'error':>7s}  unit / source / note"
    ]
    for p in pts:
        flag = (" !" if abs(p.error) > MAX_POINT_ERROR else "  ") + ("f " if p.fitted else "  ")
        lines.append(
            f"{p.name:34s} {p.op_class:10s} {p.simulated:10.3f} {p.measured:9.3f} {p.error:+7.1%}{flag}"
            f"{p.unit} | {p.source}{' | ' + p.note if p.note else ''}"
        )
    lines.append("")
    lines.append(
        f"f: a fitted point (the measured number is a simulator input); !: error beyond {MAX_POINT_ERROR:.0%}"
    )
    lines.append("")
    lines.append(
        f"{'class':10s} {'points':>6s} {'RMS ours':>9s} {'unfitted':>9s} {'RMS TS-CM':>10s}  verdict (all points)"
    )
    rms = rms_by_class(pts)
    free = rms_by_class([p for p in pts if not p.fitted])
    for c, yard in YARDSTICK_RMS.items():
        if c not in rms:
            lines.append(f"{c:10s} {0:6d} {'-':>9s} {'-':>9s} {yard:10.1%}  no public measurement to score")
            continue
        r, n = rms[c]
        fr = f"{free[c][0]:9.1%}" if c in free else f"{'-':>9s}"
        lines.append(f"{c:10s} {n:6d} {r:9.1%} {fr} {yard:10.1%}  {'meets' if r <= yard else 'MISSES'}")
    worst = max(pts, key=lambda p: abs(p.error))
    over = sum(abs(p.error) > MAX_POINT_ERROR for p in pts)
    lines.append(
        f"worst point: {worst.name} {worst.error:+.1%}; {over} of {len(pts)} points beyond "
        f"{MAX_POINT_ERROR:.0%} (marked !)"
    )
    lines.append("")
    lines.append("not scored (see the module doc):")
    lines += [f"  - {s}" for s in NOT_SCORED]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reduced", action="store_true", help="smaller shapes and fewer points (CI)")
    parser.add_argument("--config", default="spyre", help="hardware preset")
    args = parser.parse_args()
    config = preset(args.config)
    if config.num_cores < 32:
        parser.error(
            f"the measurements ran on Spyre's 32 cores; preset {args.config!r} has {config.num_cores}"
        )
    print(format_report(points(config, reduced=args.reduced)))


if __name__ == "__main__":
    main()
