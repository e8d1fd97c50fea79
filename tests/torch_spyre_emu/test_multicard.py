"""Several emulated cards in one process: tensors on spyre:i, ops and programs that stay on their card, copies
between cards, and the errors for a card that does not exist or for tensors of two cards in one op."""

import subprocess
import sys

import numpy as np
import pytest
import torch

import torch_spyre_emu  # noqa: F401  (registers the device)
from torch_spyre_emu.device import spyre_module as spyre
from torch_spyre_emu.device import storage as device_storage
from torch_spyre_emu.device.tensor import payload
from torch_spyre_emu.errors import SpyreDeviceError


@pytest.fixture(autouse=True)
def four_cards(monkeypatch):
    monkeypatch.delenv("SPYRE_DEVICES", raising=False)
    monkeypatch.setenv("AIU_WORLD_SIZE", "4")


DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int64, torch.bool, torch.int8]


@pytest.mark.parametrize("dtype", DTYPES)
def test_factories_and_copies_land_on_the_named_card(dtype):
    host = (torch.arange(12).reshape(3, 4) % 5).to(dtype)
    for card in range(4):
        t = host.to(f"spyre:{card}")
        assert t.device == torch.device("spyre", card)
        assert device_storage.get(t).device_index == card
        assert torch.equal(t.cpu(), host)
        assert torch.zeros(2, dtype=dtype, device=f"spyre:{card}").device.index == card
        assert torch.empty_like(t).device == t.device


def test_copies_between_cards_keep_the_device_values_bit_for_bit():
    x = torch.randn(5, 64, dtype=torch.float16).to("spyre:0")
    y = x.to("spyre:3")
    assert y.device.index == 3
    assert np.array_equal(payload(x), payload(y))
    z = torch.empty(5, 64, dtype=torch.float16, device="spyre:2")
    z.copy_(y)
    assert np.array_equal(payload(z), payload(x))
    w = y.to("spyre:1", dtype=torch.float32)  # a cast and a card change
    assert w.device.index == 1 and torch.equal(w.cpu(), x.cpu().float())


def test_eager_and_compiled_results_stay_on_their_card_with_the_same_bits():
    torch.manual_seed(0)
    a, b = torch.randn(32, 64, dtype=torch.float16), torch.randn(64, 64, dtype=torch.float16)

    def fn(x, w):
        return torch.softmax(x @ w, dim=-1) * 2

    compiled = torch.compile(fn)
    outs = {}
    for card in (0, 2):
        x, w = a.to(f"spyre:{card}"), b.to(f"spyre:{card}")
        eager, comp = fn(x, w), compiled(x, w)
        assert eager.device.index == card and comp.device.index == card
        outs[card] = (payload(eager).copy(), payload(comp).copy())
    assert np.array_equal(outs[0][0], outs[2][0]) and np.array_equal(outs[0][1], outs[2][1])


def test_module_to_a_card_moves_everything_there():
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64)).half().to("spyre:3")
    assert {p.device for p in m.parameters()} == {torch.device("spyre", 3)}
    out = m(torch.randn(4, 64, dtype=torch.float16).to("spyre:3"))
    assert out.device.index == 3


def test_device_spyre_means_the_current_card():
    spyre.set_device(2)
    t = torch.ones(3, device="spyre")
    assert t.device.index == 2 and spyre.current_device() == 2
    assert (t + 1).device.index == 2


def test_tensors_of_two_cards_in_one_op_are_an_error():
    x, y = torch.ones(4, device="spyre:0"), torch.ones(4, device="spyre:1")
    with pytest.raises(RuntimeError, match="same device.*spyre:0 and spyre:1"):
        x + y
    with pytest.raises(RuntimeError, match="same device.*spyre:0 and spyre:1"):
        torch.compile(lambda a, b: a * b)(x, y)


def test_a_card_that_does_not_exist_is_an_error():
    with pytest.raises(SpyreDeviceError, match="spyre device 4 does not exist: 4 device"):
        torch.ones(2, device="spyre:4")
    with pytest.raises(SpyreDeviceError, match="spyre device 4 does not exist"):
        torch.ones(2).to("spyre:4")


@pytest.mark.parametrize("env", [{"AIU_WORLD_SIZE": "9"}, {"SPYRE_DEVICES": ",".join(map(str, range(9)))}])
def test_more_than_eight_cards_is_an_error(monkeypatch, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SpyreDeviceError, match="9 cards.*at most 8"):
        spyre.device_count()


def test_local_rank_picks_the_card_of_a_process():
    """One device per process, as the real stack: LOCAL_RANK chooses it at lazy init (torchrun sets it)."""
    code = (
        "import torch, torch_spyre_emu;"
        "t = torch.ones(2, device='spyre');"
        "print(t.device, torch.spyre.current_device(), (t * 2).device, torch.ones(2).to('spyre').device,"
        " torch.nn.Linear(2, 2).to('spyre').weight.device)"
    )
    env = {
        "AIU_WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "PATH": "/usr/bin:/bin",
        "TORCH_SPYRE_DOWNCAST_WARN": "0",
    }
    import os

    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["spyre:1", "1"] + ["spyre:1"] * 3


def test_factories_stay_what_torch_device_contexts_recognise():
    """torch's `with torch.device(...)` context finds factories by identity (transformers builds models under it):
    the emulator must not replace torch.tensor or torch.as_tensor, or they are left out of it."""
    from torch.utils._device import _device_constructors

    assert torch._C._VariableFunctions.tensor in _device_constructors()
    with torch.device("meta"):
        assert torch.tensor([1.0]).device.type == "meta" and torch.as_tensor([1.0]).device.type == "meta"
