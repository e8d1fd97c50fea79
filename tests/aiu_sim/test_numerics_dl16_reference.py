"""encode() against the independent rational-arithmetic reference in numerics_reference.py, bit for bit."""

import numerics_reference as ref
import numpy as np
import pytest

from aiu_sim.numerics import dl16


def edge_case_bits() -> np.ndarray:
    """fp32 bit patterns at every rounding and range boundary of DL16, with their neighbours."""
    groups = [
        (0x00000000, 0x00000001, 0x007FFFFF, 0x00800000),  # zero, fp32 subnormals, smallest fp32 normal
        (0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF),  # Inf, NaNs (signalling, quiet, max payload)
        (0x7F7FFFFF,),  # largest fp32
        (0x3F802000, 0x3F806000, 0x3F801FFF, 0x3F802001),  # ties near 1.0 and their neighbours
        (0x3FFFE000,),  # 2 - 2**-10: a tie that carries into the exponent
        (
            0x30000000,
            0x30002000,
            0x2FFFE000,
            0x2FFFFFFF,
        ),  # 2**-31 (the zero code), ties to the smallest positive
        (0x30004000,),  # smallest positive DL16
        (
            0x4FFF8000,
            0x4FFFA000,
            0x4FFF9FFF,
            0x4FFFC000,
        ),  # largest finite, the overflow tie, the NaN/Inf code
        (0x4F800000, 0x50000000),  # 2**32 and 2**33
    ]
    points = [p for group in groups for p in group]
    out = set()
    for p in points:
        for delta in (-2, -1, 0, 1, 2):
            b = (p + delta) & 0x7FFFFFFF
            out.update((b, b | 0x80000000))
    return np.array(sorted(out), dtype=np.uint32)


def random_bits(n: int, seed: int) -> np.ndarray:
    """Half uniform bit patterns (the whole fp32 range: subnormals, NaN, Inf, far out of DL16 range), half values in
    and around DL16's exponent range whose dropped bits sit at or next to the rounding tie."""
    rng = np.random.default_rng(seed)
    uniform = rng.integers(0, 2**32, n // 2, dtype=np.uint64).astype(np.uint32)
    m = n - n // 2
    exponent = rng.integers(90, 166, m, dtype=np.uint32) << np.uint32(23)
    fraction = rng.integers(0, 2**23, m, dtype=np.uint32)
    near_tie = rng.random(m) < 0.5
    tie_offset = rng.integers(-2, 3, m).astype(np.int64)
    fraction = np.where(
        near_tie, (fraction & ~np.uint32(0x3FFF)) + (0x2000 + tie_offset).astype(np.uint32), fraction
    )
    sign = rng.integers(0, 2, m, dtype=np.uint32) << np.uint32(31)
    focused = sign | exponent | (fraction & np.uint32(0x7FFFFF))
    return np.concatenate([uniform, focused])


def assert_matches_reference(bit_patterns: np.ndarray) -> None:
    x = bit_patterns.view(np.float32)
    fast = dl16.encode(x)
    slow = np.array([ref.encode(int(b)) for b in bit_patterns], dtype=np.uint16)
    bad = np.flatnonzero(fast != slow)
    assert bad.size == 0, [(hex(bit_patterns[i]), hex(fast[i]), hex(slow[i])) for i in bad[:5]]


def test_edge_cases_match_the_reference():
    assert_matches_reference(edge_case_bits())


def test_largest_finite_and_smallest_positive_are_the_reference_limits():
    assert dl16.MAX_FINITE == ref.DL16_MAX and dl16.SMALLEST_POSITIVE == ref.DL16_MIN_POSITIVE


def test_reference_agrees_with_the_format_formula_on_every_code():
    values = dl16.decode(np.arange(65536, dtype=np.uint16))
    for code in range(0, 65536, 97):
        expected = ref.dl16_code_value(code)
        if expected == ref.NAN_INF:
            assert np.isnan(values[code])
        else:
            assert ref.f32_value(int(values.view(np.uint32)[code])) == expected


def test_100k_random_values_match_the_reference():
    assert_matches_reference(random_bits(100_000, seed=2))


@pytest.mark.slow
def test_one_million_random_values_match_the_reference():
    assert_matches_reference(random_bits(1_000_000, seed=3))
