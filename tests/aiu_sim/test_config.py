"""HardwareConfig: sourced defaults, presets as data, overrides, and clear errors for impossible values."""

import pytest

from aiu_sim.config import HardwareConfig, load_config, preset, preset_names
from aiu_sim.errors import ConfigError


def test_spyre_preset_matches_reference_defaults():
    c = preset("spyre")
    assert (c.num_cores, c.corelets_per_core) == (32, 2)
    assert (c.core_clock_ghz, c.ring_clock_ghz) == (1.1, 1.3)
    assert c.pt_macs_per_cycle("dl16") == 1024  # 2 corelets x 8x8 PEs x 8-deep K SIMD
    assert c.pt_macs_per_cycle("fp8_e4m3") == 2048
    assert c.pt_macs_per_cycle("int4") == 8192
    assert c.peak_tflops() == pytest.approx(72.1, abs=0.1)  # HW §1: "Peak fp16 at 1.1 GHz 72.1 TFLOPS"
    assert c.ring_nodes == 33
    assert c.lx_bytes == 2 * 1024 * 1024
    assert c.core_span_bytes == 256 * 1024 * 1024


def test_small_preset_for_fast_tests():
    assert "small" in preset_names()
    assert preset("small").num_cores == 4
    assert preset("small").pt_macs_per_cycle() == preset("spyre").pt_macs_per_cycle()


def test_replace_and_hash():
    c = preset().replace(num_cores=8)
    assert c.num_cores == 8
    assert hash(c) == hash(preset().replace(num_cores=8))
    assert hash(c) != hash(preset())


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("num_cores", 0, "num_cores"),
        ("dram_effective_gbps", -5.0, "dram_effective_gbps"),
        ("lx_bytes", 64, "one stick"),
        ("lx_allocatable_bytes", 4 * 1024 * 1024, "lx_allocatable_bytes"),
        ("core_clock_ghz", 0, "core_clock_ghz"),
        ("dram_effective_gbps", 300.0, "dram_peak_gbps"),
    ],
)
def test_impossible_values_name_the_field(field, value, fragment):
    with pytest.raises(ConfigError, match=fragment):
        preset().replace(**{field: value})


def test_unknown_field_is_rejected():
    with pytest.raises(ConfigError, match="unknown"):
        preset().replace(num_corez=4)


def test_user_toml(tmp_path):
    path = tmp_path / "chip.toml"
    path.write_text('name = "fast-dram"\nbase = "spyre"\ndram_effective_gbps = 200.0\n')
    c = HardwareConfig.from_toml(path)
    assert c.name == "fast-dram" and c.dram_effective_gbps == 200.0 and c.num_cores == 32
    assert load_config(str(path)) == c


def test_user_toml_unknown_key(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("num_cores = 4\nhbm_gbps = 3\n")
    with pytest.raises(ConfigError, match="hbm_gbps"):
        HardwareConfig.from_toml(path)


def test_unknown_preset():
    with pytest.raises(ConfigError, match="available"):
        preset("h100")


def test_dram_fraction_interpolates_the_measured_table():
    c = preset()
    assert c.dram_fraction(32) == 1.0
    assert c.dram_fraction(4) == pytest.approx(0.43)
    assert 0.43 < c.dram_fraction(6) < 0.54
    fractions = [c.dram_fraction(n) for n in range(1, 33)]
    assert fractions == sorted(fractions)  # more active cores never reach less of the bus


def test_summary_mentions_the_key_numbers():
    s = preset().summary()
    for text in ("32 cores", "1.1 GHz", "72.1 TFLOPS", "204.8 GB/s", "256 MiB"):
        assert text in s
