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


# --- weights loaded as torch-spyre's model_utils does: dim_order [1, 0] (API digest §9) ---------------------------


def prep_ops(module: nn.Module, *inputs) -> list[str]:
    """The kernel ops of the weight preparation program `module` compiles to for these inputs (none: [])."""
    from torch_spyre_emu.compiler import GraphRunner
    from torch_spyre_emu.compiler.pipeline import compile_fn

    params = dict(module.named_parameters())

    def fn(x, *weights):  # parameters as graph inputs, as dynamo passes them
        return torch.func.functional_call(module, dict(zip(params, weights, strict=True)), (x,))

    all_inputs = [*inputs, *params.values()]
    # the options torch.compile's backend would choose for these inputs (weights, their layouts)
    options = GraphRunner(torch.fx.symbolic_trace(module), "prep_probe").options_for(all_inputs)
    prep = compile_fn(fn, all_inputs, options).prep
    return [] if prep is None else [k.op for k in prep.program.steps]


def test_a_linear_moved_to_spyre_needs_no_weight_restickify_and_gives_the_same_values():
    cpu_lin = make_linear()
    x = torch.randn(16, 100, dtype=torch.float16)
    with torch.no_grad():
        ref = compiled(cpu_lin)(x)
    cpu_report = torch_spyre_emu.last_profile()
    assert "restickify" in prep_ops(cpu_lin, x)  # a CPU weight is uploaded in the default layout

    lin = make_linear().to("spyre")
    assert lin.weight.device_tensor_layout().device_size == [2, 100, 64]  # sticks along out_features
    xs = x.to("spyre")
    ops = prep_ops(lin, xs)
    assert "restickify" not in ops and ops  # K=100 still gets pad_k's zero fill + copy
    with torch.no_grad():
        out = torch.compile(lin)(xs)
    report = torch_spyre_emu.last_profile()
    assert torch.equal(out.cpu(), ref)
    assert report.weights_prep_kernels == cpu_report.weights_prep_kernels - 1
    assert report.weights_prep_us < cpu_report.weights_prep_us


def test_an_in_place_update_of_a_spyre_weight_is_seen_by_the_next_call():
    lin = make_linear().to("spyre")
    xs = torch.randn(16, 100, dtype=torch.float16).to("spyre")
    model = torch.compile(lin)
    with torch.no_grad():
        before = model(xs).cpu()
        lin.weight.mul_(2)
        after = model(xs).cpu()
    cpu = make_linear()
    with torch.no_grad():
        cpu.weight.mul_(2)
        ref = compiled(cpu)(xs.cpu())
    assert torch.equal(after, ref) and not torch.equal(after, before)


def test_a_dim_order_1_0_weight_read_in_host_order_is_restickified_once():
    """The layout decides the copies, not the op: W itself (not W^T) as a matmul's A operand wants sticks along
    in_features, so a [1, 0] weight gets the restickify there, in its preparation program."""

    class WeightOnTheLeft(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = make_linear()

        def forward(self, h):
            return torch.matmul(self.lin.weight, h.T), self.lin(h)

    torch.manual_seed(1)
    h = torch.randn(16, 100, dtype=torch.float16)
    cpu = WeightOnTheLeft()
    with torch.no_grad():
        ref = compiled(cpu)(h)
    dev = WeightOnTheLeft().to("spyre")
    assert "restickify" in prep_ops(dev, h.to("spyre"))
    with torch.no_grad():
        out = torch.compile(dev)(h.to("spyre"))
    assert all(torch.equal(o.cpu(), r) for o, r in zip(out, ref, strict=True))


def test_weights_made_under_inference_mode_are_read_again_on_every_call():
    """Inference tensors have no version counter (reading it raises), and inside inference_mode they can change in
    place: a model built or moved there runs compiled, uploads and prepares its weights once in the report, and
    sees an in-place change of a weight on the next call, for CPU weights (backend="spyre") and spyre ones."""
    with torch.inference_mode():
        lin = make_linear()
        x = torch.randn(16, 100, dtype=torch.float16)
        model = compiled(lin)
        first = model(x)
        r1 = torch_spyre_emu.last_profile()
        assert torch.equal(model(x), first)
        r2 = torch_spyre_emu.last_profile()
        assert (r1.weights_uploaded, r2.weights_uploaded) == (2, 0)
        assert r1.weights_prep_kernels >= 3 and r2.weights_prep_kernels == 0
        lin.weight.mul_(2)
        after = model(x)
        assert torch.equal(after, reference(lin, x)[0]) and not torch.equal(after, first)

        moved = make_linear().to("spyre")  # the loader's [1, 0] weight: its transposed copy is the cached one
        xs = x.to("spyre")
        run = torch.compile(moved)
        before = run(xs).cpu()
        moved.weight.mul_(2)
        changed = run(xs).cpu()
        assert torch.equal(changed, moved(xs).cpu()) and not torch.equal(changed, before)
