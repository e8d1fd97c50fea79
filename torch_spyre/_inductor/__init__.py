"""torch_spyre._inductor: the real stack's Inductor package; here its config module, which is
torch_spyre_emu.inductor_config itself (one module, so setting an option here sets it for the emulator)."""

import sys

from torch_spyre_emu import inductor_config as config

sys.modules[__name__ + ".config"] = config

__all__ = ["config"]
