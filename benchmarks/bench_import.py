"""What the emulator adds to `import torch` in a new process.

torch imports the package at startup (the device autoload, as torch-spyre's `torch_spyre:_autoload`), so every process
that imports torch pays for it: each zoo model process, each CLI call, each notebook kernel, each torchrun rank.
Three commands, each started as a fresh Python process, in alternating rounds so that machine noise hits all alike:
1. `import torch` with the autoload off (TORCH_DEVICE_BACKEND_AUTOLOAD=0): the yardstick, torch alone;
2. `import torch` as a user runs it (torch, then the emulator: dynamo, aiu_sim, numba, ml_dtypes);
3. `import numpy, ml_dtypes` against `import numpy`: ml_dtypes' own share (0.7.0's extension took ~0.8 s to load,
   0.6.0's 5 ms; pyproject pins < 0.7).
Prints the median seconds of each; the last line is the ratio (2) / (1), torch with the emulator against torch alone.

Run: .venv/bin/python benchmarks/bench_import.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "torch alone (autoload off)": ("import torch", {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}),
    "torch with the emulator": ("import torch; assert hasattr(torch, 'spyre')", {}),
    "numpy": ("import numpy", {}),
    "numpy + ml_dtypes": ("import numpy, ml_dtypes", {}),
}


def seconds(code: str, env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, check=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7, help="alternating rounds (median reported)")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    import ml_dtypes

    for code, env in COMMANDS.values():  # warm the file cache
        seconds(code, env)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.repeats):
        for name, (code, env) in COMMANDS.items():
            times[name].append(seconds(code, env))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, m in med.items():
        print(f"{name}: {m:.2f} s (median of {args.repeats})")
    print(f"ml_dtypes {ml_dtypes.__version__}: {med['numpy + ml_dtypes'] - med['numpy']:.2f} s over numpy")
    ratio = med["torch with the emulator"] / med["torch alone (autoload off)"]
    print(f"ratio import torch with the emulator / torch alone: {ratio:.2f}")


if __name__ == "__main__":
    main()
