"""aiu_sim.builders: hand-built programs without torch, the equal-stick work division, and the Llama forward."""

from __future__ import annotations

import math

import numpy as np
import pytest

import aiu_sim
from aiu_sim import ProgramError
from aiu_sim.builders import (
    ProgramBuilder,
    elementwise_program,
    llama_decoder_program,
    llama_example_inputs,
    matmul_program,
)
from aiu_sim.functional.executor import execute
from aiu_sim.ir.program import stick_dims

LLAMA_8B = dict(layers=32, hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256)
TINY = dict(layers=2, hidden=128, intermediate=256, heads=4, kv_heads=2, head_dim=32, vocab=300)


# ---- work division -----------------------------------------------------------------------------------------------


def test_equal_split_fills_outputs_first_then_k():
    program = matmul_program(64, 4096, 256)  # N = 4 sticks, M = 64 rows, K = 64 sticks
    (kernel,) = program.kernels
    # Output dims fill all 32 cores without a K split; among those splits, m=8 x n=4 reads 8x4096 + 4096x64
    # elements per core where m=32 would read 2x4096 + 4096x256 (every core streaming all of B).
    assert kernel.split == {"m": 8, "n": 4}
    decode = matmul_program(1, 4096, 256)  # M = 1: N gives 4, K takes the remaining 8
    assert decode.kernels[0].split == {"n": 4, "k": 8}
    assert decode.kernels[0].num_slices == 32
    # an LM head: N = 2004 sticks = 2*2*3*167. Greedy "largest divisor first" would take n=12, leaving k=2 (24
    # cores); the policy prefers the split that keeps all 32 busy.
    head = matmul_program(1, 4096, 128256)
    assert head.kernels[0].split == {"n": 4, "k": 8}


def test_equal_split_gives_every_core_whole_sticks():
    program = llama_decoder_program(**LLAMA_8B, batch=1, seq=1, kv_len=1024)
    for kernel in program.kernels:
        sticky = stick_dims(kernel, program.buffers)
        assert kernel.num_slices <= 32
        for dim, pieces in kernel.split.items():
            units = math.ceil(kernel.space[dim] / sticky[dim]) if dim in sticky else kernel.space[dim]
            assert units % pieces == 0, (kernel.name, dim)
        if kernel.op != "matmul":
            assert not any(d in kernel.split for d in kernel.reduce_dims), kernel.name


def test_split_policy_is_pluggable():
    b = ProgramBuilder("one_core", split_policy="single")
    b.buffer("x", "dl16", (64, 64))
    b.buffer("y", "dl16", (64, 64))
    k = b.kernel("e", "unary", [("x", ("i", "j"))], [("y", ("i", "j"))], {"i": 64, "j": 64}, fn="exp")
    assert k.split == {} and k.cores == (0,)
    with pytest.raises(ProgramError, match="unknown split policy 'fastest'"):
        ProgramBuilder("p", split_policy="fastest")


def test_equal_split_respects_a_smaller_chip():
    kernel = matmul_program(256, 512, 512, config="small").kernels[0]
    assert kernel.num_slices == 4 and max(kernel.cores) == 3


# ---- small programs ----------------------------------------------------------------------------------------------


def test_matmul_program_runs_with_the_default_split():
    rng = np.random.default_rng(3)
    a = rng.normal(size=(32, 128)).astype(np.float16)
    b = rng.normal(size=(128, 64)).astype(np.float16)
    out = aiu_sim.run(matmul_program(32, 128, 64), {"a": a, "b": b}, mode="functional").outputs["c"]
    exact = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(out, exact, rtol=2**-8, atol=0.05)


@pytest.mark.parametrize("fn,arity", [("silu", 1), ("maximum", 2), ("where", 3)])
def test_elementwise_program_takes_the_fns_arity(fn, arity):
    program = elementwise_program((4, 128), fn)
    assert program.inputs == ["x", "y", "z"][:arity]
    assert program.kernels[0].op == ["unary", "binary", "ternary"][arity - 1]
    rng = np.random.default_rng(0)
    inputs = {n: rng.normal(size=(4, 128)).astype(np.float16) for n in program.inputs}
    out = aiu_sim.run(program, inputs, mode="functional").outputs["out"]
    assert out.shape == (4, 128) and np.isfinite(out).all()
    with pytest.raises(ProgramError, match="unknown fn 'cube'"):
        elementwise_program((4, 128), "cube")


# ---- the Llama forward -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seq,kv_len", [(1, 1024), (512, 512)])
def test_full_8b_programs_validate(seq, kv_len):
    # how long building takes is benchmarks/bench_sim.py's to measure (in parentheses), not a timed assertion
    program = llama_decoder_program(**LLAMA_8B, batch=1, seq=seq, kv_len=kv_len)
    names = [k.name for k in program.kernels]
    per_layer = [n for n in names if n.startswith("l0.")]
    assert len(names) == 32 * len(per_layer) + 2  # + final norm + LM head
    for op in ("q_proj", "k_proj", "v_proj", "scores", "softmax", "pv", "o_proj", "gate_proj", "down_proj"):
        assert f"l31.{op}" in names
    weight_bytes = sum(b.nbytes for n, b in program.buffers.items() if n.startswith("l") and "w" in n)
    assert 12e9 < weight_bytes < 16e9  # ~7B DL16 parameters in the layers (embedding and head excluded)
    # construction validated every kernel: cores in range, whole-stick splits, the 256 MiB span on every core


def reference_llama(program, inputs, cfg, batch, seq, kv_len, eps=1e-5) -> np.ndarray:
    """The same forward in float64 numpy, from the program's (DL16) weights and the host inputs."""
    c = {k: np.asarray(v, np.float64) for k, v in program.constants.items()}
    E = cfg["head_dim"]
    x = inputs["hidden_in"].astype(np.float64)
    cos, sin = inputs["cos"].astype(np.float64), inputs["sin"].astype(np.float64)
    mask = inputs["mask"].astype(np.float64) if seq > 1 else np.zeros((seq, kv_len))
    past = kv_len - seq

    def rms(v, w):
        return v / np.sqrt(np.mean(v * v, -1, keepdims=True) + eps) * w

    def rope(v, cs, sn):
        rotated = np.concatenate([-v[..., E // 2 :], v[..., : E // 2]], -1)
        return v * cs + rotated * sn

    for layer in range(cfg["layers"]):
        p = f"l{layer}."
        h = rms(x, c[p + "attn_norm"])
        q = rope(
            np.einsum("bsk,khge->bshge", h, c[p + "wq"]), cos[None, :, None, None], sin[None, :, None, None]
        )
        k = rope(np.einsum("bsk,khe->bshe", h, c[p + "wk"]), cos[None, :, None], sin[None, :, None])
        v = np.einsum("bsk,khe->bshe", h, c[p + "wv"])
        k_cache, v_cache = c[p + "k_cache"].copy(), c[p + "v_cache"].copy()
        k_cache[:, :, past:], v_cache[:, :, past:] = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        s = np.einsum("bshge,bhte->bhgst", q, k_cache) / math.sqrt(E) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        attn = np.einsum("bhgst,bhte->bshge", s, v_cache).reshape(batch, seq, -1)
        x = x + attn @ c[p + "wo"]
        h = rms(x, c[p + "mlp_norm"])
        gate, up = h @ c[p + "w_gate"], h @ c[p + "w_up"]
        x = x + (gate / (1 + np.exp(-gate)) * up) @ c[p + "w_down"]
    return rms(x, c["final_norm"]) @ c["lm_head"]


@pytest.mark.parametrize("seq,kv_len,logits", [(8, 8, "all"), (1, 12, "all"), (4, 12, "last")])
def test_tiny_llama_matches_a_float64_reference(seq, kv_len, logits):
    """Prefill, one decode step over a cache and a chunk with past context: DL16 end to end stays within ~1% of
    float64 (each kernel rounds once to DL16, relative 2**-10, over ~30 kernels)."""
    batch = 2
    program = llama_decoder_program(
        **TINY, batch=batch, seq=seq, kv_len=kv_len, logits=logits, weights="random"
    )
    inputs = llama_example_inputs(batch, seq, TINY["hidden"], TINY["head_dim"], kv_len=kv_len)
    out = execute(program, inputs)["logits"]
    ref = reference_llama(program, inputs, TINY, batch, seq, kv_len)
    if logits == "last":
        ref = ref[:, -1:]
    assert out.shape == ref.shape
    rel = np.abs(out - ref).max() / np.abs(ref).max()
    assert rel < 1e-2, rel
    # and the reference is sensitive: dropping the causal mask / the cache changes the answer far more than that
    if seq > 1:
        unmasked = dict(inputs, mask=np.zeros_like(inputs["mask"]))
        changed = execute(program, unmasked)["logits"]
        assert np.abs(changed - out).max() / np.abs(ref).max() > 5e-2


def test_llama_argument_errors():
    with pytest.raises(ProgramError, match="heads 6 must be a multiple of kv_heads 4"):
        llama_decoder_program(**{**TINY, "heads": 6, "kv_heads": 4})
    with pytest.raises(ProgramError, match="kv_len 2 must be >= seq 4"):
        llama_decoder_program(**TINY, seq=4, kv_len=2)
    with pytest.raises(ProgramError, match="weight 'l9.wq' is not a buffer"):
        llama_decoder_program(**TINY, weights={"l9.wq": np.zeros(1)})
