"""The benchmark scripts still run: they call the project's own code (e.g. bench_demo drives StaticGreedy's step),
so a change there can break one that no other test runs. Slow: each is a real measurement."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench(*args: str, timeout: int) -> str:
    """Run a benchmark script from the repository root; its stdout (it must exit 0)."""
    out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.slow
def test_bench_demo_decode_ratio_runs():
    out = _bench("benchmarks/bench_demo.py", "--skip-demo", "--repeats", "1", timeout=600)
    assert "SmolLM2 decode step" in out and "ratio" in out


@pytest.mark.slow
def test_bench_compile_overhead_runs():
    out = _bench("benchmarks/bench_compile_overhead.py", "--repeats", "1", "--compiles", "2", timeout=600)
    assert out.count("ratio skipped / stock") == 2


@pytest.mark.slow
def test_bench_numerics_runs():
    out = _bench(
        "benchmarks/bench_numerics.py", "--runs", "1", "--values", str(2**16), "--skip-matmul", timeout=1200
    )
    assert "ratio dl16_round/np_fp16_cast" in out


@pytest.mark.slow
def test_bench_sim_runs():
    out = _bench("benchmarks/bench_sim.py", "--runs", "1", timeout=1200)
    assert "engine events per second" in out and "prefill 512 wall seconds" in out


@pytest.mark.slow
def test_bench_task_builder_runs():
    """It also checks that the task builder's graphs are identical to the reference builder's."""
    out = _bench("benchmarks/bench_task_builder.py", "--quick", "--repeats", "1", timeout=1200)
    assert "identical: all" in out and "per-kernel old/new" in out


@pytest.mark.slow
def test_bench_stack_runs():
    out = _bench("benchmarks/bench_stack.py", "--repeats", "1", timeout=1200)
    assert "forward ratio emulated/CPU fp32" in out and "compile_blocks (target <= 2)" in out


@pytest.mark.slow
def test_bench_eager_runs():
    out = _bench("benchmarks/bench_eager.py", "--repeats", "1", timeout=600)
    assert "eager x * 2" in out and "eager forward ratio emulated / CPU fp32" in out
