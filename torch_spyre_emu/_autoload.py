"""torch's device-backend autoload hook (entry point group `torch.backends`, as torch-spyre registers its own).

`import torch` calls `autoload()`, so `tensor.to("spyre")` works without `import torch_spyre_emu`; set
TORCH_DEVICE_BACKEND_AUTOLOAD=0 to turn it off. It lives in its own module because the entry point may fire while
`torch_spyre_emu` itself is being imported (it imports torch): then the package is half-initialized, importing it
again is a no-op, and the package registers the device itself when its import finishes.
"""


def autoload() -> None:
    import torch_spyre_emu  # noqa: F401  (importing the package registers the spyre device)
