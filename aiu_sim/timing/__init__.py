"""The timing engine: a discrete-event, cycle-approximate, deterministic model of the chip (issue 3 §4).

    report = simulate(program, config)   # TimingReport
    print(report.summary())
    aiu_sim.timing.trace.write_trace(report, "trace.json")

Layout: resources.py (the timed units and ring geometry), engine.py (the event loop), dram.py (the calibrated DRAM
model), compute.py (PT and SFP cycles), tiling.py (LX tile plans), kernels.py (a kernel as tile-level tasks),
simulate.py (a program as steps, with memoization), report.py (results), calibration.py (microbenchmarks against
the reference's calibrated rates), band.py (the simulated time as a band over the assumed parameters).
"""

from aiu_sim.timing.report import KernelTiming, StepTiming, TimingReport
from aiu_sim.timing.simulate import KernelCache, kernel_key, simulate

__all__ = ["KernelCache", "KernelTiming", "StepTiming", "TimingReport", "kernel_key", "simulate"]
