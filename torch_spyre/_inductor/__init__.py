"""torch_spyre._inductor: the real stack's Inductor package. Here: its config module, which is
torch_spyre_emu.inductor_config itself (one module, so setting an option here sets it for the emulator), and its
hint API (spyre_hint, declare_tensor_dim, name_tensor_dims: torch_spyre_emu.hints)."""

import sys

from torch_spyre_emu import inductor_config as config
from torch_spyre_emu.hints import declare_tensor_dim, name_tensor_dims, spyre_hint

sys.modules[__name__ + ".config"] = config

__all__ = ["config", "declare_tensor_dim", "name_tensor_dims", "spyre_hint"]
