"""models/tensor_parallel.py without processes: the head and width split arithmetic, the plan's typed errors, and
one-process checks that the ranks' partial sums add up to the unsharded model (the all-reduce itself, across real
processes, is tests/models/test_tensor_parallel_torchrun.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoConfig, AutoModelForCausalLM

from models import tiny
from models.tensor_parallel import (
    HeadLayout,
    TensorParallelError,
    head_layouts,
    partial_shard,
    plan,
    split,
    tensor_parallel,
    width_split,
)


@st.composite
def head_counts(draw):
    kv = draw(st.integers(1, 8))
    group = draw(st.integers(1, 8))
    world = draw(st.integers(1, min(8, kv * group)))
    return kv * group, kv, world


@settings(max_examples=300, deadline=None)
@given(head_counts())
def test_every_q_head_lands_once_next_to_its_kv_head(counts):
    heads, kv_heads, world = counts
    group = heads // kv_heads
    layouts = head_layouts(heads, kv_heads, world)
    assert len(layouts) == world
    real = [lay.real_heads for lay in layouts]
    # contiguous, in rank order, each head once, sizes as even as possible
    assert [h for r in real for h in r] == list(range(heads))
    assert max(map(len, real)) - min(map(len, real)) <= 1
    for lay in layouts:
        assert len(lay.q) == lay.groups * len(lay.kv)
        for j, h in enumerate(lay.q):
            if h is not None:  # the stock repeat_kv pairs local slot j with KV slot j // groups
                assert lay.kv[j // lay.groups] == h // group
        # only the KV heads its q heads need, each of them
        assert set(lay.kv) == {h // group for h in lay.real_heads}
        # never dearer than the two obvious layouts: one KV slot per q head, or each KV head once in full groups
        n_real, n_kv = len(lay.real_heads), len(set(lay.kv))
        cost = len(lay.q) + len(lay.kv)
        assert cost <= 2 * n_real and cost <= (group + 1) * n_kv


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(1, 8), st.integers(1, 8))
def test_heads_that_divide_evenly_split_plainly(kv_heads, group, world_factor):
    # world size dividing the KV heads: every rank gets whole groups, no copies and no zero heads (Megatron)
    heads = kv_heads * group
    worlds = [w for w in range(1, kv_heads + 1) if kv_heads % w == 0]
    world = worlds[world_factor % len(worlds)]
    for r, lay in enumerate(head_layouts(heads, kv_heads, world)):
        per = heads // world
        assert lay.q == tuple(range(r * per, (r + 1) * per))
        assert lay.kv == tuple(range(r * kv_heads // world, (r + 1) * kv_heads // world))


def test_one_rank_is_the_model_itself():
    assert head_layouts(9, 3, 1) == [HeadLayout(tuple(range(9)), (0, 1, 2))]


def test_smollm2_heads_over_two_and_four_ranks():
    # 9 q heads over 3 KV heads (groups of 3): TP=2 splits 5/4, and each rank's heads cover two KV groups partly
    r0, r1 = head_layouts(9, 3, 2)
    assert r0 == HeadLayout((0, 1, 2, 3, 4, None), (0, 1))  # one zero head completes KV 1's group
    assert r1 == HeadLayout((5, None, None, 6, 7, 8), (1, 2))
    lays = head_layouts(9, 3, 4)  # 3/2/2/2 heads; rank 2 has q 5 (KV 1) and q 6 (KV 2): groups of one
    assert [lay.q for lay in lays] == [(0, 1, 2), (3, 4), (5, 6), (7, 8)]
    assert [lay.kv for lay in lays] == [(0,), (1,), (1, 2), (2,)]


def test_fewer_kv_heads_than_ranks_replicates_them():
    lays = head_layouts(4, 2, 4)  # tiny Llama at TP=4: one q head per rank, KV head 0 on ranks 0-1, 1 on 2-3
    assert [(lay.q, lay.kv) for lay in lays] == [((0,), (0,)), ((1,), (0,)), ((2,), (1,)), ((3,), (1,))]


def test_a_kv_head_is_stored_twice_where_that_is_cheapest():
    # 12 q heads over 3 KV heads (groups of 4), TP=2: rank 0 holds q 0..5, four on KV 0 and two on KV 1. Groups of
    # two (KV 0 twice) take 6 q + 3 KV slots; groups of four 8 + 2 (two zero heads); groups of one 6 + 6.
    assert head_layouts(12, 3, 2)[0] == HeadLayout(tuple(range(6)), (0, 0, 1))


def test_split_and_width_split():
    assert split(9, 2) == [range(0, 5), range(5, 9)]
    assert split(4, 4) == [range(i, i + 1) for i in range(4)]
    assert width_split(1536, 2, 64) == [range(0, 768), range(768, 1536)]
    assert width_split(256, 3, 64) == [range(0, 128), range(128, 192), range(192, 256)]  # whole sticks
    assert width_split(100, 3, 64) == [range(0, 34), range(34, 67), range(67, 100)]  # not sticks: elements
    with pytest.raises(TensorParallelError, match="cannot split 3 items into 4"):
        split(3, 4)


# --- the plan's errors -------------------------------------------------------------------------------------------


def test_tp_above_the_head_count_is_a_typed_error():
    with pytest.raises(
        TensorParallelError, match=r"degree 5 is out of range for 4 attention heads: use 1\.\.4"
    ):
        plan(tiny.tiny_llama(), 5)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_a_degree_that_is_not_a_positive_integer_is_a_typed_error(bad):
    with pytest.raises(TensorParallelError, match="positive integer"):
        plan(tiny.tiny_llama(), bad)


def test_a_model_without_llama_structure_is_a_typed_error():
    with pytest.raises(
        TensorParallelError, match=r"GPT2LMHeadModel has no attention module with Linear q_proj"
    ):
        plan(tiny.tiny_gpt2(), 2)


def test_a_norm_over_all_heads_is_refused():
    # OLMo2 normalises q over all heads at once (q_norm of num_heads * head_dim): no rank can compute it alone
    cfg = AutoConfig.for_model(
        "olmo2",
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
    )
    with pytest.raises(TensorParallelError, match=r"self_attn\.q_norm\.weight \(64,\) spans all heads"):
        plan(AutoModelForCausalLM.from_config(cfg), 2)


def test_tensor_parallel_without_a_process_group_says_how_to_launch():
    import torch.distributed as dist

    assert not dist.is_initialized()
    with pytest.raises(TensorParallelError, match=r"launch the ranks with torchrun.*init_process_group"):
        tensor_parallel(tiny.tiny_llama())


def test_collectives_must_be_a_known_mode():
    with pytest.raises(TensorParallelError, match="collectives must be one of auto, graph, host"):
        tensor_parallel(tiny.tiny_llama(), collectives="nccl")


# --- the partial sums add up ---------------------------------------------------------------------------------------

# Families of Llama's structure; with biases where the family has them, so that the bias-once rule is checked too
FAMILIES = {
    "llama": dict(attention_bias=True, mlp_bias=True),
    "mistral": {},
    "qwen2": {},  # q/k/v biases
    "qwen3": {},  # per-head q/k norms
    "granite": dict(attention_multiplier=0.2, residual_multiplier=0.5),
}


def _family(name: str, heads: int = 9, kv: int = 3, seed: int = 0):
    """A tiny model of a family, 9 q heads over 3 KV heads by default (SmolLM2-135M's)."""
    cfg = AutoConfig.for_model(
        name,
        vocab_size=128,
        hidden_size=16 * heads,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=16,
        initializer_range=0.1,
        **FAMILIES.get(name, {}),
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # non-zero biases (HF initialises them to 0)
        for n, p in model.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.1)
    return model


def _layer_sums(model, world: int, x: torch.Tensor, pos) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum over the ranks of layer 0's attention and MLP outputs, each rank's share run on its own copy."""
    attn_sum = mlp_sum = 0
    for rank in range(world):
        shard = copy.deepcopy(model)
        handle = partial_shard(shard, world, rank)
        layer = shard.model.layers[0]
        attn_sum = attn_sum + layer.self_attn(x, position_embeddings=pos, attention_mask=None)[0]
        mlp_sum = mlp_sum + layer.mlp(x)
        assert shard.config.num_attention_heads == len(handle.plan.heads[rank].q)
    return attn_sum, mlp_sum


CASES = [(f, 9, 3, w) for f in sorted(FAMILIES) for w in (2, 3, 4)] + [("llama", 12, 3, w) for w in (2, 4)]


@pytest.mark.parametrize(("family", "heads", "kv", "world"), CASES)
def test_rank_partial_sums_equal_the_unsharded_layer(family, heads, kv, world):
    # zero heads (9/3 at TP=2), a KV head stored twice (12/3 at TP=2), replicated KV heads (9/3 at TP=4)
    model = _family(family, heads, kv)
    layer = model.model.layers[0]
    x = torch.randn(1, 7, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    pos = model.model.rotary_emb(x, torch.arange(7)[None])
    with torch.no_grad():
        want_attn = layer.self_attn(x, position_embeddings=pos, attention_mask=None)[0]
        want_mlp = layer.mlp(x)
        got_attn, got_mlp = _layer_sums(model, world, x, pos)
    torch.testing.assert_close(got_attn, want_attn, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_mlp, want_mlp, atol=1e-5, rtol=1e-5)


def test_remove_restores_the_model_and_config():
    model = _family("llama")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = (model.config.num_attention_heads, model.config.num_key_value_heads, model.config.intermediate_size)
    handle = partial_shard(model, 2, 1)
    assert model.model.layers[0].self_attn.q_proj.out_features == 6 * 16  # q 5..8 and two zero heads
    assert model.model.layers[0].mlp.down_proj.bias.abs().sum() == 0  # rank 1: the bias is rank 0's
    with pytest.raises(TensorParallelError, match="sharded already"):
        partial_shard(model, 2, 0)
    handle.remove()
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert (
        model.config.num_attention_heads,
        model.config.num_key_value_heads,
        model.config.intermediate_size,
    ) == cfg


def test_teacher_forcing_in_the_static_loop_predicts_what_hf_predicts():
    # StaticGreedy(forced=...) is how the TP runs are compared with TP=1: each step fed the given token. On the CPU
    # in fp32 its predictions must be HF's own teacher-forced argmaxes, also on a sequence that is not greedy.
    import adapters
    from models.generate import GenerationError, StaticGreedy, device_copy
    from models.report import teacher_forced_predictions

    ref = tiny.tiny_llama()
    model = device_copy(ref, torch.float32)
    ids = torch.randint(0, 512, (1, 10), generator=torch.Generator().manual_seed(4))
    tokens = torch.randint(0, 512, (12,), generator=torch.Generator().manual_seed(5)).tolist()
    with adapters.apply(model):
        runner = StaticGreedy(model, compile=False)
        got = runner.generate(ids, len(tokens), forced=tokens, eos_token_id=tokens[3]).new_ids
        with pytest.raises(GenerationError, match="exactly max_new_tokens=5"):
            runner.generate(ids, 5, forced=tokens)
    assert got == teacher_forced_predictions(
        ref, ids, tokens
    )  # 12 steps: an end-of-turn token does not stop it


# --- spyre-emu demo --tp: bad input is one line, before any process starts ------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tp", "0"], "error: --tp must be 1..8 (spyreccl runs on one node of up to 8 cards), got 0"),
        (["--tp", "9"], "error: --tp must be 1..8 (spyreccl runs on one node of up to 8 cards), got 9"),
        (
            ["--tp", "2", "--model", "minilm"],
            "error: --tp applies to a fresh smollm2 run only (--model minilm runs",
        ),
        (
            ["--tp", "2", "--resume"],
            "error: --tp applies to a fresh smollm2 run only (a tensor-parallel run cannot",
        ),
    ],
)
def test_bad_tp_is_a_one_line_cli_error(tmp_path, args, message):
    from typer.testing import CliRunner

    from models.cli import app

    result = CliRunner().invoke(app, ["demo", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [result.output.strip()] and result.output.startswith(message)
    assert not list(tmp_path.iterdir())  # nothing launched, nothing written


def test_tp_above_the_models_heads_is_a_demo_error():
    from models.demo import DemoError, check_tp

    check_tp(4, tiny.tiny_llama())
    with pytest.raises(
        DemoError, match=r"^--tp 5: tensor-parallel degree 5 is out of range for 4 attention heads"
    ):
        check_tp(5, tiny.tiny_llama())
