"""The attention_mask adapter's host-built position ids on models whose input embeddings are several tables."""

from __future__ import annotations

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
