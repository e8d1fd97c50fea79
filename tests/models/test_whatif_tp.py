"""Tensor-parallel what-if (issue 16 §3): each rank's sharded program plus its blocking collectives, `tp` as a grid
axis beside the HardwareConfig fields, the plot and `spyre-emu whatif --tp`. Timing-only, so full-size shapes are
cheap; the tests check shards, exact identities and relations, not pinned latencies."""

import pandas as pd
import pytest
from typer.testing import CliRunner

import aiu_sim
from aiu_sim.builders import llama_decoder_program
from aiu_sim.config import preset
from aiu_sim.ir.program import Collective
from aiu_sim.timing.interconnect import collective_time
from models import whatif as wi
from models.cli import app

CFG = preset("spyre")
TINY = wi.LLMShape(
    "tiny", layers=2, hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=64, vocab=512
)
TINY_MOE = wi.LLMShape("tiny-moe", 2, 256, 512, 4, 2, 64, 512, experts=4, experts_per_token=2)
# Nothing divides evenly: 12 heads in 4 KV groups, 10 sticks of intermediate, 1000 vocab (15.6 sticks).
ODD = wi.LLMShape(
    "odd", layers=2, hidden=256, intermediate=640, heads=12, kv_heads=4, head_dim=64, vocab=1000
)
LLAMA = wi.LLMS["llama-3.1-8b"]


def _ranks(shape, tp):
    return [wi.shard(shape, tp, r) for r in range(tp)]


def test_uneven_shards_are_the_functional_tp_split_and_cover_the_model():
    from models.tensor_parallel import head_layouts

    ranks = _ranks(ODD, 3)  # 12 q heads in 4 groups over 3 ranks: 4 each; local slots of one group size
    assert [(r.shape.heads, r.shape.kv_heads) for r in ranks] == [(6, 2), (4, 2), (6, 2)]
    for tp in range(2, 9):  # one rule with models.tensor_parallel, which shards real models
        layouts = head_layouts(ODD.heads, ODD.kv_heads, tp)
        ranks = _ranks(ODD, tp)
        assert [(r.shape.heads, r.shape.kv_heads) for r in ranks] == [(len(x.q), len(x.kv)) for x in layouts]
        assert sorted(h for x in layouts for h in x.real_heads) == list(range(ODD.heads))
    ranks = _ranks(ODD, 3)
    # whole 64-element sticks, the remainder on the first ranks
    assert [r.shape.intermediate for r in ranks] == [256, 192, 192]
    assert [r.vocab_range for r in ranks] == [(0, 384), (384, 704), (704, 1000)]
    assert [r.shape.vocab for r in ranks] == [384] * 3  # padded to rank 0's: all_gather takes equal tensors
    ranks = _ranks(ODD, 8)  # more cards than KV heads: every KV head sits on 2 or 3 ranks
    assert all(r.kv_replicas >= 2 for r in ranks) and [r.shape.heads for r in ranks] == [2] * 4 + [1] * 4
    assert wi.shard(ODD, 1).shape is ODD and wi.shard(ODD, 1).vocab_range == (0, 1000)
    r0 = wi.shard(LLAMA, 8)  # 2004 sticks of vocab over 8 cards: 251 on rank 0
    assert (r0.shape.heads, r0.shape.kv_heads, r0.shape.intermediate) == (4, 1, 1792)
    assert r0.vocab_range == (0, 16064) and r0.shape.vocab == 16064
    moe = wi.shard(
        wi.LLMS["mixtral-8x7b"], 4
    ).shape  # every expert's intermediate is sharded, not the experts
    assert (moe.experts, moe.experts_per_token, moe.intermediate) == (8, 2, 3584)


def test_a_rank_program_has_the_sharded_weights_and_the_collectives():
    w = wi.LLMWorkload(ODD, "decode", kv_len=128, batch=2)
    p = w.program(CFG, tp=3, rank=1)
    shapes = {n: b.shape for n, b in p.buffers.items()}
    # rank 1 of 3: q heads 4..7 over KV heads 1 and 2, two each
    assert shapes["l0.wq"] == (256, 2, 2, 64) and shapes["l0.wk"] == (256, 2, 64)
    assert shapes["l0.wo"] == (256, 256) and shapes["l0.k_cache"] == (2, 2, 128, 64)  # row-parallel o_proj
    assert shapes["l0.w_gate"] == (256, 192) and shapes["l0.w_down"] == (192, 256)
    # the vocab shard, padded to rank 0's width; the all-gather stacks the 3 ranks' shards for the host
    assert shapes["lm_head"] == (256, 384) and shapes["logits_shard"] == (2, 1, 384)
    assert shapes["logits"] == (6, 1, 384)
    steps = [(s.name, s.op, s.inputs, s.attrs["world_size"]) for s in p.steps if isinstance(s, Collective)]
    assert steps[:2] == [
        ("l0.attn_all_reduce", "all_reduce", ["o"], 3),
        ("l0.mlp_all_reduce", "all_reduce", ["o"], 3),
    ]
    assert len(steps) == 2 * ODD.layers + 1 and steps[-1][:3] == (
        "logits_all_gather",
        "all_gather",
        ["logits_shard"],
    )
    names = [s.name for s in p.steps]
    assert names.index("l0.attn_all_reduce") == names.index("l0.o_proj") + 1  # before the residual add
    moe = wi.LLMWorkload(TINY_MOE, "decode", kv_len=128).program(CFG, tp=2)
    assert {n: b.shape for n, b in moe.buffers.items()}["l0.e0.w_up"] == (256, 256)
    assert sum(isinstance(s, Collective) for s in moe.steps) == 2 * TINY_MOE.layers + 1
    assert not any(isinstance(s, Collective) for s in w.program(CFG).steps)  # one card: none


@pytest.mark.parametrize("shape", [TINY, TINY_MOE], ids=["dense", "moe"])
def test_tp1_is_the_single_card_number_exactly(shape):
    workloads = wi.llm_workloads(shape, prefill=(128,), decode_kv=(256,), batch=(1, 2))
    old, new = wi.run_whatif(workloads, [{}]), wi.run_whatif(workloads, {"tp": [1]})
    assert list(new.config.unique()) == ["tp=1"] and (new.tp == 1).all() and (new.comm_us == 0).all()
    pd.testing.assert_frame_equal(old.drop(columns="config"), new.drop(columns="config"))
    # ... and the program is the one the builder made before tensor parallelism (no vocab_range).
    m, w = shape, workloads[-1]
    args = dict(
        layers=m.layers,
        hidden=m.hidden,
        heads=m.heads,
        kv_heads=m.kv_heads,
        head_dim=m.head_dim,
        vocab=m.vocab,
        intermediate=m.intermediate,
        batch=w.batch,
        seq=1,
        kv_len=w.kv_len,
        config=CFG,
    )
    if m.moe:
        program = wi.moe_decoder_program(**args, experts=m.experts, experts_per_token=m.experts_per_token)
    else:
        program = llama_decoder_program(**args, logits="last")
    assert aiu_sim.run(program, config=CFG, mode="timing").timing.total_us == new.latency_us.iloc[-1]


def test_comm_is_the_interconnect_model_of_the_steps_bytes_and_adds_to_the_kernels():
    workloads = [wi.LLMWorkload(ODD, "prefill", seq=128, batch=2), wi.LLMWorkload(ODD, "decode", kv_len=256)]
    grid = wi.make_grid(tp=[3], pcie_gbps=[32.0, 64.0], collective_path=["p2p", "host"])
    result = wi.run_whatif(workloads, grid, keep_reports=True)
    for w in workloads:
        for row in result.table[result.table.phase == w.phase].itertuples():
            cfg = CFG.replace(pcie_gbps=row.pcie_gbps, collective_path=row.collective_path)
            hidden = collective_time("all_reduce", w.tokens * ODD.hidden * 2, 3, cfg)
            logits = collective_time("all_gather", w.batch * 384 * 2, 3, cfg)  # rank 0's vocab shard
            assert row.comm_us == pytest.approx(2 * ODD.layers * hidden.total_us + logits.total_us, rel=1e-9)
            assert row.bytes_comm == 2 * ODD.layers * hidden.link_bytes + logits.link_bytes
            assert row.collectives == 2 * ODD.layers + 1
            (report,) = result.reports[(w.name, row.config)]
            steps = sum(s.end_ns - s.start_ns for s in report.steps if s.kind != "collective") / 1e3
            assert row.latency_us == pytest.approx(steps + row.comm_us, rel=1e-9)  # serial: no overlap
            assert row.share_comm == pytest.approx(row.comm_us / row.latency_us)
    t = result.table
    shares = t[[f"share_{c}" for c in wi.BOUND_CLASSES]].sum(axis=1)
    assert ((shares - 1).abs() < 1e-9).all()
    slow, fast = (
        t[(t.phase == "prefill") & (t.collective_path == "p2p") & (t.pcie_gbps == g)].iloc[0]
        for g in (32.0, 64.0)
    )
    assert slow.comm_us > fast.comm_us
    host = t[(t.phase == "prefill") & (t.collective_path == "host") & (t.pcie_gbps == 64.0)].iloc[0]
    assert host.comm_us == pytest.approx(2 * fast.comm_us)  # staged through the host: two crossings


def test_more_cards_cut_a_big_prefills_compute_and_raise_decodes_comm_share():
    """Full-size Llama-3.1-8B: a 2k prefill's per-rank kernel time falls with cards; a decode step's communication
    share rises (its all-reduces are latency-bound while the weights it streams shrink)."""
    workloads = [wi.LLMWorkload(LLAMA, "prefill", seq=2048), wi.LLMWorkload(LLAMA, "decode", kv_len=2048)]
    t = wi.run_whatif(workloads, {"tp": [1, 2, 4, 8]})
    prefill, decode = (t[t.phase == p].sort_values("tp") for p in ("prefill", "decode"))
    chip = (prefill.latency_us - prefill.comm_us).to_numpy()
    assert (chip[1:] < chip[:-1]).all() and (prefill.flops.diff().dropna() < 0).all()
    assert (prefill.latency_us.diff().dropna() < 0).all()
    assert (decode.share_comm.diff().dropna() > 0).all() and decode.share_comm.iloc[0] == 0
    assert (decode.per_token_us == decode.latency_us).all()
    assert (prefill.per_token_us == prefill.latency_us / 2048).all()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: wi.make_grid(tp=[0]), r"tp 0: .* integer 1\.\.8"),
        (lambda: wi.make_grid(tp=[9]), r"tp 9: .*up to 8 cards"),
        (lambda: wi.make_grid(tp=[2.0]), r"tp 2\.0"),
        (lambda: wi.shard(TINY, True), r"tp True"),
        (lambda: wi.shard(TINY, 8), "4 attention heads, so a rank would hold none"),
        (lambda: wi.shard(ODD, 2, rank=2), "rank 2 is not a rank of a 2-card group"),
        (
            lambda: wi.shard(wi.LLMShape("thin", 1, 256, 128, 4, 4, 64, 512), 4),
            "is fewer 64-element sticks than tp",
        ),
        (lambda: wi.run_whatif(wi.FunctionWorkload(abs, name="f"), {"tp": [2]}), "'f' runs on one card"),
        (lambda: wi.apply_overrides(CFG, {"tp": 2}), "split_point separates it"),
    ],
)
def test_bad_tp_is_a_whatif_error_that_says_what_to_do(call, match):
    with pytest.raises(wi.WhatIfError, match=match):
        call()


def test_a_point_that_does_not_build_names_itself():
    with pytest.raises(
        wi.WhatIfError, match=r"prefill b8 seq8192 does not build .* span.*more cards may fit"
    ):
        wi.LLMWorkload(LLAMA, "prefill", seq=8192, batch=8).time(CFG)


def test_keep_going_records_a_point_that_does_not_build(tmp_path):
    w = wi.LLMWorkload(TINY, "prefill", seq=512)
    # 4 KiB: every rank's rmsnorm is over the per-core span
    grid = wi.make_grid(core_span_bytes=[4096, 65536], tp=[1, 2])
    with pytest.raises(
        wi.WhatIfError, match="seq512 does not build for config 'core_span_bytes=4096': kernel"
    ):
        wi.run_whatif(w, grid)
    result = wi.run_whatif(w, grid, keep_reports=True, keep_going=True)
    t = result.table
    failed = t[t.latency_us.isna()]
    assert list(failed.config) == ["core_span_bytes=4096,tp=1", "core_span_bytes=4096,tp=2"]
    assert (failed.bound == "error").all() and failed.error.str.contains("spans 8192 bytes on one core").all()
    assert "seq512 at tp=2 does not build" in failed.error.iloc[1]
    assert t.latency_us.notna().sum() == 2 and len(result.reports) == 2
    files = wi.write_outputs(result, tmp_path, CFG)
    text = files.markdown.read_text()
    assert "| does not build |" in text and "Points that do not build:" in text and "tp=2 " in text


def test_outputs_with_tp_and_a_config_axis(tmp_path):
    grid = wi.make_grid(tp=[1, 2], pcie_gbps=[32.0, 64.0])
    result = wi.run_whatif(wi.llm_workloads(TINY, prefill=(128,), decode_kv=(256,)), grid, keep_reports=True)
    t = result.table
    assert len(t) == 8 and "tp=2,pcie_gbps=32.0" in set(t.config)
    (report,) = result.reports[("tiny decode b1 kv256", "tp=2,pcie_gbps=64.0")]
    assert len(result.reports) == 8 and len(report.collectives) == 2 * TINY.layers + 1
    files = wi.write_outputs(result, tmp_path, CFG)
    assert set(files.plots) == {"latency_tp", "latency_pcie_gbps", "roofline", "breakdown"}
    assert all(p.stat().st_size > 1000 for p in files.plots.values())
    text = files.markdown.read_text()
    assert "Scaling with cards" in text and "tp=2 " in text and "| comm |" in text
    with pytest.raises(wi.WhatIfError, match="does not sweep 'tp'"):
        wi.plot_tp(t[t.tp == 1])


runner = CliRunner()


def test_whatif_command_sweeps_tp(tmp_path):
    out = tmp_path / "wi"
    result = runner.invoke(
        app, ["whatif", "--tp", "1,2", "--prefill", "", "--decode-kv", "1024", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "whatif.csv")
    assert list(table.tp) == [1, 2] and table.comm_us.iloc[1] > 0
    assert (out / "latency_vs_tp.png").stat().st_size > 1000
    args = ["whatif", "--tp", "1", "--set", "core_span_bytes=4096", "--prefill", "", "--decode-kv", "1024"]
    result = runner.invoke(app, [*args, "--out", str(out)])  # the span is too small for any kernel
    assert result.exit_code == 2 and "does not build for config 'core_span_bytes=4096'" in result.output
    result = runner.invoke(app, [*args, "--keep-going", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert pd.read_csv(out / "whatif.csv").bound.tolist() == ["error"]


@pytest.mark.parametrize(
    ("tp", "message"),
    [
        ("0", "--tp: every value must be >= 1"),
        ("9", "tp 9: the tensor-parallel degree"),
        ("two", "--tp: 'two' is not a comma list of integers"),
    ],
)
def test_whatif_command_bad_tp_is_one_line(tp, message):
    result = runner.invoke(app, ["whatif", "--tp", tp])
    assert result.exit_code == 2 and message in result.output
    assert result.output.strip().count("\n") == 0 and "Traceback" not in result.output
