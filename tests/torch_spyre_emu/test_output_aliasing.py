"""Compiled outputs that alias an input share its storage, as Inductor's runtime wrapper (AOTAutograd) regenerates
them: the real stack compiles through Inductor, so `y = compiled(x)` with y a view of x sees later writes into x."""

import pytest
import torch

import torch_spyre_emu  # noqa: F401


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.mark.parametrize("backend", ["inductor", "spyre"])
def test_view_outputs_share_the_inputs_storage_and_see_later_writes(backend):
    x = torch.arange(256, dtype=torch.float16).reshape(4, 64).to("spyre")
    f = torch.compile(lambda t: (t.view(64, 4), t + 1, t[1:].t()), backend=backend)
    view, fresh, window = f(x)
    host = x.cpu()
    assert torch.equal(view.cpu(), host.view(64, 4)) and torch.equal(window.cpu(), host[1:].t())
    assert window.shape == (64, 3) and window.stride() == (1, 64) and window.storage_offset() == 64
    assert _shares(view, x) and _shares(window, x) and not _shares(fresh, x)
    x.add_(1)  # a write into the input after the call reaches its views, not the computed result
    assert torch.equal(view.cpu(), x.cpu().view(64, 4)) and torch.equal(window.cpu(), x.cpu()[1:].t())
    assert torch.equal(fresh.cpu(), host + 1)


def test_the_input_an_in_place_op_returns_is_the_input():
    x = torch.ones(4, 64, dtype=torch.float16).to("spyre")
    out, doubled = torch.compile(lambda t: (t.add_(1), t * 2))(x)
    assert torch.equal(x.cpu(), torch.full((4, 64), 2.0, dtype=torch.float16)) and doubled.cpu()[0, 0].item() == 4.0
    out.mul_(3)
    assert x.cpu()[0, 0].item() == 6.0


def test_cpu_inputs_of_the_spyre_backend_give_the_cards_copies():
    """backend="spyre" on CPU tensors (an emulator extra) runs the whole graph on the card: a view output is the
    card's DL16-rounded copy, not a view of the unrounded CPU input."""
    x = torch.randn(4, 64, dtype=torch.float16)
    view, _ = torch.compile(lambda t: (t.view(64, 4), t + 1), backend="spyre")(x)
    assert not _shares(view, x) and not torch.equal(view, x.view(64, 4))
    torch.testing.assert_close(view, x.view(64, 4), rtol=2**-9, atol=0)


def test_an_output_that_is_a_view_of_another_output_shares_its_storage():
    x = torch.randn(4, 64, dtype=torch.float16).to("spyre")

    def f(a):
        y = a + 1
        return y, y.t(), y * 2

    y, yt, other = torch.compile(f)(x)
    assert _shares(y, yt) and not _shares(y, other) and torch.equal(yt.cpu(), y.cpu().t())
    y.zero_()
    assert not yt.cpu().any()


def test_a_weight_view_output_is_a_view_of_the_device_weight():
    """A Linear moved with Module.to("spyre") keeps its weight with dim_order [1, 0]; `weight.t()` returned from a
    compiled forward is still a view of that weight."""
    lin = torch.nn.Linear(64, 64).half().to("spyre")
    x = torch.randn(4, 64, dtype=torch.float16).to("spyre")
    y, wt = torch.compile(lambda v: (lin(v), lin.weight.t()))(x)
    assert _shares(wt, lin.weight) and torch.equal(wt.cpu(), lin.weight.cpu().t())


def test_a_view_output_of_a_dynamic_shape_graph_keeps_its_values():
    """With symbolic sizes the view is not regenerated (its size is not a number at compile time): the computed copy
    is returned, with the right values, for every length the one graph serves."""
    f = torch.compile(lambda t: (t.view(-1), t + 1), dynamic=True)
    for rows in (4, 6, 9):
        x = torch.randn(rows, 64, dtype=torch.float16).to("spyre")
        flat, _ = f(x)
        assert flat.shape == (rows * 64,) and torch.equal(flat.cpu(), x.cpu().view(-1))
