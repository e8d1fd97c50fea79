"""The persistent compile cache (torch_spyre_emu/compiler/cache.py): hits are bit-identical, every key field
misses alone, bad entries are rebuilt with a warning, an unwritable cache only warns, LRU pruning, the CLI."""

import dataclasses
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.fx as fx

import torch_spyre_emu
import torch_spyre_emu.compiler as compiler
from aiu_sim.config import preset
from torch_spyre_emu.compiler import cache
from torch_spyre_emu.compiler.context import CompileOptions
from torch_spyre_emu.errors import FallbackWarning


@pytest.fixture
def disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPYRE_EMU_CACHE", str(tmp_path))
    monkeypatch.setenv("SPYRE_EMU_COMPILE_CACHE", "1")
    monkeypatch.delenv("SPYRE_EMU_CACHE_MAX_MB", raising=False)
    return tmp_path / cache.SUBDIR


@pytest.fixture
def compiles(monkeypatch):
    """How many graphs the backend really compiled (not read from the cache)."""
    count = []
    real = compiler.compile_fn

    def counted(*args, **kwargs):
        count.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(compiler, "compile_fn", counted)
    return count


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 128)
        self.down = torch.nn.Linear(128, 64)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)) * 0.5)


def _model():
    torch.manual_seed(0)
    return Mlp().half().eval()


def _run(model, x):
    """A fresh dynamo graph and GraphRunner (its in-process cache empty), as in a new process."""
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(model, backend="spyre", dynamic=False)(x)
    rep = torch_spyre_emu.last_profile()
    return out, rep, [(s.name, s.op, s.start_us, s.end_us) for s in rep.steps]


def test_hit_is_bit_identical_in_outputs_and_timing(disk_cache, compiles):
    model, x = _model(), torch.randn(4, 64, dtype=torch.float16)
    out, rep, steps = _run(model, x)
    assert len(compiles) == 1 and len(cache.entries()) == 1
    again, rep2, steps2 = _run(model, x)
    assert len(compiles) == 1, "the second compile did not hit the cache"
    assert torch.equal(out, again) and out.dtype == again.dtype
    assert rep2.total_us == rep.total_us and steps2 == steps
    # the weight preparation program (W^T restickify) ran again for the new Compiled, timed from the entry
    assert rep.weights_prep_kernels > 0 and rep2.weights_prep_us == rep.weights_prep_us
    assert len(rep.kernels) > 0 and len(cache.entries()) == 1
    # another shape is another program
    _run(model, torch.randn(8, 64, dtype=torch.float16))
    assert len(compiles) == 2 and len(cache.entries()) == 2


def test_hit_writes_into_inputs_as_the_compile_did(disk_cache, compiles):
    def fn(buf, x):
        buf.mul_(0.5).add_(x)
        return buf.sum(dim=-1)

    results = []
    for _ in range(2):
        torch._dynamo.reset()
        buf, x = torch.ones(4, 64, dtype=torch.float16), torch.full((4, 64), 2.0, dtype=torch.float16)
        out = torch.compile(fn, backend="spyre")(buf, x)
        results.append((buf, out))
    assert len(compiles) == 1
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    assert torch.all(results[1][0] == 2.5)


def test_hit_gives_the_compile_warnings_again(disk_cache, compiles):
    def fn(x):
        return torch.sin(x) * 2.0  # aten.sin is a CPU fallback in the default table

    x = torch.randn(4, 64, dtype=torch.float16)
    for expected_compiles in (1, 1):
        torch._dynamo.reset()
        with pytest.warns(FallbackWarning, match=r"aten\.sin"):
            out = torch.compile(fn, backend="spyre")(x)
        assert len(compiles) == expected_compiles
    assert torch.allclose(out.float(), torch.sin(x.float()) * 2.0, atol=1e-2)


def _key(gm, args, **options):
    return cache.key_fields(gm, args, CompileOptions(**options))


def test_every_key_field_changed_alone_misses(monkeypatch):
    gm = fx.symbolic_trace(_model())
    x = torch.randn(4, 64, dtype=torch.float16)
    base = _key(gm, [x])
    assert set(base) >= {f"option.{f.name}" for f in dataclasses.fields(CompileOptions) if f.name != "name"}
    assert _key(gm, [x], name="another_name") == base  # the name only labels the program

    class Other(Mlp):
        def forward(self, x):
            return self.down(torch.relu(self.up(x)) * 0.25)

    torch.manual_seed(1)
    other_weights = fx.symbolic_trace(Mlp().half())  # same code, submodule weights of other values
    with torch_spyre_emu.capabilities.override({"aten.sin": "native"}) as caps:
        changed_caps = _key(gm, [x], caps=caps)
    variants = {
        "graph": _key(fx.symbolic_trace(Other().half()), [x]),
        "inputs (shape)": _key(gm, [torch.randn(8, 64, dtype=torch.float16)]),
        "inputs (dtype)": _key(gm, [x.float()]),
        "inputs (strides)": _key(gm, [torch.randn(64, 4, dtype=torch.float16).t()]),
        "inputs (parameter)": _key(gm, [torch.nn.Parameter(x)]),
        "option.strict": _key(gm, [x], strict=True),
        "option.caps": changed_caps,
        "option.hardware": _key(gm, [x], hardware=preset("small")),
        "option.fuse": _key(gm, [x], fuse=False),
        "option.weight_inputs": _key(gm, [x], weight_inputs=frozenset({0})),
        "option.device_inputs": _key(gm, [x], device_inputs=frozenset({0})),
        "option.outputs_on_device": _key(gm, [x], outputs_on_device=True),
        "option.fold_constants": _key(gm, [x], fold_constants=False),
        "option.collect_only": _key(gm, [x], collect_only=True),
    }
    variants["graph (weight values)"] = _key(other_weights, [x])
    monkeypatch.setattr(cache, "FORMAT_VERSION", cache.FORMAT_VERSION + 1)
    variants["format"] = _key(gm, [x])
    monkeypatch.undo()
    monkeypatch.setattr(cache, "_versions", lambda: "spyre-emu 9.9, torch 0, numpy 0")
    variants["versions"] = _key(gm, [x])
    monkeypatch.undo()
    monkeypatch.setattr(cache, "source_fingerprint", lambda: "edited")
    variants["sources"] = _key(gm, [x])
    paths = {cache.entry_path(cache._key_text(k)) for k in variants.values()}
    assert cache.entry_path(cache._key_text(base)) not in paths
    assert len(paths) == len(variants), "two different changes gave the same entry"
    for what, key in variants.items():
        changed = {k for k in key if key[k] != base.get(k)}
        assert changed == {what.split(" ")[0]}, f"{what} changed {changed}"


def test_hardware_and_fusion_compile_their_own_programs(disk_cache, compiles):
    model, x = _model(), torch.randn(4, 64, dtype=torch.float16)
    _run(model, x)
    with torch_spyre_emu.config.fusion(False):
        _run(model, x)
    with torch_spyre_emu.config.use_hardware("small"):
        _run(model, x)
    assert len(compiles) == 3 and len(cache.entries()) == 3


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "foreign key", "not an entry"])
def test_a_bad_entry_is_rebuilt_with_a_warning(disk_cache, compiles, damage):
    model, x = _model(), torch.randn(4, 64, dtype=torch.float16)
    out, _, _ = _run(model, x)
    (path,) = cache.entries()
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flipped byte":
        path.write_bytes(data[:-100] + bytes([data[-100] ^ 1]) + data[-99:])
    elif damage == "foreign key":
        path.write_bytes(data.replace(b"format", b"fbrmat", 1))  # the key in the header
    else:
        path.write_bytes(b"hello")
    with pytest.warns(cache.CompileCacheWarning, match="unusable"):
        again, _, _ = _run(model, x)
    assert len(compiles) == 2 and torch.equal(out, again)
    cache.read(path, _header_key(path))  # rewritten, whole


def _header_key(path: Path) -> str:
    import json

    data = path.read_bytes()
    end = data.index(b"\n", len(cache.MAGIC))
    return json.loads(data[len(cache.MAGIC) : end])["key"]


def test_an_unwritable_cache_only_warns(tmp_path, monkeypatch, compiles):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("SPYRE_EMU_CACHE", str(blocker))
    monkeypatch.setenv("SPYRE_EMU_COMPILE_CACHE", "1")
    model, x = _model(), torch.randn(4, 64, dtype=torch.float16)
    with pytest.warns(cache.CompileCacheWarning, match="could not write"):
        out, _, _ = _run(model, x)
    with torch.no_grad():
        assert out.shape == (4, 64) and torch.isfinite(out).all()


def test_off_switch(tmp_path, monkeypatch, compiles):
    monkeypatch.setenv("SPYRE_EMU_CACHE", str(tmp_path))
    monkeypatch.setenv("SPYRE_EMU_COMPILE_CACHE", "0")
    _run(_model(), torch.randn(4, 64, dtype=torch.float16))
    assert cache.entries() == []


def test_lru_pruning_keeps_the_size_bound(disk_cache, monkeypatch):
    disk_cache.mkdir(parents=True)
    now = time.time()
    for i, age in enumerate((300, 100, 200)):
        p = disk_cache / f"{i:032x}.pkl"
        p.write_bytes(b"x" * 1000)
        os.utime(p, (now - age, now - age))
    stale = disk_cache / ".dead.pkl.1.tmp"
    stale.write_bytes(b"partial")
    os.utime(stale, (now - 2 * cache.STALE_TEMP_S,) * 2)
    assert cache.size_bytes() == 3000
    assert cache.prune(2000) == 1  # the least recently used (oldest mtime) goes first
    assert sorted(p.name[:1] for p in cache.entries()) == ["0", "0"] and not stale.exists()
    assert {p.name for p in cache.entries()} == {f"{1:032x}.pkl", f"{2:032x}.pkl"}
    # a write prunes down to SPYRE_EMU_CACHE_MAX_MB, never the entry just written
    monkeypatch.setenv("SPYRE_EMU_CACHE_MAX_MB", "0.0001")
    _run(_model(), torch.randn(4, 64, dtype=torch.float16))
    (left,) = cache.entries()
    assert left.name not in {f"{1:032x}.pkl", f"{2:032x}.pkl"}


def test_cli_cache_info_and_clear(disk_cache):
    from typer.testing import CliRunner

    from models.cli import app

    _run(_model(), torch.randn(4, 64, dtype=torch.float16))
    runner = CliRunner()
    info = runner.invoke(app, ["cache", "info"])
    assert info.exit_code == 0, info.output
    assert str(disk_cache) in info.output.replace("\n", "") and "1 entr" in info.output
    cleared = runner.invoke(app, ["cache", "clear"])
    assert cleared.exit_code == 0, cleared.output
    assert "1" in cleared.output and cache.entries() == []


@pytest.mark.slow
def test_two_processes_compiling_the_same_graph_both_succeed(tmp_path):
    script = textwrap.dedent(
        """
        import torch
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)).half()
        with torch.no_grad():
            out = torch.compile(m, backend="spyre")(torch.ones(4, 64, dtype=torch.float16))
        print(out.float().sum().item())
        """
    )
    env = {**os.environ, "SPYRE_EMU_CACHE": str(tmp_path), "SPYRE_EMU_COMPILE_CACHE": "1"}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1]
    (entry,) = (tmp_path / cache.SUBDIR).glob("*.pkl")
    cache.read(entry, _header_key(entry))  # whole, whichever rename won
    third = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert third.returncode == 0 and third.stdout == outs[0]
