"""The attention_mask adapter on unusual models: host-built position ids where the input embeddings are several
tables, and boolean masks kept where a model negates its built mask."""

from __future__ import annotations

import inspect

import torch

import adapters
from adapters.base import primary_output
from models.zoo import build


def test_position_ids_where_the_input_embeddings_have_no_weight():
    """Kyutai's speech-to-text embeddings sum one table per audio codebook (no `.weight`): the adapter puts the
    position ids on its first table's device (it raised AttributeError before), and the output is stock's."""
    zm = build("kyutai_speech_to_text")
    model = zm.model
    assert not hasattr(model.get_input_embeddings(), "weight")
    with torch.no_grad():
        ref = primary_output(model(**zm.inputs))
        with adapters.apply(model, only=["attention_mask"]) as patch:
            out = primary_output(model(**zm.inputs))
    assert patch.report.applied == ["attention_mask"]
    assert torch.equal(out, ref)


def test_a_model_that_negates_its_mask_keeps_boolean_masks():
    """NemotronAsrStreaming's encoder builds a bidirectional chunked mask and its attention negates it
    (`matrix_bd.masked_fill_(attention_mask.logical_not(), -inf)`) and the encoder zeroes the rows it finds all
    masked (`all(mask == 0.0)` for a float mask): an additive mask there masked every allowed position (the CPU output
    moved by 0.17 on a scale of 0.13, and the device output was all zeros). The module building the masks now keeps
    the stock boolean ones: the output is stock's, bit for bit. A Llama's masks stay additive."""
    from adapters.attention_mask import mask_callers, reads_boolean_masks

    zm = build("nemotron_asr_streaming")
    model = zm.model.eval()
    callers = mask_callers(model)
    assert callers and all(reads_boolean_masks(m) for _, m, _ in callers)
    adapter = adapters.get_adapter("attention_mask")
    with torch.no_grad():
        ref = primary_output(model(**zm.inputs))
        patch = adapter.patch(model)
        try:
            out = primary_output(model(**zm.inputs))
        finally:
            patch.undo()
    assert any("boolean masks on the host" in c for c in patch.changes)
    assert torch.equal(out, ref)

    # a negation handed elsewhere is no read of the built mask: Phi-4-multimodal's pooling head passes its 2-D patch
    # mask as nn.MultiheadAttention's key_padding_mask (keeping its tower's masks boolean made its output NaN)
    from transformers.models.phi4_multimodal import modeling_phi4_multimodal as phi4

    from adapters.attention_mask import _negates_a_mask
    from adapters.structure import chain

    head = phi4.Phi4MultimodalVisionMultiheadAttentionPoolingHead.forward
    assert "~attention_mask" in inspect.getsource(head) and not _negates_a_mask(chain(head)[-1].__code__)

    llama = build("llama").model
    assert not any(reads_boolean_masks(m) for _, m, _ in mask_callers(llama))
    patch = adapter.patch(llama)
    patch.undo()
    assert patch.changes and not any("boolean" in c for c in patch.changes)
