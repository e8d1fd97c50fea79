"""Precision investigation: where, module by module, the emulated Spyre's numbers leave CPU fp32's.

    result = precision.run_precision(model, input_ids, settings=("dl16", "fp8_e4m3_channel"), new_tokens=8)
    result.modules      # one row per (setting, module): max_abs, rel_rms, DL16 ulps, cosine
    result.summary      # one row per setting: logits error, top-1 agreement, the first greedy token that changes

The reference is the model as given, in fp32 on the CPU. It first generates `new_tokens` greedy tokens; then the
prompt plus those tokens runs once through the reference and once per setting on emulated Spyre (a deep copy in
fp16, the adapters applied, torch.compile(backend="spyre"), strict mode by default, so every number is a device
number), with a forward hook on every module recording its output. Teacher-forced over the reference's own
continuation, the first position where the device's arg-max differs is exactly where its greedy output would first
change: up to there both decode the same prefix.

Settings (SETTINGS, plus the two parametrised forms below):
  * "dl16" is the stack as it is (fp16 weights and activations in DLFloat16, matmuls and sums accumulated in fp32,
    results rounded once).
  * "dl16_acc" and "chunked" run the same programs under another accumulation model
    (torch_spyre_emu.config.accumulation, aiu_sim.numerics.accumulate): every addition of every matmul and sum
    rounded to DL16 (torch-spyre #4232 reports DL16 accumulation for reductions), or DL16 sums over runs of
    chunk_size k's added to a DL16 total (Wang et al. 2018; the chunk defaults to the PT array's K SIMD depth, 8,
    spyre_hardware.md §1/§5). "chunked:N" takes another chunk size (Wang et al. used 64).
  * "fp8_<e4m3|e5m2>_<tensor|channel>" store the weights of every nn.Linear inside the decoder layers in FP8 with a
    per-tensor or per-output-channel fp32 scale (amax / the format's max finite value) and dequantize them to DL16
    before the matmul, the way the stack's dequantize_fp8_with_scale / fp8todl16 ops do (torch_spyre_stack.md §3,
    torch_spyre_api.md §4): a weight-only (W8A16) study. The dequantize runs on the host before upload with the
    device op's arithmetic (fp32 product, one DL16 rounding), so its values are the device's and its time is not
    counted.
  * "fp32:<module>[+<module>...]" (fp32_islands(names)) keeps the named modules in fp32: their weights are the fp32
    model's and their inputs are widened to fp32 and their outputs narrowed back to fp16 at the module boundary
    (the stack's on-device dl16tofp32 / fp32todl16 casts). On the device fp32 runs only for the ops of
    SPYRE_FP32_OPS (torch_spyre_stack.md §3: no matmul); every other op of the module takes the stack's normal CPU
    fallback, so such a setting always runs in fallback mode and the summary counts its CPU islands. It answers
    "does keeping this module in fp32 fix the error?".

Hardware what-ifs (hypothetical=True in every row, table and JSON record; HYPOTHETICAL says why). The June 2026
stack lowers no integer matmul and no op to batchmatmulfp8, but the chip has both units (spyre_hardware.md §1, §5),
so these settings ask what the hardware could do, not what the stack does. The affected nn.Linear modules (those
inside the decoder layers, as for the FP8-weight settings) run their matmul on the host through aiu_sim's functional
executor (a "hardware what-if island": a graph break, like the adapters' host code; aiu_sim.builders.ProgramBuilder
builds the Linear's program for the stack's chip, torch_spyre_emu.config.hardware_config(), with its work division);
the rest of the model runs on emulated Spyre as for "dl16".
  * "int8_<tensor|channel>": int8 weights (symmetric, scale = amax / 127, per tensor or per output channel) and int8
    activations (symmetric, one scale per token: our assumption, mirroring the stack's per-token FP8 quantize op
    quantscalepertokenfp8, spyre_hardware.md §5, and LLM.int8()'s vector-wise / SmoothQuant's per-token choice:
    Dettmers et al. 2022, Xiao et al. 2023); int8 x int8 products summed
    exactly into int32 (the executor's integer matmul, aiu_sim.numerics.accumulate.matmul_int), then one SFP mul by
    the fp32 outer product of the two scales, written as DL16 (W8A8).
  * "fp8_matmul_<e4m3|e5m2>": FP8 weights (one scale per output channel: qfp8ch's arrangement) and FP8 activations
    (one scale per token: quantscalepertokenfp8), the product by the executor's batchmatmulfp8 numerics (16-bit
    accumulation, DL16 output; aiu_sim.numerics.accumulate.fp8_matmul_model), then the same scale mul. Scales map
    each group's amax onto 448 (FP8_MATMUL_AMAX, e4m3's largest value) in both formats: at e5m2's own 57344 the
    16-bit accumulator overflows.
Activations are quantized on the host in fp32 (amax per token, scale = amax / that value, x / scale rounded to the
format): the device's per-token quantize arithmetic is not public. A Linear bias, if any, is added
after the scale (a DL16 add). The island's time is not counted (functional runs only).

Not available (NOT_AVAILABLE says why, and asking for one is a PrecisionError): _scaled_mm (not in the stack's op
tables, so the stack rejects it in every mode).
"""

from __future__ import annotations

import copy
import json
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from aiu_sim.numerics import AccumulationModel, dl16, fp8, get_format, ints


class PrecisionError(ValueError):
    """A precision study was asked for something it cannot do; the message names what and what to do."""


@dataclass(frozen=True)
class Setting:
    name: str
    note: str
    weight_format: str | None = None  # an FP8 format name of aiu_sim.numerics.fp8, or None (DL16 weights)
    granularity: str | None = None  # "tensor" or "channel" (one scale per output channel)
    # torch_spyre_emu.config.accumulation for the device run ("dl16", "chunked", "chunked:N"); None: the default
    accumulation: str | None = None
    fp32_modules: tuple[str, ...] = ()  # modules kept in fp32 (fp32 islands); the run is in fallback mode
    # a hardware what-if matmul: "int8" or an FP8 format name; the decoder Linears' matmuls run in it on the host
    # through aiu_sim's executor (weights at `granularity`, activations per token)
    matmul_format: str | None = None
    hypothetical: str = ""  # non-empty: a hardware what-if, not a stack feature; says why (no stack lowering)

    @property
    def is_hypothetical(self) -> bool:
        return bool(self.hypothetical)


# aiu_sim's default chunk: the PT array's K SIMD depth (one fact, one place)
CHUNK = AccumulationModel().chunk_size


def _fp8(fmt: str, gran: str) -> Setting:
    scope = (
        "one scale per tensor" if gran == "tensor" else "one scale per output channel (qfp8ch's arrangement)"
    )
    return Setting(
        f"{fmt}_{gran}", f"decoder Linear weights in {fmt}, {scope}, dequantized to DL16", fmt, gran
    )


# Why the hardware what-ifs are hypothetical: the June 2026 stack lowers neither (one fact, one place).
NO_INT_LOWERING = (
    "no stack lowering: torch-spyre lowers no integer matmul (mm/bmm are fp16 only, torch_spyre_stack.md §3; "
    "integer formats have native add and mul only, spyre_hardware.md §5); the PT array has int8 (spyre_hardware.md "
    "§1, §5), so this is what the hardware could do"
)
NO_FP8_LOWERING = (
    "no stack lowering: torch-spyre lowers no op to batchmatmulfp8 (the fp8 custom ops qfp8ch and "
    "quantize/dequantize_fp8_with_scale have no lowering and mm/bmm are fp16 only, torch_spyre_stack.md §3, "
    "torch_spyre_api.md §4); batchmatmulfp8 (FP8 x FP8, 16-bit accumulation, DL16 output) is a hardware op "
    "(spyre_hardware.md §5), so this is what the hardware could do"
)
HW_WHATIF = "HARDWARE WHAT-IF"  # the label the summary, the JSON and the command carry


def _int8(gran: str) -> Setting:
    scope = "one scale per tensor" if gran == "tensor" else "one scale per output channel"
    return Setting(
        f"int8_{gran}",
        f"{HW_WHATIF}: decoder Linear weights in int8 ({scope}), activations in int8 (one scale per token), "
        "int8 x int8 summed exactly in int32 by aiu_sim's executor, dequantized to DL16",
        granularity=gran,
        matmul_format="int8",
        hypothetical=NO_INT_LOWERING,
    )


def _fp8_matmul(fmt: str) -> Setting:
    return Setting(
        f"fp8_matmul_{fmt.removeprefix('fp8_')}",
        f"{HW_WHATIF}: decoder Linear weights ({fmt}, one scale per output channel) and activations ({fmt}, one "
        "scale per token) multiplied by aiu_sim's executor as batchmatmulfp8 (16-bit accumulation, DL16 output), "
        "dequantized to DL16",
        granularity="channel",
        matmul_format=fmt,
        hypothetical=NO_FP8_LOWERING,
    )


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting("dl16", "the stack as it is: DLFloat16 weights and activations, fp32 accumulation"),
        Setting(
            "dl16_acc",
            "DLFloat16 accumulation: every addition of every matmul and sum rounded to DL16",
            accumulation="dl16",
        ),
        Setting(
            "chunked",
            f"chunked DL16 accumulation: DL16 sums of {CHUNK} k's added to a DL16 total",
            accumulation="chunked",
        ),
        *(_fp8(f, g) for f in fp8.FORMAT_NAMES for g in ("tensor", "channel")),
        *(_int8(g) for g in ("tensor", "channel")),
        *(_fp8_matmul(f) for f in fp8.FORMAT_NAMES),
    )
}
# the hardware what-if settings and why each is hypothetical
HYPOTHETICAL: dict[str, str] = {n: s.hypothetical for n, s in SETTINGS.items() if s.is_hypothetical}
NOT_AVAILABLE: dict[str, str] = {
    "scaled_mm": "aten._scaled_mm is in none of torch-spyre's op tables (torch_spyre_stack.md §1.7, §3), so the "
    "stack rejects it",
}
FP32_PREFIX = "fp32:"
CHUNKED_PREFIX = "chunked:"


def fp32_islands(modules: Sequence[str]) -> Setting:
    """The setting that keeps `modules` (names of model.named_modules()) in fp32; checked against the model when
    the study runs."""
    names = tuple(dict.fromkeys(m.strip() for m in modules if m.strip()))
    if not names:
        raise PrecisionError("fp32 islands: no module names; give e.g. model.layers.0.mlp")
    return Setting(
        FP32_PREFIX + "+".join(names),
        f"fp32 islands: {', '.join(names)} in fp32 (fallback mode)",
        fp32_modules=names,
    )


def _chunked(text: str) -> Setting:
    size = text.removeprefix(CHUNKED_PREFIX)
    if not size.isdigit() or int(size) < 1:
        raise PrecisionError(
            f"precision setting {text!r}: the chunk size must be a positive integer, e.g. chunked:64"
        )
    return Setting(
        f"chunked:{int(size)}",
        f"chunked DL16 accumulation: DL16 sums of {int(size)} k's added to a DL16 total",
        accumulation=f"chunked:{int(size)}",
    )


LAYER = re.compile(r"\blayers?\.(\d+)\b|\bh\.(\d+)\b|\blayer\.(\d+)\b")
DECODER_LINEAR = re.compile(r"\b(layers?|h)\.\d+\.")


def setting(name: str | Setting) -> Setting:
    if isinstance(name, Setting):
        return name
    if name in SETTINGS:
        return SETTINGS[name]
    if name.startswith(FP32_PREFIX):
        return fp32_islands(name.removeprefix(FP32_PREFIX).split("+"))
    if name.startswith(CHUNKED_PREFIX):
        return _chunked(name)
    if name in NOT_AVAILABLE:
        raise PrecisionError(f"precision setting {name!r} is not available: {NOT_AVAILABLE[name]}")
    raise PrecisionError(
        f"unknown precision setting {name!r}; available: {', '.join(SETTINGS)}, "
        f"{CHUNKED_PREFIX}N, {FP32_PREFIX}MODULE[+MODULE...] ({', '.join(HYPOTHETICAL)} are hardware what-ifs); "
        "not available: "
        f"{', '.join(NOT_AVAILABLE)}"
    )


def parse_settings(text: str) -> list[Setting]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise PrecisionError("--settings is empty; give a comma list, e.g. dl16,fp8_e4m3_channel")
    return [setting(n) for n in names]


# ---- quantization: FP8 weights, and the hardware what-ifs' int8 / FP8 operands --------------------------------

GRANULARITIES = ("tensor", "channel")
INT8_MAX = ints.RANGES["int8"][1]  # 127: symmetric int8 uses -127..127
# FP8 x FP8 operands are scaled so that their amax lands on e4m3's largest value (448, the constant of the stack's
# qfp8ch) in both formats: e5m2's own, 57344, would overflow the 16-bit accumulator (57344**2 is 38% of DLFloat16's
# largest value, 8.6e9, so three full-scale products overflow). Our choice; the device's is not public.
FP8_MATMUL_AMAX = fp8.max_finite("fp8_e4m3")


def quantize_symmetric(
    x: np.ndarray, fmt: str, per_row: bool, qmax: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(x / scale rounded to `fmt`, scale) with scale = amax / qmax (fp32; default qmax: the format's largest
    value), one per row of the 2-D x (a weight's output channel, an activation's token) or one for all; an all-zero
    row gets scale 1.

    fmt "int8": ints.quantize (round half to even, saturate), int8 values; an FP8 name: fp8.round, float32 values
    (x / scale is within range by construction). Scales are [rows, 1] or [1, 1] float32."""
    x = np.asarray(x, dtype=np.float32)
    if qmax is None:
        qmax = INT8_MAX if fmt == "int8" else fp8.max_finite(fmt)
    qmax = np.float32(qmax)
    amax = np.abs(x).max(axis=-1, keepdims=True) if per_row else np.abs(x).max(keepdims=True)
    scale = np.where(amax > 0, amax / qmax, np.float32(1)).astype(np.float32)
    scaled = x / scale  # fp32 division
    return (ints.quantize(scaled, "int8") if fmt == "int8" else fp8.round(scaled, fmt)), scale


def _check_granularity(granularity: str, what: str) -> None:
    if granularity not in GRANULARITIES:
        raise PrecisionError(f"{what} granularity must be 'tensor' or 'channel', got {granularity!r}")


def fp8_dequantized(weight: torch.Tensor, fmt: str, granularity: str) -> tuple[torch.Tensor, np.ndarray]:
    """(the weight as FP8 codes times its scale, rounded once to DL16, as an fp16 tensor; the scales).

    scale = amax / max_finite(fmt) per tensor, or per output channel (row of the [out, in] weight); an all-zero
    row gets scale 1. Values in the fp16 subnormal range (< 6.1e-5) lose the bits fp16 cannot hold."""
    _check_granularity(granularity, "fp8")
    q, scale = quantize_symmetric(weight.detach().float().numpy(), fmt, granularity == "channel")
    deq = dl16.round(q * scale)  # dequantize_fp8_with_scale: fp32 product, one rounding to DL16
    return torch.from_numpy(deq).to(torch.float16), scale


def quantize_linear_weights(
    model: torch.nn.Module, fmt: str, granularity: str, include: Callable[[str], bool] | None = None
) -> list[str]:
    """Replace the weights of the chosen nn.Linear modules (default: those inside decoder layers) in place by their
    FP8-dequantized values; returns the module names."""
    include = include or (lambda name: bool(DECODER_LINEAR.search(name)))
    done = []
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and include(name):
                deq, _ = fp8_dequantized(mod.weight, fmt, granularity)
                mod.weight.copy_(deq.to(mod.weight.dtype))
                done.append(name)
    if not done:
        raise PrecisionError(
            f"{type(model).__name__}: no nn.Linear matched for FP8 weights (decoder layers' "
            f"Linear modules by default; pass include=)"
        )
    return done


# ---- hardware what-if islands: int8 and FP8 x FP8 Linear matmuls through aiu_sim's executor ----------------


def hw_linear_program(fmt: str, m: int, k: int, n: int, bias: bool = False, config=None):
    """The KernelProgram of one what-if Linear, y = (x_q @ w_q) * (s_x s_w) [+ b] for x_q [m, k], w_q [k, n] in
    `fmt` ("int8" or an FP8 name), s_x [m, 1] and s_w [1, n] fp32, b [1, n] DL16, y [m, n] DL16 (host float16).

    One matmul kernel: int8 x int8 into an int32 buffer (the executor's exact integer accumulation), FP8 x FP8 into
    a DL16 buffer (its batchmatmulfp8 numerics, 16-bit accumulation); then SFP muls: the fp32 outer product of the
    scales, the accumulator times it written as DL16 (one rounding after the executor's fp32 / float64 product),
    and a DL16 add of the bias. Work division: aiu_sim's ProgramBuilder policy for `config` (default: the stack's
    chip, torch_spyre_emu.config.hardware_config()), which may split K across cores."""
    from aiu_sim.builders.program_builder import ProgramBuilder

    if fmt != "int8" and fmt not in fp8.FORMAT_NAMES:
        raise PrecisionError(
            f"hardware what-if matmul format must be int8 or one of {fp8.FORMAT_NAMES}, got {fmt!r}"
        )
    if config is None:
        from torch_spyre_emu import config as stack_config

        config = stack_config.hardware_config()
    pb = ProgramBuilder(f"hw_whatif_{fmt}_linear", config)
    mn = {"m": m, "n": n}
    pb.buffer("X", fmt, (m, k))
    pb.buffer("W", fmt, (k, n))
    pb.buffer("C", "int32" if fmt == "int8" else "dl16", (m, n))
    pb.buffer("SX", "fp32", (m, 1))
    pb.buffer("SW", "fp32", (1, n))
    pb.buffer("S", "fp32", (m, n))
    pb.buffer("Y", "dl16", (m, n))
    host_fmt = "int8" if fmt == "int8" else "float32"  # FP8 values travel exactly as float32
    for name in ("X", "W"):
        pb.host_input(name, name, host_fmt)
    for name in ("SX", "SW"):
        pb.host_input(name, name, "float32")
    pb.kernel("matmul", "matmul", [("X", ("m", "k")), ("W", ("k", "n"))], [("C", ("m", "n"))],
              {**mn, "k": k}, reduce_dims=("k",))  # fmt: skip
    pb.kernel(
        "scales", "binary", [("SX", ("m", None)), ("SW", (None, "n"))], [("S", ("m", "n"))], mn, fn="mul"
    )
    pb.kernel(
        "dequantize", "binary", [("C", ("m", "n")), ("S", ("m", "n"))], [("Y", ("m", "n"))], mn, fn="mul"
    )
    out = "Y"
    if bias:
        pb.buffer("B", "dl16", (1, n))
        pb.buffer("Z", "dl16", (m, n))
        pb.host_input("B", "B", "float32")
        pb.kernel(
            "bias", "binary", [("Y", ("m", "n")), ("B", (None, "n"))], [("Z", ("m", "n"))], mn, fn="add"
        )
        out = "Z"
    pb.host_output(out, "y", "float16")
    return pb.build()


class HardwareWhatIfLinear(torch.nn.Module):
    """An nn.Linear whose matmul runs on the host through aiu_sim's functional executor in int8 or FP8 (a hardware
    what-if island: a graph break under torch.compile, like the adapters' host code). The weight is quantized once,
    here, from the Linear's own values (symmetric, per tensor or per output channel); each call quantizes its input
    per token (quantize_symmetric) and runs hw_linear_program."""

    def __init__(self, linear: torch.nn.Linear, fmt: str, granularity: str, config=None):
        super().__init__()
        _check_granularity(granularity, "hardware what-if weight")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.fmt, self.granularity, self.config = fmt, granularity, config
        # the value each scale group's amax lands on
        self.qmax = INT8_MAX if fmt == "int8" else FP8_MATMUL_AMAX
        wq, ws = quantize_symmetric(
            linear.weight.detach().float().cpu().numpy(), fmt, granularity == "channel", self.qmax
        )
        self.weight_q = np.ascontiguousarray(wq.T)  # [in, out]: the matmul's B operand
        self.weight_scale = np.ascontiguousarray(np.broadcast_to(ws.reshape(1, -1), (1, self.out_features)))
        self.bias_values = (
            None if linear.bias is None else linear.bias.detach().float().cpu().numpy().reshape(1, -1).copy()
        )
        self.calls = 0

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, {self.fmt}, "
            f"weights per {self.granularity}, activations per token"
        )

    def operands(self, x: torch.Tensor) -> dict[str, np.ndarray]:
        """The program's host inputs for input x [..., in_features]: x quantized per token, the weight's."""
        x2 = x.detach().to("cpu", torch.float32).reshape(-1, self.in_features).numpy()
        xq, sx = quantize_symmetric(x2, self.fmt, per_row=True, qmax=self.qmax)
        ops = {"X": xq, "W": self.weight_q, "SX": sx, "SW": self.weight_scale}
        if self.bias_values is not None:
            ops["B"] = self.bias_values
        return ops

    @torch.compiler.disable(recursive=True)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from aiu_sim.functional.executor import execute

        ops = self.operands(x)
        m = ops["X"].shape[0]
        prog = hw_linear_program(self.fmt, m, self.in_features, self.out_features, "B" in ops, self.config)
        y = execute(prog, ops)["y"]
        self.calls += 1
        return torch.from_numpy(y).reshape(*x.shape[:-1], self.out_features).to(x.device, x.dtype)


def hw_whatif_linears(
    model: torch.nn.Module, st: Setting, include: Callable[[str], bool] | None = None
) -> list[tuple[str, torch.nn.Module, str, torch.nn.Module]]:
    """Swap the chosen nn.Linear modules (default: those inside decoder layers) of `model` for HardwareWhatIfLinear
    in the setting's matmul format; returns (module name, parent, attribute, original) per swap, for
    restore_linears."""
    include = include or (lambda name: bool(DECODER_LINEAR.search(name)))
    chosen = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and include(n)]
    if not chosen:
        raise PrecisionError(
            f"{type(model).__name__}: no nn.Linear matched for setting {st.name!r} (decoder layers' Linear "
            "modules by default; pass include=)"
        )
    swaps = []
    for name, lin in chosen:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, HardwareWhatIfLinear(lin, st.matmul_format, st.granularity))
        swaps.append((name, parent, attr, lin))
    return swaps


def restore_linears(swaps) -> None:
    for _, parent, attr, original in reversed(swaps):
        setattr(parent, attr, original)


# ---- capture and compare -----------------------------------------------------------------------------------


def capture(model: torch.nn.Module, run: Callable[[], object]) -> tuple[object, dict[str, torch.Tensor]]:
    """run() with a forward hook on every named module recording its (first tensor) output."""
    store: dict[str, torch.Tensor] = {}

    def hook_for(name):
        def hook(_mod, _inp, out):
            t = out[0] if isinstance(out, tuple | list) and out else out
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                store[name] = t

        return hook

    handles = [m.register_forward_hook(hook_for(n)) for n, m in model.named_modules() if n]
    try:
        result = run()
    finally:
        for h in handles:
            h.remove()
    return result, {k: v.detach().to("cpu", torch.float32) for k, v in store.items()}


def error_metrics(x: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """max |x - ref|, ||x - ref|| / ||ref||, |x - ref| in DL16 ulps of ref (median and 99th percentile: the
    maximum is set by reference values near zero, where one ulp is tiny), cosine."""
    a, r = x.double().flatten().numpy(), ref.double().flatten().numpy()
    diff = np.abs(a - r)
    nz = r != 0
    ulp = get_format("dl16").epsilon * np.exp2(np.floor(np.log2(np.abs(r[nz])))) if nz.any() else np.ones(0)
    ulps = diff[nz] / ulp
    norm_r, norm_a = np.linalg.norm(r), np.linalg.norm(a)
    return {
        "max_abs": float(diff.max()) if diff.size else 0.0,
        "rel_rms": float(np.linalg.norm(a - r) / norm_r) if norm_r else float("nan"),
        "ulps_dl16_median": float(np.median(ulps)) if ulps.size else 0.0,
        "ulps_dl16_p99": float(np.percentile(ulps, 99)) if ulps.size else 0.0,
        "cosine": float(a @ r / (norm_a * norm_r)) if norm_a and norm_r else float("nan"),
    }


def layer_of(name: str) -> int:
    m = LAYER.search(name)
    return int(next(g for g in m.groups() if g is not None)) if m else -1


def module_table(setting_name: str, device: dict, reference: dict, model: torch.nn.Module) -> pd.DataFrame:
    kinds = {n: type(m).__name__ for n, m in model.named_modules()}
    rows = []
    for order, (name, ref) in enumerate(reference.items()):
        dev = device.get(name)
        row = {
            "setting": setting_name,
            "order": order,
            "module": name,
            "kind": kinds.get(name, ""),
            "layer": layer_of(name),
            "shape": "x".join(map(str, ref.shape)),
        }
        if dev is None or dev.shape != ref.shape:
            # an adapter padded or replaced the module (head_dim_pad, lm_head_pad), or it ran inside a fused op
            row["note"] = "not comparable: " + (
                "no output on the device run" if dev is None else f"device shape {tuple(dev.shape)}"
            )
        else:
            row.update(error_metrics(dev, ref))
            row["note"] = ""
        rows.append(row)
    return pd.DataFrame(rows)


# ---- the study ---------------------------------------------------------------------------------------------


@dataclass
class PrecisionResult:
    modules: pd.DataFrame
    summary: pd.DataFrame
    logits: dict[str, torch.Tensor]  # "reference" and each setting: [seq, vocab] fp32
    agreement: pd.DataFrame  # per position: 1 where the setting's arg-max matches the reference's
    prompt_len: int
    tokens: list[int]  # the prompt and the reference's greedy continuation
    notes: dict[str, str] = field(default_factory=dict)


def greedy(model: torch.nn.Module, input_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The reference's greedy continuation (CPU, no cache: the models here are small)."""
    ids = input_ids
    with torch.no_grad():
        for _ in range(new_tokens):
            nxt = model(input_ids=ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
    return ids


def cast_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of the model in `dtype`; the original is untouched. HF models go through models.generate.device_copy
    (transformers refuses .half()/.float() on GGUF-loaded models such as SmolLM2)."""
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        from models.generate import device_copy

        return device_copy(model, dtype)
    return copy.deepcopy(model).to(dtype).eval()


def check_modules(model: torch.nn.Module, st: Setting) -> None:
    """Every fp32-island module of `st` is a module of `model`, else a PrecisionError naming it and close names."""
    import difflib

    known = [n for n, _ in model.named_modules() if n]
    for name in st.fp32_modules:
        if name not in known:
            near = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(near)}?" if near else f"e.g. {', '.join(known[:3])}"
            raise PrecisionError(
                f"setting {st.name!r}: {type(model).__name__} has no module {name!r}; {hint} "
                "(names as in model.named_modules())"
            )


def _cast(x, dtype: torch.dtype):
    """Floating tensors in x (nested tuples, lists, dicts) cast to dtype, the rest as it is."""
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if x.is_floating_point() and x.dtype != dtype else x
    if isinstance(x, tuple | list):
        return type(x)(_cast(y, dtype) for y in x)
    if isinstance(x, dict):
        return {k: _cast(v, dtype) for k, v in x.items()}
    return x


def keep_in_fp32(model: torch.nn.Module, reference: torch.nn.Module, names: Sequence[str]) -> None:
    """In the fp16 `model`, replace each named module by the fp32 `reference`'s (fp32 weights), widening its
    floating inputs to fp32 and narrowing its outputs to the model's dtype at the boundary."""
    for name in names:
        island = copy.deepcopy(reference.get_submodule(name)).float()
        island.register_forward_pre_hook(
            lambda _m, args, kwargs: (_cast(args, torch.float32), _cast(kwargs, torch.float32)),
            with_kwargs=True,
        )
        island.register_forward_hook(lambda _m, _inp, out: _cast(out, torch.float16))
        model.set_submodule(name, island)


def device_run(model_fp32: torch.nn.Module, st: Setting, ids: torch.Tensor, strict: bool = True):
    """(logits [seq, vocab] fp32, module outputs, the patched fp16 model, the FallbackWarnings of its CPU islands)
    of one setting on emulated Spyre. A setting with fp32 islands runs in fallback mode (their non-fp32 ops take the
    CPU fallback). A hardware what-if setting swaps the decoder Linears, after the adapters (which may widen them),
    for HardwareWhatIfLinear islands; the returned model has its Linears back, the swaps are in `model.hw_whatif`
    (names)."""
    import adapters
    import torch_spyre_emu
    from torch_spyre_emu.errors import FallbackWarning

    model = cast_copy(model_fp32, torch.float16)
    if st.weight_format:
        quantize_linear_weights(model, st.weight_format, st.granularity)
    if st.fp32_modules:
        check_modules(model, st)
        keep_in_fp32(model, model_fp32, st.fp32_modules)
        strict = False
    handle = adapters.apply(model)
    swaps = []
    try:
        if st.matmul_format:
            swaps = hw_whatif_linears(model, st)
        compiled = torch.compile(model, backend="spyre", dynamic=False)

        fallbacks: list[str] = []

        def run():
            try:
                with (
                    torch_spyre_emu.strict(strict),
                    torch_spyre_emu.config.use_accumulation(st.accumulation),
                    warnings.catch_warnings(record=True) as seen,
                ):
                    warnings.simplefilter("always", FallbackWarning)
                    return torch_spyre_emu.profile(compiled, mode="functional", input_ids=ids, use_cache=False)
            finally:
                fallbacks.extend(str(w.message) for w in seen if issubclass(w.category, FallbackWarning))
                # other warnings as raised, once the recording is over (re-raised inside it, each would be
                # recorded again and this loop would never end)
                for w in seen:
                    if not issubclass(w.category, FallbackWarning):
                        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

        # Graph breaks (a what-if Linear island in every layer) make each layer a resumed frame that dynamo
        # compiles once per module; past its recompile limit (1024 once spyre is registered, as the real stack sets
        # it; 8 in a plain torch) it would run the rest eagerly and the study would
        # no longer compare compiled device numbers. So: a limit for every module, and an error if even that is hit.
        limit = max(torch._dynamo.config.recompile_limit, 2 * sum(1 for _ in model.modules()))
        try:
            with torch._dynamo.config.patch(recompile_limit=limit, fail_on_recompile_limit_hit=True):
                rep, outs = capture(model, run)
        except Exception as e:  # the model's own failure on the stack: name it and keep the cause
            first = " ".join(str(e).splitlines()[:2])  # the error's headline and its first item
            raise PrecisionError(
                f"{type(model_fp32).__name__} does not run on emulated Spyre under setting {st.name!r}"
                f"{' in strict mode' if strict else ''}: {type(e).__name__}: {first} (adapters.plan(model, inputs) "
                f"lists the gaps)"
            ) from e
        if not isinstance(getattr(rep.outputs, "logits", None), torch.Tensor):
            raise PrecisionError(
                f"{type(model_fp32).__name__} returns {type(rep.outputs).__name__}, not an output with .logits: the "
                "precision study compares causal LMs (a HuggingFace *ForCausalLM)"
            )
        logits = rep.outputs.logits[0].detach().float().cpu()
        idle = [name for name, parent, attr, _ in swaps if getattr(parent, attr).calls == 0]
        if idle:  # a swapped Linear the forward never reached: the study would compare something else
            raise PrecisionError(
                f"setting {st.name!r}: hardware what-if Linear(s) never ran: {', '.join(idle)}"
            )
    finally:
        model.hw_whatif = [name for name, *_ in swaps]
        restore_linears(swaps)
        handle.remove()
    return logits, outs, model, sorted(set(fallbacks))


def run_precision(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    settings: Sequence[str | Setting] = ("dl16",),
    new_tokens: int = 8,
    strict: bool = True,
) -> PrecisionResult:
    """Compare each setting with the model in CPU fp32 (see the module docstring). input_ids: [1, prompt]."""
    sts = [setting(s) for s in settings]
    if not sts:
        raise PrecisionError("run_precision: no settings; give at least one of " + ", ".join(SETTINGS))
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise PrecisionError(
            f"run_precision: input_ids must be [1, prompt_len], got {tuple(input_ids.shape)}"
        )
    if not isinstance(new_tokens, int) or new_tokens < 1:
        raise PrecisionError(f"run_precision: new_tokens must be an integer >= 1, got {new_tokens!r}")
    for st in sts:  # bad module names fail before any model runs
        check_modules(model, st)
    reference = cast_copy(model, torch.float32)
    prompt_len = input_ids.shape[1]
    ids = greedy(reference, input_ids, new_tokens)
    with torch.no_grad():
        ref_out, ref_mods = capture(reference, lambda: reference(input_ids=ids, use_cache=False))
    ref_logits = ref_out.logits[0].float()
    ref_top = ref_logits.argmax(-1)
    logits = {"reference": ref_logits}
    tables, rows, agree = [], [], {}
    for st in sts:
        dev_logits, dev_mods, patched, islands = device_run(model, st, ids, strict)
        logits[st.name] = dev_logits
        tables.append(
            module_table(st.name, dev_mods, ref_mods, reference).assign(hypothetical=st.is_hypothetical)
        )
        top = dev_logits.argmax(-1)
        match = (top == ref_top).numpy().astype(int)
        agree[st.name] = match
        generated = match[prompt_len - 1 : -1]  # positions whose arg-max is a generated token
        changed = np.flatnonzero(generated == 0)
        rows.append(
            {
                "setting": st.name,
                "note": st.note,
                **{f"logits_{k}": v for k, v in error_metrics(dev_logits, ref_logits).items()},
                "top1_agreement": float(match.mean()),
                "first_changed_token": int(changed[0]) if changed.size else None,
                "greedy_tokens_compared": int(generated.size),
                "cpu_islands": len(islands),
                "hw_whatif_linears": len(patched.hw_whatif),
                "hypothetical": st.is_hypothetical,
                "hypothetical_note": st.hypothetical,
            }
        )
    return PrecisionResult(
        modules=pd.concat(tables, ignore_index=True),
        summary=pd.DataFrame(rows).set_index("setting"),
        logits=logits,
        agreement=pd.DataFrame(agree),
        prompt_len=prompt_len,
        tokens=ids[0].tolist(),
        notes=dict(NOT_AVAILABLE),
    )


# ---- plots and files ---------------------------------------------------------------------------------------


def layer_errors(result: PrecisionResult, metric: str = "rel_rms") -> pd.DataFrame:
    """metric of each decoder layer's output (rows: layer, columns: setting)."""
    t = result.modules
    layers = t[(t.layer >= 0) & t.module.str.fullmatch(r".*\.\d+") & t[metric].notna()]
    return layers.pivot_table(index="layer", columns="setting", values=metric, sort=False)


def _plt():
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_layer_heatmap(result: PrecisionResult, path=None, metric: str = "rel_rms"):
    plt = _plt()
    m = layer_errors(result, metric)
    fig, ax = plt.subplots(figsize=(1.6 * max(2, m.shape[1]) + 2, 0.35 * max(4, m.shape[0]) + 1.5))
    im = ax.imshow(np.log10(m.to_numpy(dtype=float)), aspect="auto", cmap="viridis")
    ax.set_xticks(range(m.shape[1]), m.columns, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(m.shape[0]), [f"layer {i}" for i in m.index], fontsize=7)
    fig.colorbar(im, ax=ax, label=f"log10 {metric} vs CPU fp32")
    ax.set_title("decoder layer outputs: error by setting", fontsize=9)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def plot_logit_diffs(result: PrecisionResult, path=None):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ref = result.logits["reference"]
    for name, lg in result.logits.items():
        if name != "reference":
            ax.hist((lg - ref).flatten().numpy(), bins=120, histtype="step", label=name, density=True)
    ax.set_yscale("log")
    ax.set_xlabel("device logit - CPU fp32 logit")
    ax.set_ylabel("density")
    ax.set_title("distribution of logit differences (all positions)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def plot_agreement(result: PrecisionResult, path=None):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    positions = np.arange(1, len(result.agreement) + 1)
    for name in result.agreement.columns:
        ax.plot(positions, result.agreement[name].cumsum() / positions, label=name)
    ax.axvline(result.prompt_len, color="grey", ls=":", lw=1, label="end of prompt")
    ax.set_xlabel("position")
    ax.set_ylabel("top-1 agreement up to here")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


@dataclass
class PrecisionFiles:
    table: Path
    json: Path
    plots: dict[str, Path]


def write_outputs(result: PrecisionResult, out, model_name: str = "") -> PrecisionFiles:
    """modules.csv (per module), summary.md (per setting), precision.json (both, and what is not available), PNGs."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plt = _plt()
    result.modules.to_csv(out / "modules.csv", index=False)
    table = out / "summary.md"
    s = result.summary
    lines = [
        f"# Precision: {model_name or 'model'} on emulated Spyre vs CPU fp32",
        "",
        f"{result.prompt_len} prompt tokens, {len(result.tokens) - result.prompt_len} greedy tokens of the "
        "reference, teacher-forced.",
        "",
        "| setting | logits rel RMS | logits cosine | top-1 agreement | first changed greedy token | "
        "CPU-island ops | hypothetical |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in s.iterrows():
        changed = (
            "none"
            if r.first_changed_token is None or pd.isna(r.first_changed_token)
            else str(int(r.first_changed_token))
        )
        lines.append(
            f"| {name} | {r.logits_rel_rms:.3e} | {r.logits_cosine:.6f} | "
            f"{100 * r.top1_agreement:.1f}% | {changed} | {int(r.cpu_islands)} | "
            f"{'yes: ' + HW_WHATIF.lower() if r.hypothetical else 'no'} |"
        )
    hypo = s[s.hypothetical.astype(bool)]
    if len(hypo):
        lines += ["", f"{HW_WHATIF}S (hypothetical=True: not what the stack runs; the decoder Linears' matmuls ran "
                  "through aiu_sim's executor on the host, the rest on emulated Spyre):", ""]  # fmt: skip
        lines += [
            f"- `{name}` ({int(r.hw_whatif_linears)} Linears): {r.hypothetical_note}"
            for name, r in hypo.iterrows()
        ]
    worst = result.modules.dropna(subset=["rel_rms"]).sort_values("rel_rms", ascending=False).head(5)
    lines += ["", "Largest module errors:", ""]
    lines += [
        f"- {r.setting}: `{r.module}` ({r.kind}) rel RMS {r.rel_rms:.3e}, max |diff| {r.max_abs:.3g}"
        for r in worst.itertuples()
    ]
    lines += ["", "Not available:", ""] + [f"- `{k}`: {v}" for k, v in result.notes.items()]
    table.write_text("\n".join(lines) + "\n")
    doc = {
        "model": model_name,
        "prompt_len": result.prompt_len,
        "tokens": result.tokens,
        "summary": json.loads(s.reset_index().to_json(orient="records")),
        "modules": json.loads(result.modules.to_json(orient="records")),
        "hypothetical": {n: r.hypothetical_note for n, r in s.iterrows() if r.hypothetical},
        "not_available": result.notes,
    }
    js = out / "precision.json"
    js.write_text(json.dumps(doc, indent=1))
    plots = {
        "layers": out / "error_by_layer.png",
        "logits": out / "logit_diffs.png",
        "agreement": out / "agreement.png",
    }
    if layer_errors(result).empty:
        del plots["layers"]
    else:
        plt.close(plot_layer_heatmap(result, plots["layers"]))
    plt.close(plot_logit_diffs(result, plots["logits"]))
    plt.close(plot_agreement(result, plots["agreement"]))
    return PrecisionFiles(table, js, plots)


# ---- the command -------------------------------------------------------------------------------------------

MODELS = ("smollm2", "tiny-llama")


def load_model(name: str, prompt: str | None, seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor]:
    """(fp32 model, [1, prompt] ids): SmolLM2-135M-Instruct (real weights, a chat prompt) or the tiny Llama."""
    if name == "smollm2":
        from models import text, weights

        model, tok = weights.load_smollm2()
        return model, text.chat_input_ids(tok, prompt or "What is the capital of France?")
    if name == "tiny-llama":
        from models import tiny

        model = tiny.tiny_llama(seed)
        gen = torch.Generator().manual_seed(seed)
        return model, torch.randint(0, model.config.vocab_size, (1, 32), generator=gen)
    raise PrecisionError(f"unknown --model {name!r}; choose one of: {', '.join(MODELS)}")


def run_command(
    model: str,
    settings: str,
    prompt: str | None,
    new_tokens: int,
    out,
    strict: bool,
    console,
    fp32: str | None = None,
) -> PrecisionFiles:
    """`spyre-emu precision`: `fp32` is a comma list of modules for one more setting, fp32 islands."""
    sts = parse_settings(settings)  # bad names and counts fail before any model loads
    if new_tokens < 1:
        raise PrecisionError(f"--new-tokens must be at least 1, got {new_tokens}")
    if fp32 is not None:
        sts.append(fp32_islands(fp32.split(",")))
    net, ids = load_model(model, prompt)
    with console.status(f"{model}: reference and {len(sts)} setting(s) on emulated Spyre"):
        result = run_precision(net, ids, sts, new_tokens, strict)
    files = write_outputs(result, out, model)
    shown = result.summary.drop(columns=["note", "hypothetical_note"])
    console.print(shown.to_string(float_format=lambda v: f"{v:.4g}"), markup=False, highlight=False)
    for name, r in result.summary[result.summary.hypothetical.astype(bool)].iterrows():
        console.print(
            f"{HW_WHATIF} (hypothetical): {name}: {r.hypothetical_note}", markup=False, highlight=False
        )
    return files
