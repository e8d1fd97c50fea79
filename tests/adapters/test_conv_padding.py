"""adapters/conv_padding.py: a conv's reflect / replicate / circular padding as selects of the input and a cat. The
padded input is the elements stock's pad reads, so every result is bit-identical to stock; the stack no longer meets
the `_unsafe_index` Inductor decomposes these pads into."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_restored, snapshot
from torch import nn

import adapters
from adapters.conv_padding import PAD_MAX, border_pad

MODES = ["reflect", "replicate", "circular"]


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _stock_fails_patched_compiles(model, x, adapter: str, match: str) -> None:
    """Compiled for Spyre in fp16: stock stops with a stack error matching `match`; with `adapter` alone the model
    compiles and matches its fp32 CPU result to fp16 precision."""
    from torch_spyre_emu.errors import SpyreError

    ref = model.float()(x.float())
    model.half()
    torch._dynamo.reset()
    with pytest.raises(SpyreError, match=match):
        torch.compile(model, backend="spyre", dynamic=False)(x.half())
    torch._dynamo.reset()
    with adapters.apply(model, only=[adapter]):
        out = torch.compile(model, backend="spyre", dynamic=False)(x.half())
    torch._dynamo.reset()
    assert out.shape == ref.shape
    assert F.cosine_similarity(out.float().flatten(), ref.flatten(), dim=0) > 0.9999


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "shape,widths",
    [((2, 3, 10), (3, 3)), ((3, 10), (2, 5)), ((2, 3, 8, 9), (1, 2, 3, 0)), ((1, 2, 5, 6), (0, 0, 4, 4))],
)
def test_border_pad_is_stocks_pad(mode, shape, widths):
    x = _rand(*shape)
    assert torch.equal(border_pad(x, widths, mode), F.pad(x, widths, mode))
    assert torch.equal(border_pad(x.half(), widths, mode), F.pad(x.half(), widths, mode))


def _convs(mode):
    return [
        (nn.Conv1d(4, 3, 7, padding=3, padding_mode=mode), (2, 4, 20)),
        (nn.Conv2d(4, 3, (3, 5), padding=(1, 2), stride=2, padding_mode=mode), (2, 4, 9, 11)),
        (nn.Conv1d(4, 4, 3, padding="same", dilation=2, groups=2, padding_mode=mode), (4, 20)),  # unbatched
    ]


@pytest.mark.parametrize("mode", MODES)
def test_patched_convs_are_bit_identical_and_undone(mode):
    for conv, shape in _convs(mode):
        model, x = nn.Sequential(conv), _rand(*shape, seed=1)
        ref, snap = model(x), snapshot(model)
        with adapters.apply(model, only=["conv_padding"]) as handle:
            assert handle.report.applied == ["conv_padding"]
            assert torch.equal(model(x), ref)
        assert_restored(model, snap)


def test_what_it_takes_and_what_stays_stock():
    adapter = adapters.get_adapter("conv_padding")
    assert not adapter.applicable(nn.Sequential(nn.Conv1d(2, 2, 3, padding=1)))  # zeros: the conv pads itself
    assert not adapter.applicable(nn.Sequential(nn.Conv1d(2, 2, 41, padding=PAD_MAX + 4, padding_mode="reflect")))
    model = nn.Sequential(nn.Conv1d(2, 2, 7, padding=3, padding_mode="reflect"))
    with adapters.apply(model, only=["conv_padding"]), pytest.raises(RuntimeError, match="[Pp]adding size"):
        model(torch.randn(1, 2, 3))  # a reflect pad of 3 on a length-3 input: stock's own error


def test_compiled_for_spyre_the_pad_leaves_the_graph():
    """Stock: the reflect pad becomes `_unsafe_index`, which the stack cannot run in any mode; patched, the model
    compiles (the conv is the stack's im2col island) and matches the CPU to fp16 precision."""
    model = nn.Sequential(nn.Conv1d(64, 64, 7, padding=3, padding_mode="reflect"))
    _stock_fails_patched_compiles(model, _rand(2, 64, 32), "conv_padding", "_unsafe_index")


def test_univnet_with_its_noise_pinned_is_bit_identical():
    """UnivNet's conv_pre / conv_post pad by reflection; its forward draws noise unless given, so the check pins it."""
    from models.zoo import build

    zm = build("univnet", "default", seed=0)
    inputs = dict(zm.inputs)
    spectrogram = inputs["input_features"]
    inputs["noise_sequence"] = _rand(spectrogram.shape[0], spectrogram.shape[1], zm.model.config.model_in_channels)
    adapter = adapters.get_adapter("conv_padding")
    assert adapter.applicable(zm.model)
    result = adapter.check(zm.model, inputs, atol=0, rtol=0)
    assert result.ok, str(result)


# -- seanet_conv: EnCodec-style padded Conv1d (int64 geometry buffers) -----------------------------------------------
def _seanet_classes():
    from transformers.models.encodec.modeling_encodec import EncodecConv1d
    from transformers.models.mimi.modeling_mimi import MimiConv1d
    from transformers.models.pocket_tts_audio_tokenizer.modeling_pocket_tts_audio_tokenizer import (
        PocketTTSAudioTokenizerConv1d,
    )
    from transformers.models.wavtokenizer.modeling_wavtokenizer import WavTokenizerConv1d

    return [EncodecConv1d, MimiConv1d, WavTokenizerConv1d, PocketTTSAudioTokenizerConv1d]


def _seanet(cls, causal, pad_mode, kernel, stride, dilation=1, norm_type="weight_norm"):
    from types import SimpleNamespace

    config = SimpleNamespace(use_causal_conv=causal, pad_mode=pad_mode, norm_type=norm_type)
    torch.manual_seed(0)
    return cls(config, 4, 6, kernel, stride, dilation).eval()


_GEOMETRIES = [(7, 1, 1), (4, 2, 1), (8, 4, 1), (3, 1, 3), (5, 3, 1)]  # kernel, stride, dilation


@pytest.mark.parametrize("cls", range(4))
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("pad_mode", ["reflect", "constant", "replicate"])
def test_seanet_convs_are_bit_identical_and_undone(cls, causal, pad_mode):
    """Every geometry, at lengths that need no frame rounding, need some, and are shorter than the reflect pad
    (stock's extra zero pad first)."""
    cls = _seanet_classes()[cls]
    for kernel, stride, dilation in _GEOMETRIES:
        model = nn.Sequential(_seanet(cls, causal, pad_mode, kernel, stride, dilation))
        snap = snapshot(model)
        for length in (2, 5, 16, 33):
            x = _rand(2, 4, length, seed=length)
            ref = model(x)
            with adapters.apply(model, only=["seanet_conv"]) as handle:
                assert handle.report.applied == ["seanet_conv"]
                assert torch.equal(model(x), ref), (cls.__name__, kernel, stride, dilation, length)
            assert_restored(model, snap)


def test_seanet_time_group_norm_and_the_streaming_cache():
    """EnCodec's time_group_norm variant; a Mimi padding cache (streaming) keeps stock's path."""
    encodec, mimi = _seanet_classes()[0], _seanet_classes()[1]
    model = nn.Sequential(_seanet(encodec, False, "reflect", 7, 2, norm_type="time_group_norm"))
    x = _rand(2, 4, 19)
    ref = model(x)
    with adapters.apply(model, only=["seanet_conv"]):
        assert torch.equal(model(x), ref)

    class Cache:  # the one method MimiConv1d calls: the frames kept from the previous chunk
        def update(self, hidden_states, layer_idx):
            return torch.ones(*hidden_states.shape[:2], 6)

    conv = _seanet(mimi, True, "constant", 7, 1)
    ref = conv(x, padding_cache=Cache())
    with adapters.apply(nn.Sequential(conv), only=["seanet_conv"]):
        assert torch.equal(conv(x, padding_cache=Cache()), ref)


def test_seanet_what_it_takes():
    adapter = adapters.get_adapter("seanet_conv")
    encodec = _seanet_classes()[0]
    assert adapter.applicable(nn.Sequential(_seanet(encodec, True, "reflect", 7, 1)))
    assert not adapter.applicable(nn.Sequential(nn.Conv1d(2, 2, 3, padding=1)))
    conv = _seanet(encodec, True, "reflect", 7, 1)
    conv.forward = lambda x: x  # an earlier patch owns the forward: left alone
    assert not adapter.applicable(nn.Sequential(conv))


def test_seanet_compiled_for_spyre():
    """Stock: the padding amounts are computed from the int64 buffers inside the graph (`padding_total // 2` is
    floor_divide, then the amount is read back: a data-dependent size) and the reflect pad is `_unsafe_index`;
    patched, the conv compiles (its im2col island) and matches the CPU."""
    model = nn.Sequential(_seanet(_seanet_classes()[0], False, "reflect", 7, 2))
    _stock_fails_patched_compiles(model, _rand(2, 4, 37), "seanet_conv", "floor_divide")


@pytest.mark.parametrize("model_type", ["encodec", "mimi_encoder", "pocket_tts_audio_tokenizer_encoder"])
def test_seanet_zoo_families_are_bit_identical(model_type):
    from models.zoo import build

    zm = build(model_type, "default", seed=0)
    adapter = adapters.get_adapter("seanet_conv")
    assert adapter.applicable(zm.model)
    result = adapter.check(zm.model.float(), zm.inputs, atol=0, rtol=0)
    assert result.ok, str(result)


# -- functional_pad: F.pad in a border mode in a model's own code ----------------------------------------------------
class _WindowPad(nn.Module):
    """SwinIR's (Swin2SR's) input padding to a window multiple, in a method the forward calls, and a 1-D replicate pad
    through `F` in the forward itself."""

    def __init__(self, window=8):
        super().__init__()
        self.window = window
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def pad_to_window(self, x):
        h, w = x.shape[-2:]
        return nn.functional.pad(x, (0, (self.window - w % self.window) % self.window,
                                     0, (self.window - h % self.window) % self.window), "reflect")

    def forward(self, x):
        y = self.conv(self.pad_to_window(x))
        return F.pad(y.flatten(2), (2, 3), mode="replicate")


def test_bordered_pad_is_stocks_pad_and_leaves_the_rest_to_it():
    from adapters.conv_padding import bordered_pad

    x = _rand(2, 3, 5, 6)
    for mode in MODES:
        assert torch.equal(bordered_pad(x, (1, 2, 3, 0), mode), F.pad(x, (1, 2, 3, 0), mode))
        assert torch.equal(bordered_pad(x[0], (1, 2, 3, 0), mode=mode), F.pad(x[0], (1, 2, 3, 0), mode=mode))
    assert torch.equal(bordered_pad(x, (1, 1), value=2.0), F.pad(x, (1, 1), value=2.0))  # constant: stock
    crop = bordered_pad(x[0], (-1, 1), "replicate")  # a crop: stock
    assert torch.equal(crop, F.pad(x[0], (-1, 1), "replicate"))
    with pytest.raises(RuntimeError):
        bordered_pad(x, (6, 0), "reflect")  # wider than the dim: stock's own error


def test_functional_pad_patches_the_methods_bit_identically_and_undoes():
    model = _WindowPad().eval()
    x = _rand(2, 3, 13, 10)
    ref, snap = model(x), snapshot(model)
    adapter = adapters.get_adapter("functional_pad")
    assert adapter.applicable(model) and not adapter.applicable(nn.Sequential(nn.Conv2d(3, 3, 3)))
    with adapters.apply(model, only=["functional_pad"]) as handle:
        assert handle.report.applied == ["functional_pad"]
        assert "pad_to_window" in model.__dict__ and "forward" in model.__dict__
        assert torch.equal(model(x), ref)
    assert_restored(model, snap)
    assert "pad_to_window" not in model.__dict__


def test_functional_pad_compiled_for_spyre():
    """Stock: the reflect pad is `_unsafe_index` in the graph (F.pad's body, which no mode sees); patched, it compiles
    and matches the CPU."""
    _stock_fails_patched_compiles(_WindowPad().eval(), _rand(2, 3, 13, 10), "functional_pad", "_unsafe_index")


def test_swin2sr_is_bit_identical():
    from models.zoo import build

    zm = build("swin2sr", "default", seed=0)
    adapter = adapters.get_adapter("functional_pad")
    assert adapter.applicable(zm.model)
    result = adapter.check(zm.model.float(), zm.inputs, atol=0, rtol=0)
    assert result.ok, str(result)
