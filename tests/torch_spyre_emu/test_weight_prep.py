"""Weight preparation: the layout copies of nn.Linear weights (restickify of W^T, K-padding) run once per weight
upload or change, in a separate program, not on every call; values are the same as laying them out per call."""

import torch
import torch.nn.functional as F
from torch import nn

import torch_spyre_emu

LAYOUT = ("restickify", "copy", "fill")


def compiled(fn):
    return torch.compile(fn, backend="spyre", dynamic=False)


def weight_layout_kernels(report) -> list:
    return [k for k in report.kernels if k.op in LAYOUT]


def make_linear() -> nn.Linear:
    torch.manual_seed(0)
    # in=100: not whole sticks, so the weight gets both a restickify and pad_k's zero fill + copy
    return nn.Linear(100, 72).half().eval()


def reference(lin: nn.Linear, x: torch.Tensor):
    """The same linear with the weight as a plain tensor argument: not a parameter, so laid out on every call."""
    out = compiled(F.linear)(x, lin.weight.detach().clone(), lin.bias.detach().clone())
    return out, torch_spyre_emu.last_profile()


def test_linear_weight_layout_runs_once_and_values_are_unchanged():
    lin = make_linear()
    x = torch.randn(16, 100, dtype=torch.float16)
    ref, ref_report = reference(lin, x)
    assert any(k.op == "restickify" for k in ref_report.kernels)  # the per-call path this change avoids

    model = compiled(lin)
    with torch.no_grad():
        first = model(x)
    r1 = torch_spyre_emu.last_profile()
    assert torch.equal(first, ref)
    assert r1.weights_prep_kernels >= 3 and r1.weights_prep_us > 0  # restickify + fill + copy, reported once
    with torch.no_grad():
        second = model(x)
    r2 = torch_spyre_emu.last_profile()
    assert torch.equal(second, ref)
    assert r2.weights_prep_kernels == 0 and r2.weights_prep_us == 0
    assert weight_layout_kernels(r1) == [] and weight_layout_kernels(r2) == []
    assert r2.total_us < ref_report.total_us


def test_in_place_weight_update_refreshes_the_prepared_copy():
    lin = make_linear()
    x = torch.randn(16, 100, dtype=torch.float16)
    model = compiled(lin)
    with torch.no_grad():
        before = model(x)
        model(x)
    assert torch_spyre_emu.last_profile().weights_prep_kernels == 0
    with torch.no_grad():
        lin.weight.mul_(2)
        after = model(x)
    assert torch_spyre_emu.last_profile().weights_prep_kernels > 0  # re-laid out for the new values
    ref, _ = reference(lin, x)
    assert torch.equal(after, ref) and not torch.equal(after, before)
    with torch.no_grad():
        again = model(x)
    assert torch_spyre_emu.last_profile().weights_prep_kernels == 0 and torch.equal(again, ref)


def test_another_parameter_object_gets_its_own_prepared_copy():
    lin = make_linear()
    x = torch.randn(16, 100, dtype=torch.float16)
    model = compiled(lin)
    with torch.no_grad():
        model(x)
        lin.weight = nn.Parameter(lin.weight.detach() * -1)
        out = model(x)
    ref, _ = reference(lin, x)
    assert torch.equal(out, ref)
