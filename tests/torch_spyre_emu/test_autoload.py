"""torch imports the emulated stack at startup (entry point `torch.backends`), as torch-spyre's `_autoload` does."""

import os
import subprocess
import sys

SNIPPET = (
    "import torch; x = torch.ones(2, 3, dtype=torch.float16).to('spyre'); print(x.device, (x * 2).cpu().sum().item(),"
    " torch._dynamo.config.cache_size_limit)"
)


def test_spyre_device_works_without_importing_the_package():
    out = subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    # and dynamo's cache_size_limit raised to 1024, as torch_spyre/__init__.py does (torch_spyre_api.md §0)
    assert out.stdout.split() == ["spyre:0", "12.0", "1024"]


def test_autoload_can_be_turned_off():
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    out = subprocess.run(
        [sys.executable, "-c", SNIPPET], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode != 0
    assert "spyre" in out.stderr
