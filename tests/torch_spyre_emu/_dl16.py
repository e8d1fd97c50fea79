"""DL16 reference values for compare-with-CPU tests (tolerances in DL16 ulps, not ad hoc)."""

import numpy as np
import torch

from aiu_sim.numerics import dl16
from aiu_sim.numerics import host as host_numerics

DL16_MANTISSA_BITS = 9


def to_dl16(t: torch.Tensor) -> np.ndarray:
    """Values the device holds for a host tensor (float32 array)."""
    from torch_spyre_emu.compiler.runtime import device_values

    return device_values(t)


def round_dl16(x: np.ndarray) -> np.ndarray:
    return dl16.round(np.asarray(x, dtype=np.float32))


def ulp(x: np.ndarray) -> np.ndarray:
    """One DL16 ulp at |x| (9 mantissa bits)."""
    x = np.abs(np.asarray(x, dtype=np.float32))
    e = np.floor(np.log2(np.maximum(x, 1e-30)))
    return np.exp2(e - DL16_MANTISSA_BITS)


def back_to_fp16(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(host_numerics.to_host(x, "float16"))


def assert_within_ulps(got: torch.Tensor, ref: np.ndarray, ulps: float, floor: float = 0.0):
    got = got.detach().float().numpy()
    ref = np.asarray(ref, dtype=np.float32)
    # +1 fp16 rounding step on the way back to the host (fp16 has 10 mantissa bits: half a DL16 ulp)
    tol = (ulps + 0.5) * ulp(ref) + floor
    err = np.abs(got - ref)
    assert np.all(err <= tol), (
        f"max error {err.max()} (at ref {ref.flat[err.argmax()]}), tolerance {tol.flat[err.argmax()]}"
    )
