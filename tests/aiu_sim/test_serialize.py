"""JSON round trip and the assembly-like listing of KernelProgram."""

from __future__ import annotations

import json

import numpy as np
import pytest

import aiu_sim
from aiu_sim import Arg, Buffer, HostOp, Kernel, KernelProgram, ProgramError
from aiu_sim.builders import llama_decoder_program, matmul_program
from aiu_sim.ir.layout import default_layout
from aiu_sim.ir.serialize import from_json, to_json
from aiu_sim.numerics.accumulate import AccumulationModel


def assert_same_program(p: KernelProgram, q: KernelProgram) -> None:
    assert p.name == q.name
    assert p.buffers == q.buffers
    assert p.steps == q.steps
    assert (p.inputs, p.outputs) == (q.inputs, q.outputs)
    assert p.constants.keys() == q.constants.keys()
    for name, values in p.constants.items():
        a, b = np.asarray(values), q.constants[name]
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    assert (p.config is None) == (q.config is None)
    if p.config is not None:
        assert p.config.to_dict() == q.config.to_dict()


def odd_program() -> KernelProgram:
    """Every feature the format must carry: LX placement, a custom layout, views, offsets, broadcast axes, attrs
    of many types, host ops, a non-default reduction order and typed constants."""
    layout = default_layout((8, 128), "dl16", dim_order=(1, 0))
    return KernelProgram(
        "odd",
        [
            Buffer("x", "dl16", (8, 128), layout=layout),
            Buffer("w", "fp32", (2, 64), placement="lx", lx_offset=0, lx_bytes_per_core=1024),
            Buffer("y", "dl16", (8, 128), placement="lx", lx_offset=1024, lx_bytes_per_core=4096),
            Buffer("ids", "int32", (8,)),
        ],
        [
            Kernel(
                "mul",
                "binary",
                [Arg("x", ("i", "j")), Arg("w", (None, "j"), view=(1, 128))],
                [Arg("y", ("i", "j"))],
                {"i": 8, "j": 128},
                fn="mul",
                split={"i": 4},
                cores=(3, 2, 1, 0),
                attrs={"note": "x", "pair": (1, 2.5), "nested": {"a": [1, None]}, "np": np.float32(0.5)},
            ),
            Kernel(
                "top",
                "reduce",
                [Arg("y", ("i", "j"), offset=(0, 0))],
                [Arg("ids", ("i",))],
                {"i": 8, "j": 128},
                fn="argmax",
                reduce_dims=("j",),
                split={"j": 2},
                reduction_order="pairwise",
                attrs={
                    "accumulation": AccumulationModel(kind="chunked", chunk_size=16),
                    "order": ["a", ("b", 1)],
                },
            ),
            HostOp("cpu", "postprocess", ["ids"], ["ids"], {"k": 4}),
        ],
        constants={
            "x": np.linspace(-1, 1, 8 * 128, dtype=np.float32).reshape(8, 128),
            "w": np.array([[np.nan, np.inf] + [0.25] * 62] * 2, dtype=np.float32),
        },
        config=aiu_sim.preset("small"),
    )


@pytest.mark.parametrize(
    "make",
    [
        odd_program,
        lambda: matmul_program(
            64, 256, 128, split={"n": 2, "k": 4}, accumulation=AccumulationModel(kind="dl16")
        ),
        lambda: llama_decoder_program(1, 128, 256, 4, 2, 32, 100, batch=1, seq=4, kv_len=8, weights="random"),
    ],
)
def test_round_trip_gives_an_equal_program(make):
    program = make()
    text = to_json(program)
    again = from_json(text)
    assert_same_program(program, again)
    assert to_json(again) == text
    assert_same_program(program, KernelProgram.from_json(program.to_json(indent=1)))


def test_array_attributes_round_trip():
    program = odd_program()
    program.steps[0].attrs["table"] = np.arange(6, dtype=np.int16).reshape(2, 3)
    again = from_json(to_json(program)).steps[0].attrs["table"]
    assert again.dtype == np.int16
    np.testing.assert_array_equal(again, program.steps[0].attrs["table"])


def test_round_trip_of_ml_dtypes_constants():
    import ml_dtypes

    program = matmul_program(64, 64, 64, split={})
    program.constants["A"] = np.full((64, 64), 1.5, dtype=ml_dtypes.bfloat16)
    again = from_json(to_json(program))
    assert again.constants["A"].dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(again.constants["A"], program.constants["A"])


def test_the_document_is_plain_json_with_an_ordered_space():
    doc = json.loads(to_json(odd_program()))
    kernel = doc["steps"][0]
    assert kernel["space"] == [["i", 8], ["j", 128]]
    assert kernel["attrs"]["pair"] == {"__tuple__": [1, 2.5]}
    assert doc["constants"]["x"]["dtype"] == "float32"


def test_serialization_errors_name_the_problem():
    program = odd_program()
    program.steps[0].attrs["fn"] = object()
    with pytest.raises(ProgramError, match=r"step 'mul' attr 'fn'.*cannot be serialized"):
        to_json(program)
    with pytest.raises(ProgramError, match="not a KernelProgram JSON document"):
        from_json('{"hello": 1}')
    with pytest.raises(ProgramError, match="version 99 is not supported"):
        from_json(json.dumps({"format": "aiu_sim.KernelProgram", "version": 99}))
    doc = json.loads(to_json(odd_program()))
    doc["steps"][0]["type"] = "warp"
    with pytest.raises(ProgramError, match=r"step 'mul': unknown step type 'warp'"):
        from_json(json.dumps(doc))


def test_loaded_programs_are_validated():
    doc = json.loads(to_json(odd_program()))
    doc["steps"][0]["cores"] = [0, 1, 2, 9]
    with pytest.raises(ProgramError, match=r"kernel 'mul'.*core id 9 is out of range for 4 cores"):
        from_json(json.dumps(doc))


# ---- listing -----------------------------------------------------------------------------------------------------


def flat(text: str) -> str:
    """The listing with runs of spaces collapsed (column widths depend on the longest name)."""
    return "\n".join(" ".join(line.split()) for line in text.splitlines())


def test_listing_reads_like_assembly():
    text = flat(str(matmul_program(64, 512, 512, split={"n": 8, "k": 4})))
    assert text.startswith("program matmul (3 buffers, 4 steps)")
    assert "A dl16 [64, 512] device [8, 64, 64] dram 64.0 KiB" in text
    assert "2 matmul mm C[m,n] <- A[m,k], B[k,n]" in text
    assert "space m=64 n=512 k=512 reduce k (chain) [pt]" in text
    assert "split n=8 k=4 -> 32 slices on cores 0-31" in text
    assert "0 h2d load_a host a:float16 -> A" in text
    assert "3 d2h store_c C -> host c:float32" in text


def test_listing_shows_views_offsets_lx_attrs_and_host_ops():
    text = flat(str(odd_program()))
    assert "w fp32 [2, 64] device [2, 2, 32] lx @0x0 +1024 B/core 512 B const" in text
    assert "binary.mul mul y[i,j] <- x[i,j], w<1x128>[_,j]" in text
    assert "split i=4 -> 4 slices on cores 3,2,1,0" in text
    assert "lx w @0x0 +1024, y @0x400 +4096 B/core" in text
    assert "reduce j (pairwise)" in text
    assert "accumulation=chunked(chunk=16)" in text
    assert "2 host cpu ids <- postprocess(ids) attrs k=4 [CPU fallback]" in text


def test_listing_of_a_llama_layer_names_every_kernel():
    program = llama_decoder_program(1, 128, 256, 4, 2, 32, 100, seq=4, kv_len=8)
    text = flat(str(program))
    for kernel in program.kernels:
        assert f" {kernel.name} " in text
    assert "attn<1x4x128>[b,s,k]" in text  # the o projection reads the attention output through a view
    assert "l0.k_cache[b,kh,s+4,e]" in text  # new keys land after the 4 past positions
