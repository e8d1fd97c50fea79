"""What the emulated torch-spyre stack supports, as data: one table, read by the compiler, adapters and reports.

Every aten op the stack knows about has a status:

- "native":     lowered to device kernels (one or more OpFuncs / custom ops on Spyre).
- "decomposed": rewritten into native ops by the compiler (addmm, linear, SDPA math path, norms, ...).
- "fallback":   runs as a CPU island (copy to host, run there, copy back) with a FallbackWarning; in strict mode
                it raises SpyreUnsupportedOpError instead.
- "unsupported": no device lowering and no CPU island in the real stack either; raises in both modes.

and the torch dtypes it accepts *on the device* (fp16/bf16 are stored as DLFloat16; fp32 only for the ops on
torch-spyre's SPYRE_FP32_OPS list; int64 is narrowed to int32). An op called with another dtype is treated like a
fallback op (CPU island in fallback mode, typed error in strict mode).

The cast table lists the dtype conversions that run on the device (torch-spyre's dtype-op table,
_inductor/dtype_ops.py: identity, dl16tofp32, fp32todl16, fp8todl16); a `.to(dtype)` or a copy between dtypes of
any other pair runs on the CPU (spyre::to_dtype_cpu) with a FallbackWarning.

Named features describe layout/numerics behaviours that adapters patch around (e.g. whether a matmul whose
reduction dim is not a whole number of sticks lowers). Sources: ../shared/reference/torch_spyre_stack.md
(STACK §1.7 op classes, §2 layouts, §3 dtypes and SPYRE_FP32_OPS, §4 gaps); hf_adapters.md for the features.

Usage:
    caps = torch_spyre_emu.capabilities()
    caps.status("aten.sin")            -> "fallback"
    caps.supports("aten.mm")           -> True
    caps.supports("layout.weight_n_not_stick_multiple") -> False
    caps.cast("float16", "float32").opfunc -> "dl16tofp32"    (None: the cast falls back)
    caps.supports("cast.float16->float32") -> True
    with torch_spyre_emu.capabilities.override({"aten.sin": "native", "ops.gelu_erf": True}):
        ...
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

STATUSES = ("native", "decomposed", "fallback", "unsupported")

# Torch dtype names (str(torch.float16) without the "torch." prefix).
F16 = ("float16", "bfloat16")  # stored as DL16 (SEN169_FP16), STACK §3
F32 = ("float32",)
FP = F16 + F32
INT = ("int32", "int64")  # int64 is stored as int32 with a one-time warning, STACK §3
BOOL = ("bool",)  # stored as SEN169_FP16, STACK §3
ALL = FP + INT + BOOL + ("int8", "float8_e4m3fn", "float8_e5m2fnuz")

S17 = "STACK §1.7 (docs user_guide/supported_operations.md, June 2026)"
# Fallbacks torch-spyre registers without a FallbackWarning: "normal_ and random_.from are listed too but do not
# warn" (torch_spyre_api.md §5); uniform_, drawn on the host like them (§1 RNG), is assumed to be silent as well.
SILENT_FALLBACKS = frozenset({"aten.normal", "aten.random", "aten.uniform"})
S3 = "STACK §3 (_inductor/constants.py SPYRE_FP32_OPS)"
S3_CASTS = "STACK §3 on-device casts (_inductor/dtype_ops.py)"
S4 = "STACK §4 known gaps"
SAPI4 = "torch_spyre_api.md §4 (_inductor/customops.py)"
S8 = "torch_spyre_api.md §8 (spyreccl: supported and rejected collectives)"
VIEW = "view op: metadata only on the host side, lowered as a (possibly zero-cost) copy/restickify on device"


@dataclass(frozen=True)
class OpEntry:
    name: str  # "aten.add" (overload packet; all overloads share the entry)
    status: str
    dtypes: tuple[str, ...]
    note: str = ""
    source: str = ""


@dataclass(frozen=True)
class Feature:
    name: str
    supported: bool
    note: str = ""
    source: str = ""


@dataclass(frozen=True)
class Cast:
    """One on-device dtype conversion: torch dtype names and the OpFunc that performs it."""

    src: str
    dst: str
    opfunc: str  # identity | dl16tofp32 | fp32todl16 | fp8todl16 | to_dtype
    note: str = ""
    source: str = ""

    @property
    def name(self) -> str:
        return cast_key(self.src, self.dst)


def cast_key(src: object, dst: object) -> str:
    """The capability key of a cast: "cast.float16->float32" (torch dtypes or their names)."""
    return f"cast.{str(src).removeprefix('torch.')}->{str(dst).removeprefix('torch.')}"


def _casts(srcs, dsts, opfunc: str, note: str = "", source: str = S3_CASTS) -> list[Cast]:
    return [Cast(s, d, opfunc, note, source) for s in srcs for d in dsts if s != d]


def _e(name: str, status: str, dtypes: tuple[str, ...], note: str = "", source: str = S17) -> OpEntry:
    assert status in STATUSES, status
    return OpEntry(f"aten.{name}", status, tuple(dtypes), note, source)


# fp32 is accepted only by ops whose device OpFunc is on SPYRE_FP32_OPS (STACK §3): add, sub, mul, where, realdiv,
# relufwd, reciprocal, mean, sum, max, min, layernormscale, abs, neg, exp, sigmoid, exx2, layernormnorm, identity,
# sqrt, rsqrt, topkvalue, topkindex, floor, to_dtype, maximum, minimum.
_OPS: list[OpEntry] = [
    # --- native pointwise (one SDSC each) ---------------------------------------------------------------------
    _e("add", "native", FP + INT, "fp32: SPYRE_FP32_OPS; int: emulation accepts int32 add", S17),
    _e("sub", "native", FP, "integer sub is a known gap (#1713)"),
    _e("mul", "native", FP + INT),
    _e("div", "native", FP, "truediv -> realdiv; rounding_mode='floor' (floor_divide) is a gap (#4643)"),
    _e("relu", "native", FP),
    _e("sigmoid", "native", FP),
    _e("abs", "native", FP),
    _e("neg", "native", FP),
    _e("exp", "native", FP),
    _e("log", "native", F16, "fp32 log raises Unsupported (#3680)"),
    _e("sqrt", "native", FP),
    _e("rsqrt", "native", FP),
    _e("reciprocal", "native", FP),
    _e("tanh", "native", F16),
    _e("floor", "native", FP),
    _e("square", "native", F16),
    _e("eq", "native", F16 + INT + BOOL, "comparison; result is bool (stored as DL16)"),
    _e("ne", "native", F16 + INT + BOOL, "ne.Scalar falls back in the June table; emulated as native"),
    _e("ge", "native", F16 + INT),
    _e("le", "native", F16 + INT),
    _e("lt", "native", F16 + INT),
    _e("gt", "native", F16 + INT),
    _e(
        "where",
        "native",
        FP + INT + BOOL,
        "dtypes are those of the selected values. The one-argument where(cond) (indices of the true elements, a "
        "data-dependent shape) is a CPU fallback overload, as ops/fallbacks.py registers where.default "
        "(torch_spyre_api.md §5; device.op_dispatch.EAGER_FALLBACK_OVERLOADS); compiled, it breaks the graph",
    ),
    _e("logical_and", "native", BOOL + F16),
    _e("maximum", "native", FP),
    _e("minimum", "native", FP),
    _e(
        "_to_copy",
        "native",
        ALL,
        "to_dtype: the pairs of the cast table (capabilities().casts: dl16tofp32, fp32todl16, fp8todl16, "
        "identity) run on the device; any other pair falls back (int<->float #4643, fp16 -> fp8)",
    ),
    _e("clone", "native", ALL, "identity copy"),
    _e(
        "copy",
        "native",
        ALL,
        "copy_ lowered (PR #490); between dtypes, the cast table decides as for _to_copy",
    ),
    _e("fill", "native", ALL, "constant"),
    _e("full", "native", FP + INT + BOOL, "custom op constant/full"),
    _e("full_like", "native", FP + INT + BOOL, "custom op constant/full"),
    _e("zeros", "native", FP + INT + BOOL, "constant fill"),
    _e("ones", "native", FP + INT + BOOL, "constant fill"),
    _e("zeros_like", "native", FP + INT + BOOL, "constant fill"),
    _e("ones_like", "native", FP + INT + BOOL, "constant fill"),
    _e("new_zeros", "native", FP + INT + BOOL, "constant fill"),
    _e("new_ones", "native", FP + INT + BOOL, "constant fill"),
    _e(
        "scalar_tensor",
        "native",
        FP + INT + BOOL,
        "scalars become 1-element tensors (convert_constant_with_graph_node)",
    ),
    _e("lift_fresh_copy", "native", ALL, "identity"),
    *(
        _e(
            name,
            "native",
            ALL,
            "allocation; modelled as a zero fill (emulation assumption: the real one writes nothing)",
        )
        for name in ("empty", "empty_strided", "empty_permuted")
    ),
    _e("empty_like", "decomposed", ALL, "-> empty_permuted (core-aten)"),
    _e("new_empty", "decomposed", ALL, "-> empty (core-aten)"),
    _e("zero", "decomposed", ALL, "zero_ -> full_like(x, 0): the constant fill"),
    # --- native custom ops (customops.py) ---------------------------------------------------------------------
    _e("gelu", "native", F16, "approximate='tanh' native; exact erf form gated by feature ops.gelu_erf"),
    _e("silu", "native", F16),
    _e("softplus", "native", F16, "custom op; also dispatched as an eager decomposition"),
    _e("clamp", "native", F16),
    _e("clamp_min", "native", F16),
    _e("clamp_max", "native", F16),
    _e("logical_not", "native", BOOL + F16),
    _e("topk", "native", F16 + F32, "only largest=True, sorted=True (PR #3713), 2-D input (topkvalue/topkindex)"),
    _e("native_layer_norm", "native", FP, "custom ops exx2/layernormscale/layernormnorm (fp32 on the list)"),
    _e("layer_norm", "decomposed", FP, "-> native_layer_norm"),
    _e(
        "rms_norm",
        "native",
        F16,
        "custom op rms_norm; torch's own rms_norm upcasts to fp32 (dl16tofp32), whose pieces are on SPYRE_FP32_OPS",
    ),
    _e("_fused_rms_norm", "native", F16, "custom op rms_norm"),
    # --- reductions ---------------------------------------------------------------------------------------------
    _e("sum", "native", FP, "DL16 accumulation (#4232)", S3),
    _e("mean", "native", FP, "DL16 accumulation; may be inaccurate for small fp16 values (#2400)", S3),
    _e("amax", "native", FP, "max", S3),
    _e("amin", "native", FP, "min", S3),
    _e(
        "max",
        "decomposed",
        F16,
        "max.dim -> max reduce + argmax reduce (STACK §1.7 decompositions); max() -> max",
    ),
    _e("min", "decomposed", F16, "min.dim -> min reduce + argmin reduce; min() -> min"),
    _e("aminmax", "decomposed", FP, "-> amin + amax (core-aten)", S3),
    _e(
        "linalg_vector_norm",
        "decomposed",
        FP,
        "Inductor's decomposition (torch._refs): fp16/bf16 upcast to fp32 (dl16tofp32), sum of |x|^ord, ^(1/ord): "
        "ord 2 -> x*x, sum, sqrt; 1 -> abs, sum; inf/-inf -> amax/amin of abs; 0 -> a sum of bools (falls "
        "back: sum takes floats). Other ords: pow falls back. Matrix norms: 'fro' is a vector norm over two dims; 'nuc' and 2 need svd (unsupported)",
    ),
    _e(
        "_softmax", "native", F16, "fused row softmax; ~2e-5 leaks into -inf positions (hf-adapters findings)"
    ),
    _e("_log_softmax", "decomposed", F16, "-> softmax + log"),
    _e(
        "native_batch_norm",
        "decomposed",
        FP,
        "Inductor's decomposition (torch._decomp), inference only: (x - running_mean) * rsqrt(running_var + eps) * "
        "weight + bias in fp32 (dl16tofp32 / fp32todl16 casts). Training mode needs batch statistics, a welford "
        "reduction (UnimplementedOp): unsupported",
    ),
    # unsupported (no lowering, no CPU island), named so the adapters that bridge them declare known capabilities
    _e(
        "native_group_norm",
        "unsupported",
        (),
        "Inductor decomposes it into a var_mean per group: a welford reduction (UnimplementedOp, STACK §1.7); adapter "
        "group_norm re-expresses nn.GroupNorm with two-pass statistics",
    ),
    _e(
        "max_pool2d_with_indices",
        "unsupported",
        (),
        "not in torch-spyre's supported-operations table (Inductor's decomposition ends in its low-memory offset "
        "prims); adapter pooling: -inf pad + im2col + amax",
    ),
    _e("avg_pool2d", "unsupported", (), "not in the supported-operations table; adapter pooling: im2col + mean"),
    _e(
        "_adaptive_avg_pool2d",
        "unsupported",
        (),
        "output 1 decomposes to a mean (core-aten); other sizes: adapter pooling when the windows are even",
    ),
    _e("glu", "unsupported", (), "no Spyre lowering (Inductor lowers glu itself); adapter rewrite: a * sigmoid(b)"),
    _e(
        "masked_scatter",
        "unsupported",
        (),
        "Inductor's decomposition is a cumsum + index gather, with no Spyre lowering; adapter rewrite: where + "
        "embedding of cumsum(mask) - 1",
    ),
    _e(
        "_weight_norm_interface",
        "decomposed",
        FP,
        "core-aten's (and Inductor's) decomposition: v * (g / ||v||), the norm a linalg_vector_norm in fp32",
    ),
    # Inductor's decompositions compute these in fp32 (opmath upcast); clamp and gt are not on SPYRE_FP32_OPS, so
    # those pieces run as CPU islands between on-device casts
    _e("hardtanh", "decomposed", F16, "Inductor's decomposition (torch._refs): clamp in fp32 (a CPU island)"),
    _e("hardsigmoid", "decomposed", F16, "Inductor's decomposition: clamp(x + 3, 0, 6) / 6 in fp32"),
    _e("hardswish", "decomposed", F16, "Inductor's decomposition: x * clamp(x + 3, 0, 6) / 6 in fp32"),
    _e("leaky_relu", "decomposed", F16, "Inductor's decomposition: where(x > 0, x, x * slope) in fp32"),
    _e(
        "_safe_softmax",
        "unsupported",
        (),
        "softmax zeroing fully masked rows, from torch's own SDPA math path (fp32 upcast); torch-spyre lowers SDPA "
        "by its math path with plain softmax, so it is not in the table; kept whole by capture so it is reported "
        "as itself (emulation assumption: no lowering)",
    ),
    # --- matmul -------------------------------------------------------------------------------------------------
    _e(
        "bmm",
        "native",
        F16,
        "batchmatmul on the PT array; K zero-padded to whole sticks (insert_bmm_padding)",
    ),
    _e("mm", "native", F16, "mm_to_bmm_pass: 2-D matmul becomes 3-D bmm"),
    _e("matmul", "decomposed", F16, "-> bmm"),
    _e("addmm", "decomposed", F16, "-> matmul + scale + add"),
    _e("linear", "decomposed", F16, "-> matmul + add (eager decomposition too)"),
    _e("baddbmm", "decomposed", F16, "-> bmm + add"),
    _e("scaled_dot_product_attention", "decomposed", F16, "SDPA -> explicit QK^T.V math path"),
    _e(
        "_scaled_dot_product_fused_attention_overrideable",
        "decomposed",
        F16,
        "SDPA on the device (its _fused_sdp_choice picks this op) -> math path",
    ),
    _e("_scaled_dot_product_flash_attention_for_cpu", "decomposed", F16, "SDPA -> math path"),
    _e("_scaled_dot_product_efficient_attention", "decomposed", F16, "SDPA -> math path"),
    _e("_scaled_dot_product_flash_attention", "decomposed", F16, "SDPA -> math path"),
    # --- decompositions (STACK §1.7) ----------------------------------------------------------------------------
    _e("ceil", "decomposed", F16),
    _e("sign", "decomposed", F16),
    _e("bitwise_not", "decomposed", BOOL, "bool only (logical_not)"),
    _e("bitwise_and", "decomposed", BOOL, "bool only (logical_and)"),
    _e(
        "constant_pad_nd",
        "decomposed",
        F16,
        "a fill and a copy into the window; negative pads crop the source in the same copy (emulation assumption)",
    ),
    _e(
        "repeat",
        "decomposed",
        ALL,
        "-> expand + copy (the view torch's CompositeExplicit kernel copies from; Inductor lowers repeat as one "
        "pointwise read). repeat.out alone is a CPU fallback in eager code, as ops/fallbacks.py registers it "
        "(torch_spyre_api.md §5; device.op_dispatch.EAGER_FALLBACK_OVERLOADS); compiled, it is repeat.default",
    ),
    _e(
        "convolution",
        "decomposed",
        F16,
        "conv2d via bmm, im2col on CPU (STACK §1.7, RFC 1632-v3): 2-D, groups=1, not transposed -> im2col (a CPU "
        "island) + bmm (+ bias add) on device; other convolutions run whole on the CPU",
        S4,
    ),
    _e("cat", "decomposed", FP + INT + BOOL, "copies into windows of one output"),
    # stack is in no June op table, but it never reaches the stack's lowerings: Inductor's decomposition table (as
    # core-aten's) rewrites it to unsqueeze + cat before lowering, and ATen's eager stack kernel calls cat
    _e(
        "stack",
        "decomposed",
        FP + INT + BOOL,
        "unsqueeze + cat (Inductor's and core-aten's decomposition; ATen's eager kernel): inferred from torch's code",
    ),
    # new_full is in no June op table either, and never reaches the lowerings: Inductor's (and core-aten's)
    # decomposition makes it full, a custom op the stack has; eager, its CompositeExplicitAutograd kernel is
    # empty + fill_ on the device
    _e(
        "new_full",
        "decomposed",
        FP + INT + BOOL,
        "full (Inductor's and core-aten's decomposition; eager: empty + fill_): inferred from torch's code",
    ),
    _e(
        "pow",
        "decomposed",
        F16,
        "exponent 2 -> square/mul, 0.5 -> sqrt, -0.5 -> rsqrt, -1 -> reciprocal, 3 -> mul; others fall back",
    ),
    _e("rsub", "decomposed", F16, "-> sub"),
    _e("var_mean", "unsupported", (), "welford reduction -> UnimplementedOp at run time (STACK §1.7)"),
    _e("var", "unsupported", (), "welford reduction -> UnimplementedOp"),
    _e("std", "unsupported", (), "welford reduction -> UnimplementedOp"),
    _e("std_mean", "unsupported", (), "welford reduction -> UnimplementedOp"),
    _e("prod", "unsupported", (), "prod reduction -> UnimplementedOp"),
    # not in the June 2026 supported-operations table, nor a CPU fallback; hf_op_census.md §7 names them as the
    # SSM / linear-attention hybrids' needs (the numeric_forms and rewrite adapters re-express them)
    _e("expm1", "unsupported", (), "not in the supported-operations table (xIELU activations)"),
    _e("log1p", "unsupported", (), "not in the supported-operations table"),
    _e("linalg_solve_triangular", "unsupported", (), "not in the supported-operations table (gated delta nets)"),
    _e("index_select", "unsupported", (), "not in the supported-operations table (a gather by index)"),
    # --- views (metadata; device copies/restickify where layouts differ) ---------------------------------------
    _e("view", "native", ALL, VIEW),
    _e("_unsafe_view", "native", ALL, VIEW),
    _e("reshape", "native", ALL, VIEW),
    _e("permute", "native", ALL, VIEW + "; contiguous() after it fails for fp32 (#1796: layout.restickify_fp32)"),
    _e("transpose", "native", ALL, VIEW + "; contiguous() after it fails for fp32 (#1796: layout.restickify_fp32)"),
    _e("t", "native", ALL, VIEW),
    _e("expand", "native", ALL, "works when followed by a materialising op"),
    _e("unsqueeze", "native", ALL, VIEW),
    _e("squeeze", "native", ALL, VIEW),
    _e("alias", "native", ALL, VIEW),
    _e("select", "native", ALL, VIEW),
    _e("detach", "native", ALL, VIEW),
    _e("slice", "fallback", ALL, "in-graph aten.slice falls back to CPU (RFC 1632-v3)", S4),
    _e("split", "fallback", ALL, "made of slices (RFC 1632-v3)", S4),
    _e("split_with_sizes", "fallback", ALL, "made of slices (RFC 1632-v3)", S4),
    _e("unbind", "native", ALL, "one select view per index (Inductor lowers unbind as views)"),
    _e(
        "unfold",
        "fallback",
        ALL,
        "Tensor.unfold's overlapping windows do not lower (RFC 1632-v3): a CPU island in compiled code, as "
        "spyre::unfold is CPU-backed; eager it is a view (metadata only)",
        S4,
    ),
    _e(
        "im2col",
        "fallback",
        ALL,
        "F.unfold: spyre::unfold is CPU-backed (torch_spyre_api.md §4, FallbackWarning)",
    ),
    *(
        OpEntry(
            f"spyre.{name}",
            "fallback",
            ALL,
            "a CPU-backed custom op: compiled, Inductor calls its eager kernel (an extern fallback), which runs "
            "on the CPU with a FallbackWarning",
            SAPI4,
        )
        for name in (
            "unfold",
            "reshape_via_cpu",
            "to_dtype_cpu",
            "max_dim_int64_fallback",
            "min_dim_int64_fallback",
        )
    ),
    *(
        _e(
            name,
            "native",
            ALL,
            "an in-place op on a view, functionalized: the base copied, the window written (copy_ with a view "
            "destination, PR #2102); on a base of 3 or more dims it fails (#4441; emulation assumption: "
            "unsupported for rank >= 3); step slices fall back",
            S4,
        )
        for name in ("slice_scatter", "select_scatter")
    ),
    # --- CPU fallbacks (ops/fallbacks.py, June table) ----------------------------------------------------------
    _e("embedding", "fallback", ALL, "June table: CPU fallback (made native later by PR #3337)"),
    _e("arange", "fallback", ALL),
    _e("sin", "fallback", ALL, "RoPE: hf-adapters replace it with precomputed rotation matrices"),
    _e("cos", "fallback", ALL),
    _e("tril", "fallback", ALL),
    _e("triu", "fallback", ALL),
    _e("isin", "fallback", ALL),
    _e("bitwise_or", "fallback", ALL),
    _e("bitwise_xor", "fallback", ALL),
    _e("argmax", "fallback", ALL),
    _e("argmin", "fallback", ALL),
    _e("cumsum", "fallback", ALL, "scan is not implemented (spyre_kernel.py)"),
    _e("normal", "fallback", ALL, "normal_ (torch.randn): drawn on the host from torch.spyre's generator"),
    _e("random", "fallback", ALL, "random_: drawn on the host from torch.spyre's generator"),
    _e(
        "uniform",
        "fallback",
        ALL,
        "uniform_ (torch.rand); not in the June table: emulation assumption, a host draw like normal_/random_",
    ),
    *(
        _e(
            name,
            "fallback",
            ALL,
            f"{name} in compiled code: a host draw from torch.spyre's generator, like normal_ "
            "(not in the June table: emulation assumption)",
        )  # fmt: skip
        for name in ("randn", "rand", "randn_like", "rand_like")
    ),
    _e("index_copy", "fallback", ALL, "time proportional to the destination (#4239)"),
    _e("any", "fallback", ALL, "any reduction is an UnimplementedOp; eager falls back"),
    _e("erf", "fallback", ALL, "not an OpFunc; emulation assumption: CPU fallback"),
    # --- gaps (no device lowering, no CPU island) ---------------------------------------------------------------
    _e("gather", "unsupported", (), "no eager kernel; compiled path has open bugs (#4328)", S4),
    _e("index", "unsupported", (), "index.Tensor missing (#3484); boolean indexing does not lower", S4),
    _e(
        "all",
        "unsupported",
        (),
        "'Enable torch.all' is an open op-enablement issue",
        "STACK §4 (op enablement)",
    ),
    _e("isinf", "unsupported", (), "in no June op table: emulation assumption, a gap"),
    _e("isnan", "unsupported", (), "in no June op table: emulation assumption, a gap (as isinf); nan_to_num decomposes to it"),
    _e("isfinite", "unsupported", (), "in no June op table: emulation assumption, a gap"),
    _e("logsumexp", "unsupported", (), "in no June op table: emulation assumption, a gap"),
    _e("index_put", "unsupported", (), "indirect writes (#1880)", S4),
    _e("scatter", "unsupported", (), "indirect writes", S4),
    _e("scatter_add", "unsupported", (), "indirect writes", S4),
    _e("scatter_reduce", "unsupported", (), "indirect writes (as scatter_add; in no June op table)", S4),
    _e("sort", "unsupported", (), "#4072", S4),
    _e("masked_fill", "unsupported", (), "masked_fill_ does not lower (RFC 1632-v3)", S4),
    _e("masked_scatter", "unsupported", (), "RFC 1632-v3", S4),
    _e("nonzero", "unsupported", (), "boolean indexing / data-dependent shape", S4),
    _e("histc", "unsupported", (), "#3982", S4),
    _e("bucketize", "unsupported", (), "in no June op table (a binary search): emulation assumption, a gap"),
    _e("multinomial", "unsupported", (), "in no June op table (a draw by cumulative probability): emulation assumption, a gap"),
    _e(
        "as_strided",
        "unsupported",
        (),
        "in no June op table as a lowering or a CPU island (a view with arbitrary strides has no stick layout): "
        "emulation assumption, a gap in compiled code; eager it is a view (metadata only)",
    ),
    _e("log2", "unsupported", (), "in no June op table, as a lowering or a CPU island: emulation assumption, a gap"),
    _e("acos", "unsupported", (), "in no June op table, as a lowering or a CPU island: emulation assumption, a gap"),
    _e("asinh", "unsupported", (), "in no June op table, as a lowering or a CPU island: emulation assumption, a gap"),
    _e("erfinv", "unsupported", (), "in no June op table, as a lowering or a CPU island: emulation assumption, a gap"),
    # aten.flip is left out of the table on purpose: Inductor decomposes it, so the stack meets prims.rev
    OpEntry("prims.rev", "unsupported", (), "what aten.flip decomposes into; in no June op table: a gap", S17),
    OpEntry(  # dynamo's own rewrites (enable_dynamo_decompositions): Inductor's fused multiply-add prim
        "prims.fma",
        "unsupported",
        (),
        "what dynamo writes for x.addcmul_/addcdiv_(..., value=v), x.add_(y, alpha=<tensor>) and optimizers' "
        "_foreach_lerp_ in compiled code; no fma OpFunc in the June tables: emulation assumption, a gap (eager and "
        "unscaled calls run as mul/div and add)",
        S17,
    ),
    *(
        _e(name, "unsupported", (), "in no June op table (bags of embedding rows): emulation assumption, a gap")
        for name in ("embedding_bag", "_embedding_bag", "_embedding_bag_forward_only")
    ),
    _e(
        "randint",
        "unsupported",
        (),
        "in no June op table (unlike rand/randn, which compiled code draws on the host): emulation assumption, a gap",
    ),
    # what Inductor decomposes reflection / replication pads into (an indexed read, no bounds check): as index
    _e("_unsafe_index", "unsupported", (), "an indexed read (reflect / replicate pads decompose into it): as index"),
    _e("floor_divide", "unsupported", (), "#4643", S4),
    _e("remainder", "unsupported", (), "in no June op table: emulation assumption, a gap (integer division, as floor_divide)"),
    *(
        _e(name, "unsupported", (), "in no June op table, as a lowering or a CPU island: emulation assumption, a gap")
        for name in (
            "upsample_nearest1d",
            "upsample_nearest2d",
            "_upsample_nearest_exact1d",
            "_upsample_nearest_exact2d",
            "upsample_linear1d",
            "upsample_bilinear2d",
            "upsample_bicubic2d",
            "_upsample_bilinear2d_aa",
            "_upsample_bicubic2d_aa",
        )
    ),
    *(
        _e(
            name,
            "unsupported",
            (),
            "recurrent layers: in no June op table, as a lowering or a CPU island (emulation assumption, a gap); "
            "on an accelerator nn.LSTM runs the fused cell, which has no CPU kernel",
        )
        for name in ("lstm", "_thnn_fused_lstm_cell")
    ),
    _e("view_as_real", "unsupported", (), "complex: only type-map entries exist", S4),
    _e("view_as_complex", "unsupported", (), "complex: only type-map entries exist", S4),
    _e("polar", "unsupported", (), "complex", S4),
    _e("complex", "unsupported", (), "complex", S4),
    # --- higher-order ops (control flow and scans kept whole by dynamo; node targets torch.ops.higher_order.*) -----
    *(
        OpEntry(
            f"higher_order.{name}",
            "unsupported",
            (),
            "scan is not implemented (spyre_kernel.py; it is why cumsum falls back), so Inductor cannot generate "
            "the scan kernel: compute the recurrence outside the compiled region or as plain ops (transformers' "
            "Mamba: the sequential path, use_associative_scan=False)",
            "STACK §1.7",
        )
        for name in ("scan", "associative_scan")
    ),
    *(
        OpEntry(
            f"higher_order.{name}",
            "unsupported",
            (),
            "control flow is not in torch-spyre's supported-operations table (emulation assumption: no lowering); "
            "decide the branch or loop on the host, outside the compiled region, and compile the bodies",
            S17,
        )
        for name in ("cond", "while_loop", "map_impl")
    ),
    # --- torch.distributed functional collectives in compiled graphs (node targets torch.ops._c10d_functional.*) ---
    # Each calls one ProcessGroup method, which spyreccl serves or rejects (compiler/collectives.py has the map).
    # The in-place and out= forms (all_reduce_, broadcast_, all_gather_into_tensor_out, ...) are captured as these
    # functional ops plus a copy into their operand (collectives.inplace_as_functional), so these entries decide.
    *(
        OpEntry(f"_c10d_functional.{name}", "native", dtypes, note, S8)
        for name, dtypes, note in (
            (
                "all_reduce",
                F16 + F32 + INT,
                "a Collective all_reduce step (spyreccl allreduce): SUM only, other reduce ops are unsupported; "
                "sums rounded to the device format in the ring order of torch_spyre_emu.distributed.collectives",
            ),
            ("broadcast", ALL, "a Collective broadcast step (spyreccl broadcast) from a rank of the group"),
            ("wait_tensor", ALL, "no step: spyreccl collectives are blocking, so the value is ready"),
        )
    ),
    *(
        OpEntry(
            f"_c10d_functional.{name}",
            "unsupported",
            (),
            f'calls ProcessGroup::{method}, which spyreccl rejects ([SpyreCCL]: The "{method}" operation is not '
            "supported.)" + hint,
            S8,
        )
        for name, method, hint in (
            (
                "all_gather_into_tensor",
                "_allgather_base",
                "; gather eagerly outside the compiled region with dist.all_gather(tensor_list, t)",
            ),
            ("all_gather_into_tensor_coalesced", "allgather_into_tensor_coalesced", ""),
            ("reduce_scatter_tensor", "_reduce_scatter_base", "; all_reduce and slice instead"),
            ("reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_coalesced", ""),
            ("all_to_all_single", "alltoall_base", ""),
            ("all_reduce_coalesced", "allreduce_coalesced", "; all_reduce each tensor"),
        )
    ),
    *(
        OpEntry(
            f"_c10d_functional.{name}",
            "unsupported",
            (),
            "point-to-point inside a compiled graph: the reference does not say spyreccl serves it there "
            "(emulation assumption: not lowered); send and recv eagerly outside the compiled region",
            S8,
        )
        for name in ("isend", "irecv", "batch_p2p_ops")
    ),
]

_FEATURES: list[Feature] = [
    Feature(
        "dtype.float64",
        False,
        "float64 has no Spyre device format (the dtype -> DataFormats map gives INVALID): a float64 tensor cannot "
        "reach the device, nor a 0-d float64 constant a compiled graph folds (dynamo traces NumPy scalar math as "
        "float64 tensors).",
        "torch_spyre_api.md §2 (f64, complex -> INVALID)",
    ),
    Feature(
        "layout.head_dim_not_stick_multiple",
        False,
        "A bmm whose reduction dim (K) or output stick dim is not a whole number of sticks (64 fp16) is rejected "
        "inside attention (QK^T / PV with head_dim % 64 != 0); hf-adapters pad heads (sub-stick stickify assert, "
        "'stick-misaligned K dim in matmul aborts'). Emulation assumption: the check applies to every bmm whose "
        "operands are both activations (no weight operand), i.e. attention bmms.",
        "hf_adapters.md §2 (head_dim/2 < 64 stickify assert; misaligned K aborts)",
    ),
    Feature(
        "layout.restickify_fp32",
        False,
        "contiguous() of a transposed fp32 tensor (x.t().contiguous(), or a reshape torch makes through it): the "
        "stack restickifies it with ReStickifyOpHBM, which has no fp32 variant, so the compile fails (an open bug in "
        "June 2026). fp16/bf16 restickify as usual. Views keep their base's layout in eager code too, so it fails "
        "eagerly as well. Other fp32 restickifies (operands on two stick dims) are not modelled as failures.",
        "STACK §4 (views: contiguous() after transpose fails for fp32, #1796)",
    ),
    Feature(
        "layout.weight_n_not_stick_multiple",
        False,
        "A weight matmul (one operand a parameter) whose N (output stick dim) is not a whole number of sticks is "
        "rejected: the LM head over a vocab such as GPT-2's 50257, but also an MLP projection of a ragged "
        "intermediate size. hf-adapters pad the LM head (pad_lm_head; here adapters/lm_head_pad.py, which bridges "
        "the LM head only; adapters/linear_split.py splits any other nn.Linear at its last whole stick). Emulation assumption: only N >= 1000 is "
        "checked, smaller outputs are padded in-stick as usual. Independently, work division raises when no split "
        "keeps every core under the 256 MiB span (the real EAR failure).",
        "hf_adapters.md §2 (pad_lm_head)",
    ),
    Feature(
        "shape.data_dependent",
        False,
        "A size or shape read from a tensor's value inside a graph (aten._local_scalar_dense: F.pad amounts or an "
        "interpolate size held in tensors): kernels are compiled for static shapes, so the value must be a Python "
        "int on the host before the graph is traced.",
        "STACK §4 (kernels compiled for static shapes)",
    ),
    Feature(
        "ops.gelu_erf",
        False,
        "The gelu custom op implements the tanh approximation; aten.gelu(approximate='none') (erf form) is not "
        "native. Emulation assumption: it falls back to CPU.",
        "STACK §1.7 customops gelu; emulation assumption",
    ),
]


# The dtype conversions that run on the device; any other pair of dtypes falls back (CPU island, spyre::to_dtype_cpu).
# Why a table of pairs: the real stack picks the cast's OpFunc from (source, destination) in _inductor/dtype_ops.py.
_INTS = ("int8", "int16", "int32", "int64", "uint8")
_CASTS: list[Cast] = [
    *_casts(("float16",), ("bfloat16", "bool"), "identity", "same storage (SEN169_FP16)"),
    *_casts(("bfloat16", "bool"), ("float16",), "identity", "same storage (SEN169_FP16)"),
    *_casts(
        F16,
        F32,
        "dl16tofp32",
        "widening: exact; staggers the elements in the stick (RFC 2971), values only here",
    ),
    *_casts(F32, F16, "fp32todl16", "rounds to DL16 (bf16: then to the host's bf16 on the way out)"),
    *_casts(("float8_e4m3fn",), ("float16",), "fp8todl16", "exact (every e4m3 value is a DL16 value)"),
    # Not in the digest's table but on the device before it was written down; kept as emulation assumptions.
    *_casts(
        ("bfloat16", "bool"),
        ("bfloat16", "bool"),
        "identity",
        "same storage (SEN169_FP16)",
        "emulation assumption",
    ),
    *_casts(("bool",), F32, "dl16tofp32", "bool is stored as DL16", "emulation assumption"),
    *_casts(F32, ("bool",), "fp32todl16", "x != 0 into DL16 storage", "emulation assumption"),
    *_casts(
        _INTS + BOOL,
        _INTS + BOOL,
        "to_dtype",
        "integer formats and bool among themselves (int64 is int32 on device)",
        "emulation assumption",
    ),
]


# content_key: one number per distinct table contents, handed out once and never reused
_CONTENT_KEYS: dict[tuple, int] = {}
_next_content_key = itertools.count()
_content_keys_lock = threading.Lock()


class Capabilities:
    """An immutable snapshot of the capability table (ops and features)."""

    def __init__(
        self, ops: Mapping[str, OpEntry], features: Mapping[str, Feature], casts: Mapping[str, Cast] = {}
    ):
        self.ops: dict[str, OpEntry] = dict(ops)
        self.features: dict[str, Feature] = dict(features)
        self.casts: dict[str, Cast] = dict(casts)  # cast_key -> Cast, the on-device conversions only

    @property
    def contents(self) -> tuple:
        """Everything the table says, sorted (what caches key on)."""
        return tuple(tuple(sorted(t.items())) for t in (self.ops, self.features, self.casts))

    @functools.cached_property
    def content_key(self) -> int:
        """What compile caches key on: equal for snapshots with equal contents (an override entered again reuses
        its programs), different otherwise, and never reused, unlike id() of a snapshot, which a later override can
        take over once this one is gone."""
        contents = self.contents
        with _content_keys_lock:
            if contents not in _CONTENT_KEYS:
                _CONTENT_KEYS[contents] = next(_next_content_key)
            return _CONTENT_KEYS[contents]

    # -- lookups -------------------------------------------------------------------------------------------------
    @staticmethod
    def op_key(op: object) -> str:
        """Normalise an op (OpOverload, OpOverloadPacket, "aten.add.Tensor", "add") to the table key "aten.add".

        torch's functional twin of an in-place op that has no functional overload shares the op's entry:
        aten.normal_functional (what functionalization makes of normal_, e.g. torch.randn) -> "aten.normal"."""
        if not isinstance(op, str):
            packet = getattr(op, "overloadpacket", op)
            name = getattr(packet, "__name__", None) or str(packet)
            qualified = getattr(packet, "_qualified_op_name", None)
            # higher-order ops (torch.cond, scan, ...) have no qualified name, only a namespace ("higher_order")
            ns = qualified.split("::")[0] if qualified else getattr(packet, "namespace", "aten")
            return f"{ns}.{name.split('.')[0].removesuffix('_functional')}"
        name = op.replace("::", ".")
        if not name.startswith(("aten.", "prims.", "spyre.")) and "." not in name.split("/")[-1]:
            name = "aten." + name
        ns, packet = name.split(".")[:2]
        return f"{ns}.{packet.removesuffix('_functional')}"

    def entry(self, op: object) -> OpEntry | None:
        return self.ops.get(self.op_key(op))

    def cast(self, src: object, dst: object) -> Cast | None:
        """The on-device cast from dtype `src` to `dst` (torch dtypes or names), None if it falls back."""
        if str(src) == str(dst):
            return Cast(
                str(src).removeprefix("torch."), str(dst).removeprefix("torch."), "identity", "same dtype"
            )
        return self.casts.get(cast_key(src, dst))

    def status(self, name: object) -> str:
        """Op status ("native" | "decomposed" | "fallback" | "unsupported"), for a feature "native"/"unsupported",
        for a cast key "native"/"fallback". Ops absent from the table are "unsupported" (the real stack has no
        lowering for them either)."""
        if isinstance(name, str) and name in self.features:
            return "native" if self.features[name].supported else "unsupported"
        if isinstance(name, str) and name.startswith("cast."):
            return "native" if name in self.casts else "fallback"
        e = self.entry(name)
        return e.status if e is not None else "unsupported"

    def supports(self, name: object, dtype: str | None = None) -> bool:
        """True if the feature is on, the cast ("cast.float16->float32") runs on the device, or the op runs on the
        device (native or decomposed) [for `dtype`]."""
        if isinstance(name, str) and name in self.features:
            return self.features[name].supported
        if isinstance(name, str) and name.startswith("cast."):
            return name in self.casts
        e = self.entry(name)
        if e is None or e.status not in ("native", "decomposed"):
            return False
        return dtype is None or dtype.replace("torch.", "") in e.dtypes

    def to_dataframe(self):
        import pandas as pd

        rows = [
            {
                "name": e.name,
                "kind": "op",
                "status": e.status,
                "dtypes": ",".join(e.dtypes),
                "note": e.note,
                "source": e.source,
            }
            for e in self.ops.values()
        ]
        rows += [
            {
                "name": f.name,
                "kind": "feature",
                "status": "native" if f.supported else "unsupported",
                "dtypes": "",
                "note": f.note,
                "source": f.source,
            }
            for f in self.features.values()
        ]
        rows += [
            {
                "name": c.name,
                "kind": "cast",
                "status": "native",
                "dtypes": f"{c.src}->{c.dst}",
                "note": f"{c.opfunc}: {c.note}" if c.note else c.opfunc,
                "source": c.source,
            }
            for c in self.casts.values()
        ]
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        counts = {s: sum(e.status == s for e in self.ops.values()) for s in STATUSES}
        on = [f.name for f in self.features.values() if f.supported]
        return f"Capabilities({len(self.ops)} ops {counts}, {len(self.casts)} on-device casts, features on: {on})"


_BASE = Capabilities({e.name: e for e in _OPS}, {f.name: f for f in _FEATURES}, {c.name: c for c in _CASTS})


class _CapabilitiesAccessor:
    """`torch_spyre_emu.capabilities()` returns the current table; `.override({...})` changes it temporarily."""

    def __init__(self) -> None:
        self._stack: list[Capabilities] = [_BASE]

    def __call__(self) -> Capabilities:
        return self._stack[-1]

    def base(self) -> Capabilities:
        """The table as shipped, without any override (what registration-time checks compare against)."""
        return _BASE

    @contextlib.contextmanager
    def override(self, changes: Mapping[str, object]) -> Iterator[Capabilities]:
        """Temporarily change entries. Keys are feature names (value: bool), cast keys ("cast.float16->float32",
        value: bool, on the device or not) or op names (value: a status string, or a dict of OpEntry fields, e.g.
        {"status": "native", "dtypes": ("float16",)})."""
        cur = self._stack[-1]
        ops, feats, casts = dict(cur.ops), dict(cur.features), dict(cur.casts)
        for key, value in changes.items():
            if key.startswith("cast."):
                src, _, dst = key.removeprefix("cast.").partition("->")
                if not {src, dst} <= set(ALL + _INTS):
                    raise KeyError(
                        f"capabilities.override: cast key {key!r} is not 'cast.<dtype>-><dtype>' with dtypes of "
                        f"{sorted(set(ALL + _INTS))}"
                    )
                if not isinstance(value, bool):
                    raise TypeError(f"capabilities.override: cast {key!r} takes a bool, got {value!r}")
                if value:
                    casts[key] = cur.casts.get(key) or Cast(src, dst, "to_dtype", "capabilities.override")
                else:
                    casts.pop(key, None)
                continue
            if key in feats:
                if not isinstance(value, bool):
                    raise TypeError(f"capabilities.override: feature {key!r} takes a bool, got {value!r}")
                feats[key] = replace(feats[key], supported=value)
                continue
            if "." in key and key.split(".")[0] in ("layout", "numerics", "ops"):
                raise KeyError(f"capabilities.override: unknown feature {key!r}; known: {sorted(feats)}")
            name = cur.op_key(key)
            old = ops.get(name) or OpEntry(name, "unsupported", ALL)
            if isinstance(value, str):
                if value not in STATUSES:
                    raise ValueError(f"capabilities.override: status {value!r} for {name} not in {STATUSES}")
                new = replace(old, status=value, dtypes=old.dtypes or (F16 if value != "unsupported" else ()))
            elif isinstance(value, Mapping):
                new = replace(old, **{k: (tuple(v) if k == "dtypes" else v) for k, v in value.items()})
            else:
                raise TypeError(
                    f"capabilities.override: op {name} takes a status string or a dict, got {value!r}"
                )
            ops[name] = new
        snap = Capabilities(ops, feats, casts)
        self._stack.append(snap)
        try:
            yield snap
        finally:
            self._stack.remove(snap)

    # Convenience pass-throughs so `torch_spyre_emu.capabilities.supports(...)` also works.
    def supports(self, name: object, dtype: str | None = None) -> bool:
        return self().supports(name, dtype)

    def status(self, name: object) -> str:
        return self().status(name)


capabilities = _CapabilitiesAccessor()
override_capabilities = capabilities.override
