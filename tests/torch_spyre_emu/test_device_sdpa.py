"""SDPA on the device takes torch-spyre's own SDPA op, whatever torch's CPU kernel choice would be (capture.device_sdpa).

torch asks the device which SDPA kernel to run; torch-spyre answers with the overrideable op and decomposes it into
its math path (STACK §1.2). The calls the CPU would send to torch's fp32 math kernel (whose `_safe_softmax` has no
lowering) are the ones checked here: K/V heads broadcast, a V narrower than Q, a Q whose last stride is not 1 (and
GQA, which the CPU's flash kernel takes).
Each runs on the device in strict mode (nothing falls back, nothing is refused), eager and compiled, with CPU's
result; without the op in the capability table the stack meets torch's math kernel, as before it had the op."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

import adapters
import torch_spyre_emu
from adapters.mla import _parts
from adapters.sdpa import DEVICE_SDPA
from torch_spyre_emu.errors import SpyreUnsupportedOpError


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).half()


def _case(name):
    causal = torch.ones(16, 16, dtype=torch.bool).tril()
    if name == "multi_query":  # Falcon: one K/V head for every query head
        return (_randn(1, 4, 16, 64, seed=1), _randn(1, 1, 16, 64, seed=2), _randn(1, 1, 16, 64, seed=3)), {
            "is_causal": True
        }
    if name == "narrow_v":  # MLA: V's head narrower than Q's and K's
        return (_randn(2, 2, 16, 128, seed=4), _randn(2, 2, 16, 128, seed=5), _randn(2, 2, 16, 64, seed=6)), {
            "attn_mask": causal
        }
    if (
        name == "transposed_q"
    ):  # a Q laid out (B, H, D, L), its last stride 16: what Zaya's partial RoPE gives
        q = _randn(2, 2, 64, 16, seed=7).transpose(-1, -2)
        return (q, _randn(2, 2, 16, 64, seed=8), _randn(2, 2, 16, 64, seed=9)), {"attn_mask": causal}
    if name == "gqa":
        return (
            _randn(1, 4, 16, 64, seed=10),
            _randn(1, 2, 16, 64, seed=11),
            _randn(1, 2, 16, 64, seed=12),
        ), {
            "enable_gqa": True,
            "scale": 0.1,
        }
    raise KeyError(name)


CASES = ("multi_query", "narrow_v", "transposed_q", "gqa")
MATH_ON_CPU = {
    "multi_query",
    "narrow_v",
    "transposed_q",
}  # GQA takes the CPU's flash kernel: the device op too


def _on_device(q, k, v, kw):
    return [t.to("spyre") for t in (q, k, v)], {
        n: (x.to("spyre") if isinstance(x, torch.Tensor) else x) for n, x in kw.items()
    }


def _sdpa(q, k, v, **kw):
    return F.scaled_dot_product_attention(q, k, v, **kw)


@pytest.mark.parametrize("name", CASES)
def test_calls_the_cpu_sends_to_its_math_kernel_run_on_the_device(name):
    (q, k, v), kw = _case(name)
    on_cpu = torch._fused_sdp_choice(q, k, v, **kw)
    assert (on_cpu == SDPBackend.MATH.value) == (name in MATH_ON_CPU)  # the premise: torch's math kernel
    ref = _sdpa(q.float(), k.float(), v.float(), **kw)
    dev, dkw = _on_device(q, k, v, kw)
    torch._dynamo.reset()
    with torch_spyre_emu.strict():
        eager = _sdpa(*dev, **dkw)
        compiled = torch.compile(_sdpa)(*dev, **dkw)
    torch._dynamo.reset()
    for out in (eager, compiled):
        assert out.device.type == "spyre" and out.shape == ref.shape
        torch.testing.assert_close(out.cpu().float(), ref, atol=2e-2, rtol=2e-2)


def test_without_the_op_the_stack_meets_torchs_math_kernel():
    (q, k, v), kw = _case("narrow_v")
    torch._dynamo.reset()
    with torch_spyre_emu.capabilities.override({DEVICE_SDPA: "unsupported"}), torch_spyre_emu.strict():
        with pytest.raises(SpyreUnsupportedOpError, match="_safe_softmax"):
            dev, dkw = _on_device(q, k, v, kw)
            torch.compile(_sdpa)(*dev, **dkw)
    torch._dynamo.reset()


def test_the_adapters_that_bridged_the_math_kernel_are_retired():
    """sdpa_fused and mla's V padding re-express calls only torch's math kernel took; with the stack's own SDPA op
    they are not needed (mla keeps its window-free key, a separate gap)."""
    caps = torch_spyre_emu.capabilities()
    assert adapters.get_adapter("sdpa_fused").retired(caps)
    assert not _parts(caps)[1]
    with torch_spyre_emu.capabilities.override({DEVICE_SDPA: "unsupported"}) as without:
        assert not adapters.get_adapter("sdpa_fused").retired(without)
        assert _parts(without)[1]


def test_calls_torch_rejects_keep_torchs_error():
    """The routing skips torch's input checks only where they would pass: mixed Q/K/V dtypes and an integer mask
    still fail with torch's own message, eager and compiled."""
    (q, k, v), _ = _case("narrow_v")
    dev = [t.to("spyre") for t in (q, k, v)]
    int_mask = torch.zeros(16, 16, dtype=torch.int32).to("spyre")
    for args, kw, match in (
        ((dev[0], dev[1].float(), dev[2]), {}, "Expected query, key, and value to have the same dtype"),
        (tuple(dev), {"attn_mask": int_mask}, "Expected attn_mask dtype to be bool or float"),
    ):
        torch._dynamo.reset()
        with pytest.raises(Exception, match=match):
            _sdpa(*args, **kw)
        with pytest.raises(Exception, match=match):
            torch.compile(_sdpa)(*args, **kw)
    torch._dynamo.reset()


def test_dropout_in_sdpa_is_a_typed_gap_eager_and_compiled():
    """A training-mode SDPA (dropout_p > 0) needs random draws the stack cannot lower: the stack's typed error
    naming the fix, not an untyped NotImplementedError from inside the decomposition (op_db's SDPA samples)."""
    (q, k, v), _ = _case("narrow_v")
    dev = [t.to("spyre") for t in (q, k, v)]
    for fn in (_sdpa, torch.compile(_sdpa)):
        torch._dynamo.reset()
        with pytest.raises(SpyreUnsupportedOpError, match=r"dropout_p=0.5 .*model.eval\(\)"):
            fn(*dev, dropout_p=0.5)
    torch._dynamo.reset()
    out = torch.compile(_sdpa)(*dev, dropout_p=0.0)  # inference is unaffected
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v), atol=0.05, rtol=0.05)
