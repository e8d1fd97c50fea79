"""torch_spyre.profiler, as in the real stack (torch_spyre_api.md §7): a stub whose is_available() is False, so
`torch_spyre.profiler` itself is None. The real stack's device events come from the separate kineto-spyre wheel; the
emulator needs none: torch.profiler with ProfilerActivity.PrivateUse1 shows the simulated device kernels directly
(torch_spyre_emu.torch_profiler, docs/profiler.md)."""


def is_available() -> bool:
    return False


__all__ = ["is_available"]
