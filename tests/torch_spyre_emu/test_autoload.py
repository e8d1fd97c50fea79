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


SCRIPTED = '''
import torch


@torch.jit.script
def f(x: torch.Tensor):
    return torch.empty([3], dtype=torch.float32).fill_(1) + x


print(f(torch.ones(3)).tolist())
'''


def test_torchscript_still_knows_the_factories_the_emulator_wraps(tmp_path):
    """Autoload runs in every process that imports torch: torch.jit.script of code calling torch.empty (wrapped for
    device_layout= and pinning) must compile as before, not fail for want of the wrapper's source."""
    script = tmp_path / "scripted.py"  # TorchScript reads the function's source from its file
    script.write_text(SCRIPTED)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[0] == "[2.0, 2.0, 2.0]"
