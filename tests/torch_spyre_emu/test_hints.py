"""spyre_hint / declare_tensor_dim / name_tensor_dims (torch_spyre._inductor, torch_spyre_api.md §4): the hint API as
the real stack spells it, work_div fixing the work division's split, num_tiles_per_dim running a kernel as a loop
of tiles with unchanged values, names resolved, bad hints refused with a message saying what would work."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.fx as fx

from aiu_sim.ir.program import Kernel
from torch_spyre._inductor import config as inductor_config
from torch_spyre._inductor import declare_tensor_dim, name_tensor_dims, spyre_hint
from torch_spyre_emu import hints
from torch_spyre_emu.compiler import cache
from torch_spyre_emu.compiler.context import CompileOptions
from torch_spyre_emu.compiler.pipeline import compile_fn
from torch_spyre_emu.hints import SpyreHintError

F16 = torch.float16


def meta(*shape):
    return torch.empty(shape, dtype=F16, device="meta")


def kernels(fn, *inputs, **options):
    c = compile_fn(fn, list(inputs), CompileOptions(**options))
    return [k for k in c.program.steps if isinstance(k, Kernel)]


def matmul(c):
    (k,) = [k for k in c if k.op == "matmul"]
    return k


@pytest.fixture(autouse=True)
def _no_declared_names(monkeypatch):
    monkeypatch.setattr(hints, "_declared", {})


def test_the_api_is_torch_spyre_inductor_s():
    import torch_spyre._inductor as ti

    assert (ti.spyre_hint, ti.declare_tensor_dim, ti.name_tensor_dims) == (
        hints.spyre_hint,
        hints.declare_tensor_dim,
        hints.name_tensor_dims,
    )


def test_work_div_fixes_the_split_and_the_other_dims_get_the_rest():
    def f(x, w):
        with spyre_hint(work_div={-1: 2}):
            return x @ w

    free = matmul(kernels(lambda x, w: x @ w, meta(64, 128), meta(128, 256)))
    k = matmul(kernels(f, meta(64, 128), meta(128, 256)))
    assert free.attrs["work_division"] == "matmul_cost_model" and free.split == {"m": 4, "n": 4, "k": 2}
    assert k.attrs["work_division"] == "hint"
    assert k.split == {"n": 2, "m": 16}  # m takes the other 16 cores


def test_positive_keys_index_the_users_result_not_the_bmm_it_became():
    def f(x, w):
        with spyre_hint(work_div={0: 2}):
            return x @ w

    k = matmul(kernels(f, meta(64, 128), meta(128, 256)))
    assert k.split["m"] == 2 and "b" not in k.split


def test_ignore_work_division_hints_drops_them():
    def f(x, w):
        with spyre_hint(work_div={-1: 4}):
            return x @ w

    assert (
        matmul(kernels(f, meta(64, 128), meta(128, 256), ignore_work_division_hints=True)).attrs[
            "work_division"
        ]
        == "matmul_cost_model"
    )
    with inductor_config.patch(ignore_work_division_hints=1):
        assert CompileOptions().ignore_work_division_hints
        assert matmul(kernels(f, meta(64, 128), meta(128, 256))).attrs["work_division"] != "hint"


@pytest.mark.parametrize(
    "hint,match",
    [
        ({-1: 3}, r"work_div=3 does not divide dim n \(256 elements, 4 sticks\).*use one of \[1, 2, 4\]"),
        ({0: 8, -1: 4, 1: 2}, None),  # the last key wins for a dim named twice: not an error
        ({0: 64, -1: 4}, r"needs 256 cores, more than the 32 of sencores"),
        ({2: 2}, r"names dim 2 of a result of rank 2"),
    ],
)
def test_bad_work_div_hints_say_what_would_work(hint, match):
    def f(x, w):
        with spyre_hint(work_div=hint):
            return x @ w

    if match is None:
        assert matmul(kernels(f, meta(64, 128), meta(128, 256))).split["n"] == 2
        return
    with pytest.raises(SpyreHintError, match=match):
        kernels(f, meta(64, 128), meta(128, 256))


def _ops(x, w, v):
    return [
        torch.relu(x) + v,
        torch.softmax(x, -1),
        torch.nn.functional.layer_norm(x, (x.shape[-1],)),
        x.sum(-1),
        x @ w,
    ]


def _tiled(x, w, v):
    with spyre_hint(num_tiles_per_dim={0: 2}):
        a = torch.relu(x) + v
        b = torch.softmax(x, -1)
        c = torch.nn.functional.layer_norm(x, (x.shape[-1],))
        d = x.sum(-1)
    with spyre_hint(num_tiles_per_dim={-1: 2}, work_div={0: 8, -1: 4}):
        e = x @ w
    return [a, b, c, d, e]


def _fixed(x, w, v):
    out = _ops(x, w, v)
    with spyre_hint(work_div={0: 4, -1: 8}):
        out[-1] = x @ w
    return out


def test_tiles_keep_the_values_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    x, w, v = (torch.randn(s, generator=g).to(F16) for s in ((256, 512), (512, 512), (512,)))
    want = torch.compile(_fixed, backend="spyre")(x, w, v)
    torch._dynamo.reset()
    got = torch.compile(_tiled, backend="spyre")(x, w, v)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(a, b), f"output {i}"
    for a, b in zip(got, _ops(x.float(), w.float(), v.float()), strict=True):
        torch.testing.assert_close(a.float(), b, atol=0.15, rtol=0.05)


def test_tiles_are_kernels_of_one_loop_in_one_bundle():
    ks = kernels(_tiled, meta(256, 512), meta(512, 512), meta(512))
    tiles = [k for k in ks if "tile" in k.attrs]
    assert {k.attrs["tile"][1] for k in tiles} == {2}
    loops: dict[str, list[Kernel]] = {}
    for k in tiles:
        loops.setdefault(k.attrs["tile_of"], []).append(k)
    assert all(len(v) == 2 for v in loops.values())
    for loop in loops.values():  # matmul tiles too: the loop is one launch
        assert loop[0].bundle is not None and loop[0].bundle == loop[1].bundle
    # a tile covers half the dim, shifted to its start
    mm = [k for k in tiles if k.op == "matmul"]
    assert [k.space["n"] for k in mm] == [256, 256]
    assert [a.offset for a in mm[1].outputs] == [(0, 0, 256)]
    assert all(k.split == {"m": 8, "n": 4} for k in mm)  # all 32 cores: no K split, as untiled


def test_tiles_must_divide_the_stick_count():
    def f(x):
        with spyre_hint(num_tiles_per_dim={-1: 3}):
            return x.relu()

    with pytest.raises(
        SpyreHintError, match=r"num_tiles_per_dim=3 does not divide dim d1 .*4 sticks.*\[2, 4\]"
    ):
        kernels(f, meta(8, 256))


def test_names_from_named_dims_declarations_and_tensors():
    def f(x, w):
        x = name_tensor_dims(x, ["M", None])
        with spyre_hint(work_div={"M": 2, "N": 4}, num_tiles_per_dim={"S": 2}, named_dims=["S", "N"]):
            return x @ w

    k = [k for k in kernels(f, meta(64, 128), meta(128, 256)) if k.op == "matmul"]
    assert hints.declared_dims() == {"M": 64}
    assert len(k) == 2 and k[0].split["m"] == 2 and k[0].split["n"] == 4  # S is dim 0: tiled on m
    assert k[0].space["m"] == 32

    declare_tensor_dim("hidden", 256)

    def g(x):
        with spyre_hint(work_div={"hidden": 4}):
            return x.relu()

    (k,) = kernels(g, meta(64, 256))
    assert k.split["d1"] == 4


def test_an_undeclared_name_is_an_error():
    def f(x):
        with spyre_hint(work_div={"heads": 4}):
            return x.relu()

    with pytest.raises(SpyreHintError, match="'heads', which nothing declares; list it in named_dims="):
        kernels(f, meta(64, 256))


def test_hint_arguments_are_checked_and_tiles_is_a_deprecated_alias():
    with pytest.raises(SpyreHintError, match="must be an int >= 1"), spyre_hint(work_div={0: 0}):
        pass
    with pytest.raises(SpyreHintError, match="dim index"), spyre_hint(num_tiles_per_dim={1.5: 2}):
        pass
    with pytest.raises(SpyreHintError, match="not both"), spyre_hint(num_tiles_per_dim={0: 2}, tiles={0: 2}):
        pass
    with pytest.raises(SpyreHintError, match="size must be an int"):
        declare_tensor_dim("x", 0)
    with pytest.raises(SpyreHintError, match="2 names for a tensor of rank 1"):
        name_tensor_dims(torch.ones(3), ["a", "b"])
    with pytest.warns(FutureWarning, match="tiles=.*deprecated"), spyre_hint(tiles={0: 2}):
        assert hints.active_hint()["num_tiles_per_dim"] == {0: 2}
    with spyre_hint(work_div={0: 2}), spyre_hint(work_div={1: 4}, named_dims=["a"]):  # nested scopes merge
        assert hints.active_hint() == {
            "num_tiles_per_dim": {},
            "work_div": {0: 2, 1: 4},
            "named_dims": ["a"],
        }
    assert hints.active_hint() is None


def test_plain_torch_compile_on_spyre_tensors_takes_the_hint():
    def f(x, w):
        with spyre_hint(work_div={-1: 4}):
            return x @ w

    x, w = torch.randn(64, 128, dtype=F16), torch.randn(128, 256, dtype=F16)
    torch._dynamo.reset()
    out = torch.compile(f)(x.to("spyre"), w.to("spyre"))
    torch.testing.assert_close(out.cpu().float(), x.float() @ w.float(), atol=0.2, rtol=0.05)


def test_an_eager_op_in_a_scope_is_compiled_with_its_hint():
    from torch_spyre_emu import eager

    x, w = torch.randn(64, 128, dtype=F16).to("spyre"), torch.randn(128, 256, dtype=F16).to("spyre")
    with spyre_hint(work_div={-1: 2}):
        y = x @ w
    z = x @ w
    torch.testing.assert_close(y.cpu(), z.cpu(), atol=0.1, rtol=0.02)
    mm = [(key[-1], c) for key, (c, _) in eager._CACHE.items() if key[0] is torch.ops.aten.mm.default]
    hinted = [matmul(c.program.kernels) for hint, c in mm if "work_div" in hint]
    assert hinted and all(k.attrs["work_division"] == "hint" and k.split["n"] == 2 for k in hinted)


def test_the_compile_cache_key_sees_the_hint():
    graphs: list[fx.GraphModule] = []

    def grab(gm, inputs):
        graphs.append(gm)
        return gm.forward

    def f(x):
        with spyre_hint(work_div={0: 2}):
            return x.relu()

    def g(x):
        return x.relu()

    for fn in (f, g):
        torch._dynamo.reset()
        torch.compile(fn, backend=grab)(torch.randn(4, 64))
    assert graphs[0].code == graphs[1].code
    assert cache.graph_text(graphs[0]) != cache.graph_text(graphs[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "spyre_hint" in cache.graph_text(graphs[0])
