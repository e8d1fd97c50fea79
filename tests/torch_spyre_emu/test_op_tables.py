"""The four op tables agree (issue 9 §1), so that an op marked native with no lowering is found here, not at run time.

- the capability table: torch_spyre_emu/capabilities.py (`capabilities.base()`, the table as shipped);
- the lowering table: compiler/lowering.py LOWERINGS (+ NON_NATIVE_LOWERINGS, MISSING_LOWERINGS);
- capture's keep-whole set: compiler/capture.py KEEP_WHOLE (ops aot must not decompose);
- the decompositions: compiler/passes/decompose.py SPYRE_DECOMPOSITIONS, capture's aot table
  (capture.decomposition_table(): core-aten minus KEEP_WHOLE and off-device ops), the CompositeImplicitAutograd
  kernels torch runs while tracing, and the graph rewrite mm -> bmm (passes/mm_to_bmm.py).

Static checks compare the tables; the traced checks run a small sample of every op that is not lowered directly
through capture and the graph passes, so a decomposition is followed down to the ops that reach codegen.
"""

from __future__ import annotations

import operator
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._decomp import core_aten_decompositions

from torch_spyre_emu.capabilities import STATUSES, capabilities
from torch_spyre_emu.compiler.capture import KEEP_WHOLE, capture, decomposition_table
from torch_spyre_emu.compiler.context import CompileOptions
from torch_spyre_emu.compiler.lowering import (
    LOWERINGS,
    MISSING_LOWERINGS,
    NON_NATIVE_LOWERINGS,
    find_lowering,
)
from torch_spyre_emu.compiler.passes.decompose import SPYRE_DECOMPOSITIONS
from torch_spyre_emu.compiler.passes.support_check import UNSUPPORTED_META
from torch_spyre_emu.compiler.pipeline import run_graph_passes

aten = torch.ops.aten
CAPS = capabilities.base()
REPO = Path(__file__).resolve().parents[2]
# graph passes that rewrite one op into others before codegen (besides the decomposition tables)
GRAPH_REWRITES = {aten.mm: "passes/mm_to_bmm.py (mm -> unsqueeze, bmm, squeeze)"}


def packet_of(key: str):
    import torch._inductor.inductor_prims  # noqa: F401  (defines prims.fma, which dynamo's rewrites emit)

    ns, name = key.split(".")
    return getattr(getattr(torch.ops, ns), name, None)


def overloads(packet) -> list:
    out = []
    for name in packet.overloads():
        try:
            op = getattr(packet, name)
            op.name()  # TorchScript-only overloads (aten.add.t) are not dispatcher ops
        except RuntimeError:
            continue
        out.append(op)
    return out


def is_composite_implicit(op) -> bool:
    try:
        return op.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)
    except RuntimeError:
        return False


def decompositions_of(packet) -> list[str]:
    """The tables that rewrite some overload of `packet` before codegen."""
    routes = []
    if any(op.overloadpacket is packet for op in SPYRE_DECOMPOSITIONS):
        routes.append("decompose.SPYRE_DECOMPOSITIONS")
    if any(op.overloadpacket is packet for op in decomposition_table()):
        routes.append("capture.decomposition_table() (core-aten)")
    if hasattr(packet, "overloads") and any(is_composite_implicit(op) for op in overloads(packet)):
        routes.append("CompositeImplicitAutograd (torch, while tracing)")
    if packet in GRAPH_REWRITES:
        routes.append(GRAPH_REWRITES[packet])
    return routes


def entries(*statuses: str):
    return [e for e in CAPS.ops.values() if e.status in statuses]


# --- the capability table on its own --------------------------------------------------------------------------------
def test_every_capability_key_names_a_real_op():
    """A key that names no op never matches a node: the op it meant silently reads as "unsupported"."""
    missing = [e.name for e in CAPS.ops.values() if packet_of(e.name) is None]
    assert not missing, f"capability table entries that name no torch op (typo?): {missing}"


def test_entries_are_well_formed_for_the_support_check():
    """support_check.classify gates native/decomposed ops by `entry.dtypes`: an empty list would send every use to
    the CPU, and a dtype name torch does not have never matches."""
    problems = []
    for e in CAPS.ops.values():
        if e.status not in STATUSES:
            problems.append(f"{e.name}: status {e.status!r} not in {STATUSES}")
        if e.status in ("native", "decomposed") and not e.dtypes:
            problems.append(f"{e.name} is {e.status} but lists no dtype")
        bad = [d for d in e.dtypes if not isinstance(getattr(torch, d, None), torch.dtype)]
        if bad:
            problems.append(f"{e.name}: dtype names {bad} are not torch dtypes")
    assert not problems, "capability table (capabilities.py _OPS):\n  " + "\n  ".join(problems)


def test_feature_names_in_the_code_are_in_the_table():
    """caps.supports() of a name that is not a feature looks it up as an op and answers False: a renamed feature
    would silently stay off in the support check or keep an adapter from retiring."""
    pattern = re.compile(r"""["']((?:layout|numerics|ops)\.[a-z0-9_]+)["']""")
    unknown = set()
    for folder in ("torch_spyre_emu", "adapters", "models"):
        for path in (REPO / folder).rglob("*.py"):
            for name in pattern.findall(path.read_text()):
                if name not in CAPS.features:
                    unknown.add(f"{name} ({path.relative_to(REPO)})")
    assert not unknown, (
        f"feature names used in code but missing from capabilities._FEATURES: {sorted(unknown)}"
    )


# --- capability table <-> lowerings and decompositions --------------------------------------------------------------
def test_every_lowering_has_a_capability_entry():
    problems = []
    for op in LOWERINGS:
        entry = CAPS.entry(op)
        if entry is None:
            problems.append(f"{op} is in lowering.LOWERINGS but has no entry in the capability table")
        elif entry.status != "native" and op not in NON_NATIVE_LOWERINGS:
            problems.append(
                f"{op} is lowered but {entry.status} in the capability table, and lowering.NON_NATIVE_LOWERINGS "
                "does not say why"
            )
    assert not problems, "\n".join(problems)


def test_native_ops_have_a_lowering_or_a_decomposition():
    problems = []
    for e in entries("native"):
        packet = packet_of(e.name)
        if packet in LOWERINGS or packet in MISSING_LOWERINGS:
            continue
        if not decompositions_of(packet):
            problems.append(
                f"{e.name} is native in the capability table but has no lowering (lowering.LOWERINGS) and no "
                "decomposition (SPYRE_DECOMPOSITIONS, capture's aot table, CompositeImplicitAutograd, graph rewrite)"
            )
    assert not problems, "\n".join(problems)


def test_missing_lowerings_are_native_and_still_missing():
    for op, why in MISSING_LOWERINGS.items():
        entry = CAPS.entry(op)
        assert entry is not None and entry.status == "native", (
            f"lowering.MISSING_LOWERINGS lists {op} ({why}), which is not native in the capability table"
        )
        assert op not in LOWERINGS and not decompositions_of(op), (
            f"{op} is lowered or decomposed now: remove it from lowering.MISSING_LOWERINGS"
        )


def test_decomposed_ops_have_a_decomposition():
    problems = []
    for e in entries("decomposed"):
        packet = packet_of(e.name)
        if decompositions_of(packet):
            continue
        if packet in LOWERINGS and packet in NON_NATIVE_LOWERINGS:
            continue  # the lowering emits the kernels of the stack's decomposition, and says so
        problems.append(
            f"{e.name} is decomposed in the capability table but no decomposition table rewrites it "
            "(SPYRE_DECOMPOSITIONS, capture's aot table, CompositeImplicitAutograd) and no lowering in "
            "lowering.NON_NATIVE_LOWERINGS plays its decomposition"
        )
    assert not problems, "\n".join(problems)


def test_off_device_ops_have_no_lowering_unless_said_why():
    problems = []
    for e in entries("fallback", "unsupported"):
        packet = packet_of(e.name)
        if packet in LOWERINGS and packet not in NON_NATIVE_LOWERINGS:
            problems.append(
                f"{e.name} is {e.status} in the capability table but has a lowering; say why in "
                "lowering.NON_NATIVE_LOWERINGS or drop it"
            )
    for op in NON_NATIVE_LOWERINGS:
        entry = CAPS.entry(op)
        if op not in LOWERINGS:
            problems.append(f"lowering.NON_NATIVE_LOWERINGS explains {op}, which has no lowering")
        elif entry is not None and entry.status == "native":
            problems.append(f"lowering.NON_NATIVE_LOWERINGS explains {op}, which the table calls native")
    assert not problems, "\n".join(problems)


# --- capture's keep-whole set ---------------------------------------------------------------------------------------
def test_keep_whole_ops_have_an_entry_and_a_way_to_run_or_be_reported():
    problems = []
    for packet in KEEP_WHOLE:
        entry = CAPS.entry(packet)
        if entry is None:
            problems.append(f"capture.KEEP_WHOLE keeps {packet} whole, but it has no capability entry")
            continue
        on_device = entry.status in ("native", "decomposed")
        spyre = any(op.overloadpacket is packet for op in SPYRE_DECOMPOSITIONS)
        if on_device and packet not in LOWERINGS and not spyre:
            problems.append(
                f"capture.KEEP_WHOLE keeps {packet} ({entry.status}) whole, but it has neither a lowering "
                "(lowering.LOWERINGS) nor a Spyre decomposition (decompose.SPYRE_DECOMPOSITIONS)"
            )
    assert not problems, "\n".join(problems)


def test_keep_whole_entries_have_an_effect():
    """Removing a packet from the aot table only matters if one of its overloads has a core-aten decomposition that
    is not CompositeImplicitAutograd: torch runs those kernels while tracing, before make_fx consults the table."""
    core = core_aten_decompositions()
    idle = [
        str(packet)
        for packet in KEEP_WHOLE
        if not any(op.overloadpacket is packet and not is_composite_implicit(op) for op in core)
    ]
    assert not idle, (
        f"capture.KEEP_WHOLE entries that change nothing (no table decomposition to skip): {idle}"
    )


# --- traced: decompositions reach lowered ops -----------------------------------------------------------------------
def _t(*shape, dtype=torch.float16):
    return torch.randn(*shape, dtype=dtype)


Q = (1, 2, 5, 64)
# op packet -> [(fn, inputs, capabilities that may send a piece to the host, as the table's notes say)]
SAMPLES = {
    aten.layer_norm: [(lambda x, w, b: F.layer_norm(x, (64,), w, b), (_t(3, 64), _t(64), _t(64)), ())],
    # torch's CompositeImplicitAutograd rms_norm upcasts to fp32: dl16tofp32 and SPYRE_FP32_OPS, all on device
    aten.rms_norm: [(lambda x, w: F.rms_norm(x, (64,), w, 1e-6), (_t(3, 64), _t(64)), ())],
    aten._fused_rms_norm: [(lambda x, w: aten._fused_rms_norm(x, [64], w, 1e-6)[0], (_t(3, 64), _t(64)), ())],
    aten._log_softmax: [(lambda x: torch.log_softmax(x, -1), (_t(3, 64),), ())],
    aten.mm: [(lambda x, y: torch.mm(x, y), (_t(3, 64), _t(64, 70)), ())],
    aten.matmul: [(lambda x, y: torch.matmul(x, y), (_t(2, 3, 64), _t(64, 70)), ())],
    aten.addmm: [
        (lambda b, x, y: torch.addmm(b, x, y, beta=0.5, alpha=2), (_t(70), _t(3, 64), _t(64, 70)), ())
    ],
    aten.linear: [(lambda x, w, b: F.linear(x, w, b), (_t(2, 3, 64), _t(70, 64), _t(70)), ())],
    aten.baddbmm: [
        (lambda b, x, y: torch.baddbmm(b, x, y, alpha=0.5), (_t(2, 3, 70), _t(2, 3, 64), _t(2, 64, 70)), ())
    ],
    aten.scaled_dot_product_attention: [
        (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (_t(*Q),) * 3, ()),
        (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), (_t(*Q),) * 3, ()),
    ],
    aten._scaled_dot_product_fused_attention_overrideable: [
        (
            lambda q, k, v: aten._scaled_dot_product_fused_attention_overrideable(q, k, v, is_causal=True)[0],
            (_t(*Q),) * 3,
            (),
        ),
        (  # a V narrower than Q/K, as MLA's (torch's CPU choice would be its math kernel)
            lambda q, k, v: aten._scaled_dot_product_fused_attention_overrideable(q, k, v)[0],
            (_t(*Q), _t(*Q), _t(*Q[:-1], 32)),
            (),
        ),
    ],
    aten._scaled_dot_product_flash_attention_for_cpu: [
        (lambda q, k, v: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[0], (_t(*Q),) * 3, ())
    ],
    aten._scaled_dot_product_efficient_attention: [
        (
            lambda q, k, v: aten._scaled_dot_product_efficient_attention(q, k, v, None, False)[0],
            (_t(*Q),) * 3,
            (),
        )
    ],
    aten._scaled_dot_product_flash_attention: [
        (
            lambda q, k, v: aten._scaled_dot_product_flash_attention(q, k, v, is_causal=True)[0],
            (_t(*Q),) * 3,
            (),
        )
    ],
    aten.rsub: [
        (lambda x: 1.5 - x, (_t(3, 64),), ()),
        (lambda x, y: torch.rsub(x, y), (_t(3, 64), _t(3, 64)), ()),
    ],
    aten.empty_like: [(lambda x: torch.empty_like(x).fill_(1.0) + x, (_t(3, 64),), ())],
    aten.new_empty: [(lambda x: x.new_empty((3, 64)).fill_(2.0) * x, (_t(3, 64),), ())],
    aten.zero: [(lambda x: x.clone().zero_() + x, (_t(3, 64),), ())],
    # Inductor's decomposition table: full of the size, value and x's dtype
    aten.new_full: [(lambda x: x.new_full((3, 64), 2.0) * x, (_t(3, 64),), ())],
    aten.aminmax: [(lambda x: torch.aminmax(x, dim=-1), (_t(3, 64),), ())],
    aten.repeat: [(lambda x: x.repeat(2, 1, 3), (_t(3, 64),), ())],
    # Inductor's decomposition table (and ATen's eager kernel): unsqueeze each input, then cat
    aten.stack: [
        (lambda x, y: torch.stack([x, y], 0), (_t(3, 64), _t(3, 64)), ()),
        (lambda x, y: torch.stack([x, y], -1), (_t(3, 64), _t(3, 64)), ()),
    ],
    # torch._refs' vector norm (Inductor's): fp32 upcast on device; ords other than 0/1/2/inf end in a pow
    aten.linalg_vector_norm: [
        (
            lambda x: (
                torch.linalg.vector_norm(x, dim=-1)
                + x.norm(p=1, dim=-1)
                + torch.linalg.vector_norm(x, float("inf"), -1)
            ),
            (_t(3, 64),),
            (),
        ),
        (lambda x: torch.linalg.vector_norm(x, 3, -1), (_t(3, 64),), ("aten.pow",)),
        (lambda x: torch.linalg.vector_norm(x, 0, -1), (_t(3, 64),), ("aten.sum",)),  # a sum of bools
    ],
    # conv2d via bmm: im2col on the CPU; a grouped conv stays whole, on the CPU
    aten.convolution: [
        (lambda x, w, b: F.conv2d(x, w, b), (_t(1, 3, 8, 8), _t(64, 3, 3, 3), _t(64)), ("aten.im2col",)),
        (lambda x, w: F.conv2d(x, w, groups=4), (_t(1, 4, 8, 8), _t(4, 1, 3, 3)), ("aten.convolution",)),
    ],
    # Inductor's decompositions: batch norm in inference is fp32 pointwise math on device; the activations' fp32
    # clamp / gt are not on SPYRE_FP32_OPS (the table's notes)
    aten.native_batch_norm: [
        (
            lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False, eps=1e-5),
            (_t(2, 64, 4), _t(64), _t(64).abs() + 0.5, _t(64), _t(64)),
            (),
        )
    ],
    # weight norm (wav2vec2's positional conv): core-aten's decomposition, a vector norm and a scale
    aten._weight_norm_interface: [
        (lambda v, g: aten._weight_norm_interface(v, g, 2)[0], (_t(64, 16, 3), _t(1, 1, 3).abs() + 0.5), ())
    ],
    aten.hardtanh: [(lambda x: F.hardtanh(x, -2.0, 2.0), (_t(3, 64),), ("aten.clamp",))],
    aten.hardsigmoid: [(lambda x: F.hardsigmoid(x), (_t(3, 64),), ("aten.clamp",))],
    aten.hardswish: [(lambda x: F.hardswish(x), (_t(3, 64),), ("aten.clamp",))],
    aten.leaky_relu: [(lambda x: F.leaky_relu(x, 0.1), (_t(3, 64),), ("aten.gt",))],
    # decomposed by the Spyre table for some exponents; the others fall back (the table's note)
    aten.pow: [
        (lambda x: x**2 + x**0.5 + x**-1 + x**3, (_t(3, 64).abs() + 1,), ()),
        (lambda x: 2**x, (_t(3, 64),), ("aten.pow",)),
    ],
}


def test_every_op_that_is_not_lowered_directly_has_a_traced_sample():
    missing = [
        e.name
        for e in entries("native", "decomposed")
        if packet_of(e.name) not in LOWERINGS
        and packet_of(e.name) not in MISSING_LOWERINGS
        and packet_of(e.name) not in SAMPLES
    ]
    assert not missing, f"add a sample to test_op_tables.SAMPLES for (not lowered directly): {missing}"


def _cases():
    for packet, samples in SAMPLES.items():
        for i, sample in enumerate(samples):
            yield pytest.param(packet, *sample, id=f"{packet.__name__}-{i}")


@pytest.mark.parametrize("packet,fn,inputs,host_ok", list(_cases()))
def test_decomposition_reaches_lowered_ops(packet, fn, inputs, host_ok):
    """Every op the graph passes leave on the device has a lowering (else codegen would run it as a CPU island with
    an "emulator gap" warning), and only the capabilities the table's notes name send a piece to the host."""
    options = CompileOptions(name=f"sample_{packet.__name__}", strict=True, collect_only=True, caps=CAPS)
    gm = run_graph_passes(capture(fn, list(inputs)), options)
    problems = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        if node.meta.get("spyre_placement") == "host":
            continue  # reported by the support check; checked against host_ok below
        if find_lowering(node.target) is None:
            problems.append(
                f"{packet} decomposes into {node.target} ({CAPS.status(node.target)}), which the support check "
                "leaves on the device but which has no lowering in lowering.LOWERINGS"
            )
    for u in gm.meta[UNSUPPORTED_META]:
        if u.capability not in host_ok:
            problems.append(
                f"{packet} decomposes into {u.op}, which does not run on the device: {u.describe()}"
            )
    assert not problems, "\n".join(problems)


# --- registration-time checks and the decompositions added for the tables to agree ---------------------------------
def test_a_lowering_of_an_op_without_a_capability_entry_raises_at_registration():
    from torch_spyre_emu.compiler.lowering import lowering
    from torch_spyre_emu.errors import SpyreCompileError

    with pytest.raises(SpyreCompileError, match=r"aten\.round has no entry in the capability table"):
        lowering(aten.round)(lambda b, node, x: x)
    with pytest.raises(SpyreCompileError, match=r"aten\.argmax is 'fallback'.*NON_NATIVE_LOWERINGS"):
        lowering(aten.argmax)(lambda b, node, x: x)
    assert aten.round not in LOWERINGS and aten.argmax not in LOWERINGS


@pytest.mark.parametrize("causal", [False, True])
def test_cuda_sdpa_kernels_compile_to_the_same_math_path_as_sdpa(causal, monkeypatch):
    """A graph traced for CUDA names SDPA's flash / memory-efficient kernels; they decompose into the same math
    path as F.scaled_dot_product_attention, so the device computes the same values."""
    import torch_spyre_emu

    monkeypatch.setattr(torch_spyre_emu.config, "mode", "functional")
    q, k, v = (torch.randn(*Q, dtype=torch.float16) * 0.5 for _ in range(3))

    def flash(q, k, v):
        return aten._scaled_dot_product_flash_attention(q, k, v, is_causal=causal)[0]

    def efficient(q, k, v):
        return aten._scaled_dot_product_efficient_attention(q, k, v, None, False, is_causal=causal)[0]

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    with torch_spyre_emu.strict():  # every piece on the device
        want = torch.compile(sdpa, backend="spyre")(q, k, v)
        for fn in (flash, efficient):
            got = torch.compile(fn, backend="spyre")(q, k, v)
            assert torch.equal(got, want), fn.__name__
