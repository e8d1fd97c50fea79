"""The rewrite adapter's forms for results sized by a device tensor's values, in eager forwards on the device (the
real stack's flow: `Module.to("spyre")`, inputs on the device): `x[mask]`, nonzero / argwhere / one-argument
where / unique / unique_consecutive / repeat_interleave by counts on the host, F.one_hot as a compare, `x[i, j, None]`, and a scatter with an
int32 index. Stock, each stops on the device with the stack's typed error; adapted, each gives the CPU's result
bit for bit (on the device's DL16 values), with its indices back on the device."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import adapters
from adapters.rewrite import _PASS, REWRITES
from torch_spyre_emu.errors import FallbackWarning, SpyreError


def _handler(func, gap: str = "shape.data_dependent"):
    for r in REWRITES:
        if r.gap != gap:
            continue
        for f, h in (*((f, r.handler) for f in r.funcs), *r.extra):
            if f is func:
                return h
    raise KeyError(func)


class _DataSized(nn.Module):
    """The forms the zoo's eager device runs met: X-MOD's and Idefics2's `x[mask]`, ViLT's `nonzero()` and
    `unique()`, DBRX's `one_hot` expert mask, `torch.where(mask[e])` and `weights[token_idx, idx, None]`, Qwen4-Exp's
    int32 scatter of a selection mask, Kimi-K2.5's `repeat_interleave` by a tensor of counts."""

    def forward(self, x, mask, labels, weights, sel):
        rows = x[mask]
        picked = x[mask, ...]
        nz = mask.nonzero()
        pos, tok = torch.where(mask)
        arg = torch.argwhere(mask)
        uniq, inverse = labels.unique(return_inverse=True)
        runs = torch.unique_consecutive(labels.flatten())
        onehot = F.one_hot(labels, num_classes=6)
        w = weights[pos, tok, None]
        hit = torch.zeros(2, 5, 9, dtype=torch.bool, device=x.device).scatter(-1, sel, True)
        rep = torch.repeat_interleave(labels[0], labels[1])
        counts = torch.repeat_interleave(labels[1])
        return rows, picked, nz, pos, tok, arg, uniq, inverse, runs, onehot, w, hit, rep, counts


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 64, generator=g).half()
    mask = torch.rand(2, 5, generator=g) > 0.5
    labels = torch.randint(0, 6, (2, 5), generator=g)
    weights = torch.randn(2, 5, generator=g).half()
    sel = torch.randint(0, 9, (2, 5, 3), generator=g).int()
    return x, mask, labels, weights, sel


def _on_device(inputs):
    return tuple(t.to("spyre") for t in inputs)


def test_stock_stops_on_the_device_with_the_stacks_typed_error():
    with pytest.raises(SpyreError), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _DataSized()(*_on_device(_inputs()))


def test_adapted_eager_forward_on_the_device_equals_the_cpu():
    inputs = _inputs()
    device_inputs = _on_device(inputs)
    dl16 = tuple(t.cpu() for t in device_inputs)  # the values the device holds (DL16 for fp16)
    ref = _DataSized()(*dl16)
    model = _DataSized()
    with adapters.apply(model, only=["rewrite"]) as handle, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        assert handle.report.applied == ["rewrite"]
        out = model(*device_inputs)
    assert len(out) == len(ref)
    for got, want in zip(out, ref, strict=True):
        assert got.device.type == "spyre"
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want)


def test_a_mask_selecting_nothing_gives_stocks_empty_rows():
    x = torch.randn(3, 4, 64).half()
    mask = torch.zeros(3, 4, dtype=torch.bool)
    out = _handler(torch.Tensor.__getitem__)((x.to("spyre"), mask.to("spyre")), {})
    assert out.device.type == "spyre" and out.shape == x[mask].shape == (0, 64) and out.dtype == x.dtype


def test_forms_left_to_stock():
    dev = _on_device(_inputs())
    x, mask, labels = dev[0], dev[1], dev[2]
    getitem = _handler(torch.Tensor.__getitem__)
    where = _handler(torch.where)
    nonzero = _handler(torch.nonzero)
    one_hot = _handler(F.one_hot, gap="aten.scatter")
    cpu = _inputs()
    assert getitem((cpu[0], cpu[1]), {}) is _PASS  # CPU tensors: stock
    assert nonzero((cpu[1],), {}) is _PASS
    assert one_hot((cpu[2], 6), {}) is _PASS
    assert getitem((x, mask[:, :3]), {}) is _PASS  # a mask not over x's leading dims: stock's IndexError
    assert getitem((x, (mask, slice(0, 2))), {}) is _PASS  # a partial slice after the mask
    assert getitem((x, mask[0, 0]), {}) is _PASS  # a 0-d mask adds a dim
    assert where((mask, x, x), {}) is _PASS  # the three-argument select
    assert nonzero((mask,), {"out": torch.empty(0, dtype=torch.int64)}) is _PASS
    assert one_hot((labels, 3), {}) is _PASS  # a label >= num_classes: stock's error
    assert one_hot((labels.int(),), {}) is _PASS  # not int64: stock's error


def test_one_hot_reads_its_width_from_the_index_as_stock():
    labels = torch.tensor([[0, 3], [2, 1]])
    out = _handler(F.one_hot, gap="aten.scatter")((labels.to("spyre"),), {})
    assert out.device.type == "spyre" and torch.equal(out.cpu(), F.one_hot(labels))


def test_a_real_dbrx_ffn_runs_on_the_device():
    """transformers' DBRX FFN (router, top-k, the experts loop over one_hot / nonzero / where / index_add_) moved to
    the device: stock stops on the one_hot's scatter; adapted it runs there and matches the CPU within fp16."""
    from transformers.models.dbrx.configuration_dbrx import DbrxConfig
    from transformers.models.dbrx.modeling_dbrx import DbrxFFN

    cfg = DbrxConfig(
        d_model=64, n_heads=2, ffn_config={"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2}
    )
    torch.manual_seed(0)
    ffn = DbrxFFN(cfg).eval()
    for p in ffn.parameters():
        nn.init.normal_(p, std=0.1)
    ffn = ffn.half()
    x = torch.randn(1, 8, 64).half()
    ref = ffn.float()(x.to("spyre").cpu().float())
    ffn = ffn.half()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(SpyreError, match="scatter"):
            ffn.to("spyre")(x.to("spyre"))
        ffn.to("cpu")
        with adapters.apply(ffn):  # on the CPU, then moved: as hf-adapters prepare a model
            ffn.to("spyre")
            out = ffn(x.to("spyre"))
    torch.testing.assert_close(out.cpu().float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    "key",
    [
        lambda i, j: (i, j, None),
        lambda i, j: (i, None, slice(None)),
        lambda i, j: (i, None),
        lambda i, j: (i, j, None, slice(None)),
        lambda i, j: (i, slice(None), None),
    ],
    ids=["ij-none", "i-none-all", "i-none", "ij-none-all", "i-all-none"],
)
def test_nones_after_index_tensors_are_the_lookup_unsqueezed(key):
    """x[i, j, None] (DBRX's routing weights) and its kin: the lookup, then each None where stock puts its dim; the
    CPU's values and shape bit for bit (the form also runs on CPU tensors: compiled graphs, host code)."""
    getitem = _handler(torch.Tensor.__getitem__, gap="aten.index")
    x = torch.randn(32, 4, 8)
    i, j = torch.tensor([0, 5, 31, 5]), torch.tensor([1, 3, 0, 2])
    out = getitem((x, key(i, j)), {})
    assert out is not _PASS and out.shape == x[key(i, j)].shape and torch.equal(out, x[key(i, j)])


def test_nones_before_an_index_tensor_stay_stock():
    getitem = _handler(torch.Tensor.__getitem__, gap="aten.index")
    x, i = torch.randn(32, 4), torch.tensor([0, 3])
    assert getitem((x, (None, i)), {}) is _PASS
    assert getitem((x, (i, None, 1)), {}) is _PASS  # an int after the None: not this form
