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

Not available (NOT_AVAILABLE says why, and asking for one is a PrecisionError): FP8 x FP8 matmuls (the executor has
batchmatmulfp8's numerics, but the stack lowers no op to it: the fp8 custom ops have no lowering and mm/bmm are
fp16 only), _scaled_mm (not in the stack's op tables), and int8 weights with integer accumulation (the executor
has int8 x int8 -> int32 numerics for hand-built programs; the stack lowers no integer matmul).
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

from aiu_sim.numerics import AccumulationModel, dl16, fp8, get_format


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


# aiu_sim's default chunk: the PT array's K SIMD depth (one fact, one place)
CHUNK = AccumulationModel().chunk_size


def _fp8(fmt: str, gran: str) -> Setting:
    scope = (
        "one scale per tensor" if gran == "tensor" else "one scale per output channel (qfp8ch's arrangement)"
    )
    return Setting(
        f"{fmt}_{gran}", f"decoder Linear weights in {fmt}, {scope}, dequantized to DL16", fmt, gran
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
    )
}
_NO_INT8 = (
    "the stack lowers no integer matmul (mm/bmm are fp16 only; integer formats have native add and mul "
    "only, spyre_hardware.md §5); aiu_sim's executor has int8 x int8 -> int32 numerics for hand-built "
    "programs (docs/numerics.md)"
)
NOT_AVAILABLE: dict[str, str] = {
    "fp8_matmul": "the stack lowers no op to batchmatmulfp8 (FP8 x FP8, 16-bit accumulation, DL16 output): the "
    "fp8 custom ops (qfp8ch, quantize/dequantize_fp8_with_scale) have no lowering and mm/bmm are "
    "fp16 only; aiu_sim's executor has its numerics for hand-built programs (docs/numerics.md)",
    "scaled_mm": "aten._scaled_mm is in none of torch-spyre's op tables (torch_spyre_stack.md §1.7, §3), so the "
    "stack rejects it",
    "int8_tensor": _NO_INT8,
    "int8_channel": _NO_INT8,
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
        f"{CHUNKED_PREFIX}N, {FP32_PREFIX}MODULE[+MODULE...]; not available yet: "
        f"{', '.join(NOT_AVAILABLE)}"
    )


def parse_settings(text: str) -> list[Setting]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise PrecisionError("--settings is empty; give a comma list, e.g. dl16,fp8_e4m3_channel")
    return [setting(n) for n in names]


# ---- FP8 weights -------------------------------------------------------------------------------------------


def fp8_dequantized(weight: torch.Tensor, fmt: str, granularity: str) -> tuple[torch.Tensor, np.ndarray]:
    """(the weight as FP8 codes times its scale, rounded once to DL16, as an fp16 tensor; the scales).

    scale = amax / max_finite(fmt) per tensor, or per output channel (row of the [out, in] weight); an all-zero
    row gets scale 1. Values in the fp16 subnormal range (< 6.1e-5) lose the bits fp16 cannot hold."""
    if granularity not in ("tensor", "channel"):
        raise PrecisionError(f"fp8 granularity must be 'tensor' or 'channel', got {granularity!r}")
    w = weight.detach().float().numpy()
    amax = np.abs(w).max(axis=1, keepdims=True) if granularity == "channel" else np.abs(w).max(keepdims=True)
    scale = np.where(amax > 0, amax / fp8.max_finite(fmt), 1.0).astype(np.float32)
    q = fp8.round(w / scale, fmt)  # the FP8 values; w / scale is within range by construction
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
    of one setting on emulated Spyre. A setting with fp32 islands runs in fallback mode (their non-fp32 ops take the CPU fallback)."""
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
    try:
        compiled = torch.compile(model, backend="spyre", dynamic=False)

        fallbacks: list[str] = []

        def run():
            with (
                torch_spyre_emu.strict(strict),
                torch_spyre_emu.config.use_accumulation(st.accumulation),
                warnings.catch_warnings(record=True) as seen,
            ):
                warnings.simplefilter("always", FallbackWarning)
                try:
                    return torch_spyre_emu.profile(
                        compiled, mode="functional", input_ids=ids, use_cache=False
                    )
                finally:
                    fallbacks.extend(str(w.message) for w in seen if issubclass(w.category, FallbackWarning))
                    for w in seen:  # other warnings as raised
                        if not issubclass(w.category, FallbackWarning):
                            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

        try:
            rep, outs = capture(model, run)
        except Exception as e:  # the model's own failure on the stack: name it and keep the cause
            first = " ".join(str(e).splitlines()[:2])  # the error's headline and its first item
            raise PrecisionError(
                f"{type(model_fp32).__name__} does not run on emulated Spyre under setting {st.name!r}"
                f"{' in strict mode' if strict else ''}: {type(e).__name__}: {first} (adapters.plan(model, inputs) "
                f"lists the gaps)"
            ) from e
        logits = rep.outputs.logits[0].detach().float().cpu()
    finally:
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
        dev_logits, dev_mods, _, islands = device_run(model, st, ids, strict)
        logits[st.name] = dev_logits
        tables.append(module_table(st.name, dev_mods, ref_mods, reference))
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
        "CPU-island ops |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in s.iterrows():
        changed = (
            "none"
            if r.first_changed_token is None or pd.isna(r.first_changed_token)
            else str(int(r.first_changed_token))
        )
        lines.append(
            f"| {name} | {r.logits_rel_rms:.3e} | {r.logits_cosine:.6f} | "
            f"{100 * r.top1_agreement:.1f}% | {changed} | {int(r.cpu_islands)} |"
        )
    worst = result.modules.dropna(subset=["rel_rms"]).sort_values("rel_rms", ascending=False).head(5)
    lines += ["", "Largest module errors:", ""]
    lines += [
        f"- {r.setting}: `{r.module}` ({r.kind}) rel RMS {r.rel_rms:.3e}, max |diff| {r.max_abs:.3g}"
        for r in worst.itertuples()
    ]
    lines += ["", "Not available yet:", ""] + [f"- `{k}`: {v}" for k, v in result.notes.items()]
    table.write_text("\n".join(lines) + "\n")
    doc = {
        "model": model_name,
        "prompt_len": result.prompt_len,
        "tokens": result.tokens,
        "summary": json.loads(s.reset_index().to_json(orient="records")),
        "modules": json.loads(result.modules.to_json(orient="records")),
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
    sts = parse_settings(settings)  # bad names fail before any model loads
    if fp32 is not None:
        sts.append(fp32_islands(fp32.split(",")))
    net, ids = load_model(model, prompt)
    with console.status(f"{model}: reference and {len(sts)} setting(s) on emulated Spyre"):
        result = run_precision(net, ids, sts, new_tokens, strict)
    files = write_outputs(result, out, model)
    console.print(result.summary.drop(columns=["note"]).to_string(float_format=lambda v: f"{v:.4g}"))
    return files
