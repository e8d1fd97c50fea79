"""One model's plan (`spyre-emu plan MODEL`, issue 10 §4): what the stack cannot lower yet and where, which adapters
bridge what, which gaps nothing bridges, and the strict-mode result, as a versioned JSON document (docs/zoo.md,
"spyre-emu plan").

MODEL is a zoo model type (models.zoo.build), a local directory with a config.json (random weights from the config,
offline), or a registered real-weight model (models.weights: smollm2, minilm). Everything runs in the calling
process; a MODEL that names none of these is a PlanInputError.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

PLAN_FORMAT = "spyre-emu.plan"
PLAN_VERSION = 1
REGISTERED = ("smollm2", "minilm")  # models.weights' real-weight models (as `spyre-emu demo --model`)


class PlanInputError(ValueError):
    """MODEL names no zoo model type, readable config directory or registered model (the message says which)."""


@dataclass
class Target:
    spec: str  # MODEL as given
    source: str  # "zoo" | "config_dir" | "registered"
    model: torch.nn.Module  # eval(); fp32 (zoo, config_dir) or already fp16 (registered)
    inputs: dict
    meta: dict = field(default_factory=dict)


def resolve(spec: str, variant: str = "default", seed: int = 0) -> Target:
    """The model MODEL names, with its dummy inputs (models.zoo.inputs: a batch of two, padded attention_mask)."""
    from models.zoo import catalog

    path = Path(spec)
    if path.is_dir():
        return _from_config_dir(spec, path, variant, seed)
    if spec in REGISTERED:
        return _registered(spec, seed)
    if spec in catalog.model_types():
        return _from_zoo(spec, variant, seed)
    if path.exists():
        raise PlanInputError(f"{spec!r} is a file; give the directory that holds config.json")
    raise PlanInputError(
        f"unknown model {spec!r}: not a model type of the installed transformers (models.zoo.model_types()), "
        f"not a directory with a config.json, nor a registered model ({', '.join(REGISTERED)})"
    )


def _from_zoo(model_type: str, variant: str, seed: int) -> Target:
    from models.zoo.recipes import build

    zm = build(model_type, variant, seed)  # ZooBuildError: the model type builds on no recipe level
    meta = {"name": model_type, "model_type": model_type, "variant": variant, **zm.metadata()}
    return Target(model_type, "zoo", zm.model, zm.inputs, meta)


def _from_config_dir(spec: str, path: Path, variant: str, seed: int) -> Target:
    from transformers import AutoConfig

    from models.zoo import recipes
    from models.zoo.inputs import make_inputs

    if not (path / "config.json").is_file():
        raise PlanInputError(f"{spec!r} has no config.json")
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PlanInputError(f"cannot read {path / 'config.json'}: {first}") from None
    try:
        cls, task, is_lm = recipes._model_class(config.model_type, config)
    except recipes.ZooBuildError as e:
        raise PlanInputError(f"{path / 'config.json'}: {e.reason}") from None
    model = recipes._seeded(cls, config, seed)
    family = recipes._family(config.model_type, config, is_lm)
    causal = is_lm or family in ("decoder", "moe_decoder", "ssm", "hybrid")
    inputs, modality, _ = make_inputs(model, config, variant=variant, seed=seed, causal=causal)
    meta = {
        "name": str(path),
        "model_type": config.model_type,
        "model_class": cls.__name__,
        "task": task,
        "modality": modality,
        "family": family,
        "n_params": sum(p.numel() for p in model.parameters()),
        "dims": recipes._dims(config),
        "is_decoder_lm": is_lm,
    }
    return Target(spec, "config_dir", model, inputs, meta)


def _registered(name: str, seed: int) -> Target:
    from models import weights
    from models.zoo import recipes
    from models.zoo.inputs import make_inputs

    load = {"smollm2": weights.load_smollm2, "minilm": weights.load_minilm}[name]
    model, _tokenizer = load(torch.float16)  # WeightsNotInstalledError names the pip command
    config = model.config
    is_lm = name == "smollm2"
    inputs, modality, _ = make_inputs(model, config, seed=seed, causal=is_lm)
    meta = {
        "name": name,
        "model_type": config.model_type,
        "model_class": type(model).__name__,
        "modality": modality,
        "n_params": sum(p.numel() for p in model.parameters()),
        "dims": recipes._dims(config),
        "is_decoder_lm": is_lm,
    }
    return Target(name, "registered", model, inputs, meta)


def _half(inputs: dict) -> dict:
    return {
        k: (v.half() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
        for k, v in inputs.items()
    }


def _records(ops, bridges: dict | None = None) -> list[dict]:
    from models.zoo.classify import _dedup, _op_record

    out = _dedup([_op_record(op) for op in ops])
    if bridges is not None:
        for r in out:
            r["bridged_by"] = list(bridges.get(r["capability"], []))
    return out


def make_plan(target: Target, strict_run: bool = True) -> dict:
    """The plan document of `target` (format in docs/zoo.md, "spyre-emu plan")."""
    import adapters
    import torch_spyre_emu
    from adapters.plan import similar_adapters
    from models.zoo.classify import FP16_UNCLEAN, _error, classify_error

    model = target.model.half().eval()
    inputs = _half(target.inputs)
    doc = {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "model": {"spec": target.spec, "source": target.source, **target.meta},
        "inputs": {
            k: {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")}
            for k, v in inputs.items()
            if isinstance(v, torch.Tensor)
        },
        "status": "ok",
        "reason": None,
        "unsupported": [],
        "bridges": {},
        "adapters_applied": [],
        "unbridged": [],
        "remaining": [],
        "strict": None,
        "error": None,
    }
    torch._dynamo.reset()
    try:
        p = adapters.plan(model, inputs)
    except Exception as e:  # noqa: BLE001 - the document says what happened
        torch._dynamo.reset()
        doc["error"] = _error(e)
        try:
            with torch.no_grad():
                model(**inputs)
        except Exception:  # noqa: BLE001 - the model fails on the CPU in fp16 too: not the stack's fault
            doc.update(status="not_fp16_clean", reason=f"{FP16_UNCLEAN}: {type(e).__name__}")
            return doc
        doc.update(status="plan_error", reason=f"the dry run failed: {type(e).__name__}")
        return doc
    doc["unsupported"] = _records(p.unsupported, p.bridges)
    doc["bridges"] = {k: list(v) for k, v in p.bridges.items()}
    doc["adapters_applied"] = list(p.applied)
    doc["unbridged"] = _records(p.unbridged)
    doc["remaining"] = _records(p.remaining)
    for r in doc["remaining"]:  # what bridges a gap like this one in other models (issue 11 §3)
        r["similar_adapters"] = similar_adapters(r["capability"])
    if strict_run:
        doc["strict"] = _strict_result(model, inputs, torch_spyre_emu, adapters, classify_error)
    return doc


def _strict_result(model, inputs, torch_spyre_emu, adapters, classify_error) -> dict:
    from models.zoo.classify import _error
    from torch_spyre_emu.errors import FallbackWarning

    torch._dynamo.reset()
    with (
        adapters.apply(model),
        torch._dynamo.config.patch(automatic_dynamic_shapes=False),
        torch.no_grad(),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore", FallbackWarning)
        try:
            with torch_spyre_emu.strict():
                torch.compile(model, backend="spyre", dynamic=False)(**inputs)
        except Exception as e:  # noqa: BLE001
            cls, blocking = classify_error(e)
            return {"ok": False, "class": cls, "blocking": blocking, "error": _error(e)}
        finally:
            torch._dynamo.reset()
    return {"ok": True, "class": "pass_device", "blocking": [], "error": None}


def write_json(doc: dict, dest: str) -> None:
    """`dest` is a file path, or "-" for stdout."""
    text = json.dumps(doc, indent=2, sort_keys=False) + "\n"
    if dest == "-":
        print(text, end="")
    else:
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        Path(dest).write_text(text)


def _where(r: dict) -> str:
    return r["module_path"] or "(top level)"


def format_plan(doc: dict) -> str:
    """The document as text for a terminal (plain; the CLI prints it without markup)."""
    m = doc["model"]
    lines = [
        f"plan for {m.get('name', m['spec'])} ({m['source']}: {m.get('model_class', '?')}, "
        f"{m.get('n_params', 0) / 1e6:.2f} M parameters, dims {m.get('dims', {})})",
        "inputs: " + ", ".join(f"{k} {v['dtype']} {v['shape']}" for k, v in doc["inputs"].items()),
    ]
    if doc["status"] != "ok":
        lines.append(f"no plan: {doc['reason']}")
        if doc["error"]:
            lines.append(f"  {doc['error']['type']}: {doc['error']['message'].splitlines()[0][:400]}")
        return "\n".join(lines)
    lines.append(f"what the stack cannot lower yet ({len(doc['unsupported'])}):")
    for r in doc["unsupported"]:
        by = ", ".join(r["bridged_by"]) or "NOTHING"
        lines.append(
            f"  {r['op']} {r['status']} at {_where(r)}: dtypes {r['dtypes']} shapes {r['shapes']}; "
            f"capability {r['capability']}; bridged by {by}"
        )
    lines.append(f"adapters applied for the check: {', '.join(doc['adapters_applied']) or '-'}")
    if doc["remaining"]:
        lines.append(f"gaps nothing bridges (still there with the adapters: {len(doc['remaining'])}):")
        for r in doc["remaining"]:
            similar = r.get("similar_adapters") or []
            hint = f"; a similar gap is bridged elsewhere by {', '.join(similar)}" if similar else ""
            lines.append(f"  {r['op']} at {_where(r)} [{r['capability']}]{hint}")
    else:
        lines.append("gaps nothing bridges: none; with the adapters the model lowers in strict mode")
    s = doc["strict"]
    if s is None:
        lines.append("strict mode: not run (--no-strict-run)")
    elif s["ok"]:
        lines.append("strict mode: passes (everything on the device; class pass_device)")
    else:
        lines.append(f"strict mode: fails (class {s['class']}): {s['error']['type']}")
        lines += [
            f"  {b['op']} at {b['module_path'] or '(top level)'} [{b['capability']}]" for b in s["blocking"]
        ]
        if not s["blocking"]:
            lines.append(f"  {s['error']['message'].splitlines()[0][:400]}")
    return "\n".join(lines)
