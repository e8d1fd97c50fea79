"""The kernel sequence of a Llama decoder forward (prefill or one decode step), built without torch.

Per layer: rmsnorm -> q/k/v projections -> rotary embedding (rotate-half as neg + copy, then mul and addcmul) with
k and v written into the KV cache -> scores = q k^T (batched over heads, GQA by broadcasting each KV head to its
query group) -> scale (and the causal mask when seq > 1) -> softmax -> p v -> o projection (reading the attention
output through a zero-cost view) -> residual add -> rmsnorm -> gate / up projections -> silu * up -> down
projection -> residual add. Then the final rmsnorm and the LM head.

Host inputs: "hidden_in" (batch, seq, hidden) -- the token embeddings, a CPU op in torch-spyre (HW §3: embedding
falls back) --, "cos" / "sin" (seq, head_dim) rotary tables for the current positions (sin/cos fall back to the CPU
too) and, when seq > 1, "mask" (seq, kv_len), the additive causal mask. Host output: "logits".
Weights and KV caches are device-resident buffers: give their values with `weights` (a dict, or "random").
The new tokens sit at positions [kv_len - seq, kv_len) of the cache; earlier positions are the past.
"""

from __future__ import annotations

import math

import numpy as np

from aiu_sim.builders.program_builder import ProgramBuilder, SplitPolicy
from aiu_sim.config import HardwareConfig
from aiu_sim.errors import ProgramError
from aiu_sim.ir.ops import MAX_CARDS
from aiu_sim.ir.program import Arg, Collective, KernelProgram


def llama_decoder_program(
    layers: int,
    hidden: int,
    intermediate: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    vocab: int,
    batch: int = 1,
    seq: int = 1,
    kv_len: int | None = None,
    split_policy: str | SplitPolicy = "equal",
    *,
    dtype: str = "dl16",
    eps: float = 1e-5,
    logits: str = "all",
    weights: dict | str | None = None,
    seed: int = 0,
    config: HardwareConfig | str | None = None,
    name: str | None = None,
    world_size: int = 1,
) -> KernelProgram:
    """A Llama forward over `seq` new tokens with a KV cache of `kv_len` positions (default: seq, a prefill).

    logits: "all" (every new token) or "last". weights: None (device buffers without values: fine for timing),
    "random" (seeded values for every weight and the past KV cache), or a dict buffer name -> array.
    world_size > 1: one rank's program of a tensor-parallel group of that many cards (Megatron style): heads,
    kv_heads, intermediate and vocab are then this rank's shards (the caller splits them), o_proj and down_proj
    outputs are partial sums that a Collective all-reduce completes, and an all-gather stacks the ranks' logits
    shards along dim 0, so host "logits" is (world_size * batch, rows, vocab) in rank order."""
    kv_len = seq if kv_len is None else kv_len
    if heads % kv_heads:
        raise ProgramError(f"llama: heads {heads} must be a multiple of kv_heads {kv_heads}")
    if head_dim % 2:
        raise ProgramError(f"llama: head_dim {head_dim} must be even (rotate-half)")
    if kv_len < seq:
        raise ProgramError(f"llama: kv_len {kv_len} must be >= seq {seq} (the cache holds the new tokens)")
    if logits not in ("all", "last"):
        raise ProgramError(f"llama: logits must be 'all' or 'last', got {logits!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or not 1 <= world_size <= MAX_CARDS:
        raise ProgramError(
            f"llama: world_size must be the cards of the group, 1..{MAX_CARDS}, got {world_size!r}"
        )
    groups, half, past = heads // kv_heads, head_dim // 2, kv_len - seq
    b = ProgramBuilder(name or f"llama_l{layers}_h{hidden}_s{seq}_kv{kv_len}", config, split_policy)
    B, S, H, KH, G, E, T, FF = batch, seq, hidden, kv_heads, groups, head_dim, kv_len, intermediate

    # Activations are reused layer to layer (as a memory planner would); weights and caches are per layer.
    for buf, shape in {
        "x": (B, S, H),
        "h": (B, S, H),
        "q": (B, S, KH, G, E),
        "q_rot": (B, S, KH, G, E),
        "q_half": (B, S, KH, G, E),
        "k_new": (B, S, KH, E),
        "k_half": (B, S, KH, E),
        "k_cos": (B, S, KH, E),
        "v_new": (B, S, KH, E),
        "scores": (B, KH, G, S, T),
        "attn": (B, S, KH, G, E),
        "o": (B, S, H),
        "gate": (B, S, FF),
        "up": (B, S, FF),
        "cos": (S, E),
        "sin": (S, E),
        "attn_scale": (1,),
    }.items():
        b.buffer(buf, dtype, shape)
    b.constant("attn_scale", np.array([1.0 / math.sqrt(head_dim)], dtype=np.float32))
    b.host_input("hidden_in", "x")
    b.host_input("cos", "cos")
    b.host_input("sin", "sin")
    if S > 1:
        b.buffer("mask", dtype, (S, T))
        b.host_input("mask", "mask")

    for layer in range(layers):
        p = f"l{layer}."
        for buf, shape in {
            "attn_norm": (H,),
            "wq": (H, KH, G, E),
            "wk": (H, KH, E),
            "wv": (H, KH, E),
            "wo": (KH * G * E, H),
            "mlp_norm": (H,),
            "w_gate": (H, FF),
            "w_up": (H, FF),
            "w_down": (FF, H),
            "k_cache": (B, KH, T, E),
            "v_cache": (B, KH, T, E),
        }.items():
            b.buffer(p + buf, dtype, shape)
        _rmsnorm(b, p + "attn_norm", "x", p + "attn_norm", "h", B, S, H, eps)
        _attention(b, p, B, S, H, KH, G, E, T, half, past)
        _all_reduce(b, p + "attn_all_reduce", "o", world_size)
        _residual(b, p + "attn_residual", "o", B, S, H)
        _rmsnorm(b, p + "mlp_norm", "x", p + "mlp_norm", "h", B, S, H, eps)
        _mlp(b, p, B, S, H, FF)
        _all_reduce(b, p + "mlp_all_reduce", "o", world_size)
        _residual(b, p + "mlp_residual", "o", B, S, H)

    _lm_head(b, B, S, H, vocab, dtype, eps, logits, world_size)

    if weights is not None:
        values = _random_weights(b, seed) if isinstance(weights, str) and weights == "random" else weights
        if not isinstance(values, dict):
            raise ProgramError(f"llama: weights must be None, 'random' or a dict, got {weights!r}")
        for buf, arr in values.items():
            if buf not in b.buffers:
                raise ProgramError(f"llama: weight {buf!r} is not a buffer of this program")
            b.constant(buf, arr)
    return b.build()


def weight_buffers(program: KernelProgram) -> list[str]:
    """The device-resident buffers a Llama program needs values for (weights and KV caches)."""
    per_layer = (
        "attn_norm",
        "wq",
        "wk",
        "wv",
        "wo",
        "mlp_norm",
        "w_gate",
        "w_up",
        "w_down",
        "k_cache",
        "v_cache",
    )
    names = [n for n in program.buffers if n.split(".", 1)[-1] in per_layer and "." in n]
    return names + ["final_norm", "lm_head"]


def llama_example_inputs(
    batch: int,
    seq: int,
    hidden: int,
    head_dim: int,
    kv_len: int | None = None,
    seed: int = 0,
    theta: float = 5e5,
) -> dict[str, np.ndarray]:
    """Host inputs for llama_decoder_program: random hidden states, the rotary tables of positions
    [kv_len - seq, kv_len) (HF Llama's rotate-half convention) and the causal mask (when seq > 1)."""
    kv_len = seq if kv_len is None else kv_len
    rng = np.random.default_rng(seed)
    positions = np.arange(kv_len - seq, kv_len, dtype=np.float64)
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.outer(positions, inv_freq)
    angles = np.concatenate([angles, angles], axis=1)
    inputs = {
        "hidden_in": rng.standard_normal((batch, seq, hidden)).astype(np.float16),
        "cos": np.cos(angles).astype(np.float16),
        "sin": np.sin(angles).astype(np.float16),
    }
    if seq > 1:
        visible = np.arange(kv_len)[None, :] <= (kv_len - seq + np.arange(seq))[:, None]
        inputs["mask"] = np.where(visible, 0.0, -np.inf).astype(np.float16)
    return inputs


# ---- pieces --------------------------------------------------------------------------------------------------


def _rmsnorm(b: ProgramBuilder, name, x, weight, out, B, S, H, eps) -> None:
    b.kernel(
        name,
        "rmsnorm",
        [(x, ("b", "s", "d")), (weight, ("d",))],
        [(out, ("b", "s", "d"))],
        {"b": B, "s": S, "d": H},
        reduce_dims=("d",),
        attrs={"eps": eps},
    )


def _linear(b: ProgramBuilder, name, x, w, out, B, S, K, N) -> None:
    b.kernel(
        name,
        "matmul",
        [(x, ("b", "s", "k")), (w, ("k", "n"))],
        [(out, ("b", "s", "n"))],
        {"b": B, "s": S, "n": N, "k": K},
        reduce_dims=("k",),
    )


def _attention(b: ProgramBuilder, p, B, S, H, KH, G, E, T, half, past) -> None:
    q_dims = ("b", "s", "kh", "g", "e")
    q_space = {"b": B, "s": S, "kh": KH, "g": G, "e": E}
    b.kernel(
        p + "q_proj",
        "matmul",
        [("h", ("b", "s", "k")), (p + "wq", ("k", "kh", "g", "e"))],
        [("q", q_dims)],
        {**q_space, "k": H},
        reduce_dims=("k",),
    )
    for proj, w, out in (("k_proj", "wk", "k_new"), ("v_proj", "wv", "v_new")):
        b.kernel(
            p + proj,
            "matmul",
            [("h", ("b", "s", "k")), (p + w, ("k", "kh", "e"))],
            [(out, ("b", "s", "kh", "e"))],
            {"b": B, "s": S, "kh": KH, "e": E, "k": H},
            reduce_dims=("k",),
        )
    # q_rot = q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-q[..., half:], q[..., :half])
    _rotate_half(b, p + "q", "q", "q_half", ("b", "s", "kh", "g"), q_space, half)
    b.kernel(
        p + "q_cos", "binary", [("q", q_dims), ("cos", ("s", "e"))], [("q_rot", q_dims)], q_space, fn="mul"
    )
    b.kernel(
        p + "q_rope",
        "ternary",
        [("q_rot", q_dims), ("q_half", q_dims), ("sin", ("s", "e"))],
        [("q_rot", q_dims)],
        q_space,
        fn="addcmul",
    )
    k_dims = ("b", "s", "kh", "e")
    k_space = {"b": B, "s": S, "kh": KH, "e": E}
    cache_at = (0, 0, past, 0)  # the new tokens' rows of the cache
    _rotate_half(b, p + "k", "k_new", "k_half", ("b", "s", "kh"), k_space, half)
    b.kernel(
        p + "k_cos",
        "binary",
        [("k_new", k_dims), ("cos", ("s", "e"))],
        [("k_cos", k_dims)],
        k_space,
        fn="mul",
    )
    b.kernel(
        p + "k_rope",
        "ternary",
        [("k_cos", k_dims), ("k_half", k_dims), ("sin", ("s", "e"))],
        [Arg(p + "k_cache", ("b", "kh", "s", "e"), cache_at)],
        k_space,
        fn="addcmul",
    )
    b.kernel(
        p + "v_store",
        "copy",
        [("v_new", k_dims)],
        [Arg(p + "v_cache", ("b", "kh", "s", "e"), cache_at)],
        k_space,
    )
    s_dims = ("b", "kh", "g", "s", "t")
    s_space = {"b": B, "kh": KH, "g": G, "s": S, "t": T}
    b.kernel(
        p + "scores",
        "matmul",
        [("q_rot", q_dims), (p + "k_cache", ("b", "kh", "t", "e"))],
        [("scores", s_dims)],
        {**s_space, "e": E},
        reduce_dims=("e",),
    )
    b.kernel(
        p + "scale",
        "binary",
        [("scores", s_dims), ("attn_scale", (None,))],
        [("scores", s_dims)],
        s_space,
        fn="mul",
    )
    if S > 1:
        b.kernel(
            p + "mask",
            "binary",
            [("scores", s_dims), ("mask", ("s", "t"))],
            [("scores", s_dims)],
            s_space,
            fn="add",
        )
    b.kernel(
        p + "softmax", "softmax", [("scores", s_dims)], [("scores", s_dims)], s_space, reduce_dims=("t",)
    )
    b.kernel(
        p + "pv",
        "matmul",
        [("scores", s_dims), (p + "v_cache", ("b", "kh", "t", "e"))],
        [("attn", q_dims)],
        {"b": B, "kh": KH, "g": G, "s": S, "e": E, "t": T},
        reduce_dims=("t",),
    )
    b.kernel(
        p + "o_proj",
        "matmul",
        [Arg("attn", ("b", "s", "k"), view=(B, S, KH * G * E)), (p + "wo", ("k", "n"))],
        [("o", ("b", "s", "n"))],
        {"b": B, "s": S, "n": H, "k": KH * G * E},
        reduce_dims=("k",),
    )


def _all_reduce(b: ProgramBuilder, name: str, buf: str, world_size: int) -> None:
    """Sum a row-parallel projection's partial output over the group, in place (nothing on one card)."""
    if world_size > 1:
        b.steps.append(
            Collective(name, "all_reduce", [buf], [buf], {"world_size": world_size, "reduce_op": "sum"})
        )


def _lm_head(b: ProgramBuilder, B, S, H, vocab, dtype, eps, logits="last", world_size=1) -> None:
    """The final rmsnorm and the LM head (every new token's logits, or the last one's) into host "logits"; on
    world_size > 1 cards the LM head is this rank's vocab shard, all-gathered (dim 0: rank, then batch)."""
    b.buffer("final_norm", dtype, (H,))
    b.buffer("lm_head", dtype, (H, vocab))
    rows = S if logits == "all" else 1
    out = "logits" if world_size == 1 else "logits_shard"
    b.buffer(out, dtype, (B, rows, vocab))
    _rmsnorm(b, "final_norm", "x", "final_norm", "h", B, S, H, eps)
    h_arg = Arg("h", ("b", "s", "k")) if logits == "all" else Arg("h", ("b", None, "k"), (0, S - 1, 0))
    out_arg = Arg(out, ("b", "s", "n")) if logits == "all" else Arg(out, ("b", None, "n"))
    space = {"b": B, "s": S, "n": vocab, "k": H} if logits == "all" else {"b": B, "n": vocab, "k": H}
    b.kernel("lm_head", "matmul", [h_arg, ("lm_head", ("k", "n"))], [out_arg], space, reduce_dims=("k",))
    if world_size > 1:
        b.buffer("logits", dtype, (world_size * B, rows, vocab))
        b.steps.append(
            Collective("logits_all_gather", "all_gather", [out], ["logits"], {"world_size": world_size})
        )
    b.host_output("logits", "logits", "float32")


def _rotate_half(b: ProgramBuilder, name, src, dst, lead, space, half) -> None:
    """dst = cat(-src[..., half:], src[..., :half]) along the last dim "e", as two kernels on half-width windows."""
    sub = {**{d: space[d] for d in lead}, "e": half}
    dims = (*lead, "e")
    shift = (0,) * len(lead) + (half,)
    b.kernel(name + "_neg", "unary", [Arg(src, dims, shift)], [Arg(dst, dims)], sub, fn="neg")
    b.kernel(name + "_swap", "copy", [Arg(src, dims)], [Arg(dst, dims, shift)], sub)


def _mlp(b: ProgramBuilder, p, B, S, H, FF) -> None:
    _linear(b, p + "gate_proj", "h", p + "w_gate", "gate", B, S, H, FF)
    _linear(b, p + "up_proj", "h", p + "w_up", "up", B, S, H, FF)
    dims, space = ("b", "s", "i"), {"b": B, "s": S, "i": FF}
    b.kernel(p + "silu", "unary", [("gate", dims)], [("gate", dims)], space, fn="silu")
    b.kernel(p + "gate_mul", "binary", [("gate", dims), ("up", dims)], [("gate", dims)], space, fn="mul")
    _linear(b, p + "down_proj", "gate", p + "w_down", "o", B, S, FF, H)


def _residual(b: ProgramBuilder, name, delta, B, S, H) -> None:
    dims = ("b", "s", "d")
    b.kernel(name, "binary", [("x", dims), (delta, dims)], [("x", dims)], {"b": B, "s": S, "d": H}, fn="add")


def _random_weights(b: ProgramBuilder, seed: int) -> dict[str, np.ndarray]:
    """Seeded DL16 values: norms near 1, projections ~ N(0, 1/fan_in), caches ~ N(0, 1)."""
    from aiu_sim.numerics import dl16  # lazy: building a program for timing needs no numerics kernels

    rng = np.random.default_rng(seed)
    out = {}
    for name, buf in b.buffers.items():
        base = name.split(".", 1)[-1]
        if base in ("attn_norm", "mlp_norm", "final_norm"):
            values = 1.0 + 0.1 * rng.standard_normal(buf.shape)
        elif base in ("k_cache", "v_cache"):
            values = rng.standard_normal(buf.shape)
        elif base in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "lm_head"):
            values = rng.standard_normal(buf.shape) / math.sqrt(buf.shape[0])
        else:
            continue
        out[name] = dl16.round(values.astype(np.float32))
    return out
