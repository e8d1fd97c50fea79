"""The benchmark scripts still run: they call the project's own code (e.g. bench_demo drives StaticGreedy's step),
so a change there can break one that no other test runs. Slow: each is a real measurement."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_demo_decode_ratio_runs():
    out = subprocess.run(
        [sys.executable, "benchmarks/bench_demo.py", "--skip-demo", "--repeats", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "SmolLM2 decode step" in out.stdout and "ratio" in out.stdout


@pytest.mark.slow
def test_bench_compile_overhead_runs():
    out = subprocess.run(
        [sys.executable, "benchmarks/bench_compile_overhead.py", "--repeats", "1", "--compiles", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("ratio skipped / stock") == 2


def _bench(*args: str) -> str:
    out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.slow
def test_bench_numerics_runs():
    out = _bench("benchmarks/bench_numerics.py", "--runs", "1", "--values", str(2**16), "--skip-matmul")
    assert "ratio dl16_round/np_fp16_cast" in out


@pytest.mark.slow
def test_bench_sim_runs():
    out = _bench("benchmarks/bench_sim.py", "--runs", "1")
    assert "engine events per second" in out and "prefill 512 wall seconds" in out


@pytest.mark.slow
def test_bench_stack_runs():
    out = _bench("benchmarks/bench_stack.py", "--repeats", "1")
    assert "forward ratio emulated/CPU fp32" in out and "compile_blocks (target <= 2)" in out
