"""KernelProgram <-> JSON. `from_json(to_json(p))` gives a program equal to p (constants compared as arrays).

The document is plain JSON (NaN / Infinity allowed in constants, as Python's json writes them):
  {"format": "aiu_sim.KernelProgram", "version": 1, "name", "buffers": [...], "steps": [...], "inputs",
   "outputs", "constants": {name: {"dtype", "shape", "data": [flat, row-major]}}, "config": {...} | null}
Steps carry a "type": kernel, h2d, d2h, host or collective; a kernel carries "bundle" only when it belongs to one (so documents
without bundles are unchanged and still version 1). Attribute values that JSON cannot hold directly are tagged:
{"__tuple__": [...]}, {"__array__": {...}} and {"__accumulation__": {...}} (an AccumulationModel).
A buffer's layout is written only when it is not the default layout of its shape and dtype.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import ml_dtypes
import numpy as np

from aiu_sim.config import HardwareConfig
from aiu_sim.errors import ProgramError
from aiu_sim.ir.layout import StickLayout, default_layout
from aiu_sim.ir.program import (
    Arg,
    Buffer,
    Collective,
    DeviceToHost,
    HostOp,
    HostToDevice,
    Kernel,
    KernelProgram,
)

FORMAT = "aiu_sim.KernelProgram"
VERSION = 1


def to_json(program: KernelProgram, indent: int | None = None) -> str:
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "name": program.name,
        "buffers": [_buffer(b) for b in program.buffers.values()],
        "steps": [_step(s) for s in program.steps],
        "inputs": list(program.inputs),
        "outputs": list(program.outputs),
        "constants": {name: _array(v) for name, v in program.constants.items()},
        "config": program.config.to_dict() if program.config is not None else None,
    }
    return json.dumps(doc, indent=indent)


def from_json(text: str, config: HardwareConfig | None = None) -> KernelProgram:
    """Rebuild (and validate) a program. `config` overrides the config stored in the document."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ProgramError(f"not a KernelProgram JSON document: {e}") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ProgramError(f'not a KernelProgram JSON document (expected "format": {FORMAT!r})')
    if doc.get("version") != VERSION:
        raise ProgramError(
            f"KernelProgram JSON version {doc.get('version')!r} is not supported (this is {VERSION})"
        )
    try:
        if config is None and doc.get("config") is not None:
            config = HardwareConfig.from_dict(dict(doc["config"]), source="the program's JSON")
        return KernelProgram(
            name=doc["name"],
            buffers=[_load_buffer(b) for b in doc["buffers"]],
            steps=[_load_step(s) for s in doc["steps"]],
            inputs=list(doc.get("inputs", [])),
            outputs=list(doc.get("outputs", [])),
            constants={k: _load_array(v) for k, v in doc.get("constants", {}).items()},
            config=config,
        )
    except (KeyError, TypeError) as e:
        raise ProgramError(f"malformed KernelProgram JSON: missing or wrong field ({e!r})") from e


# ---- writing ----------------------------------------------------------------------------------------------------


def _buffer(b: Buffer) -> dict:
    out = {
        "name": b.name,
        "dtype": b.dtype,
        "shape": list(b.shape),
        "placement": b.placement,
        "lx_offset": b.lx_offset,
        "lx_bytes_per_core": b.lx_bytes_per_core,
    }
    if b.layout != default_layout(b.shape, b.dtype):
        out["layout"] = {"device_size": list(b.layout.device_size), "stride_map": list(b.layout.stride_map)}
    return out


def _arg(a: Arg) -> dict:
    out: dict[str, Any] = {"buffer": a.buffer, "dims": list(a.dims)}
    if any(a.offset):
        out["offset"] = list(a.offset)
    if a.view is not None:
        out["view"] = list(a.view)
    return out


def _step(s) -> dict:
    if isinstance(s, Kernel):
        out = {
            "type": "kernel",
            "name": s.name,
            "op": s.op,
            "fn": s.fn,
            "inputs": [_arg(a) for a in s.inputs],
            "outputs": [_arg(a) for a in s.outputs],
            "space": [[d, n] for d, n in s.space.items()],  # a list: the dim order matters
            "reduce_dims": list(s.reduce_dims),
            "split": [[d, n] for d, n in s.split.items()],
            "cores": list(s.cores),
            "attrs": _attrs(s.attrs, s.name),
            "reduction_order": s.reduction_order,
        }
        if s.bundle is not None:  # optional: documents without bundles read as before
            out["bundle"] = s.bundle
        return out
    if isinstance(s, HostToDevice | DeviceToHost):
        kind = "h2d" if isinstance(s, HostToDevice) else "d2h"
        return {"type": kind, "name": s.name, "src": s.src, "dst": s.dst, "host_dtype": s.host_dtype}
    if isinstance(s, HostOp | Collective):
        return {
            "type": "host" if isinstance(s, HostOp) else "collective",
            "name": s.name,
            **({"fn": s.fn} if isinstance(s, HostOp) else {"op": s.op}),
            "inputs": list(s.inputs),
            "outputs": list(s.outputs),
            "attrs": _attrs(s.attrs, s.name),
        }
    raise ProgramError(f"cannot serialize step of type {type(s).__name__}")


def _attrs(attrs: dict, where: str) -> dict:
    return {str(k): _value(v, f"step {where!r} attr {k!r}") for k, v in attrs.items()}


def _value(v, where: str):
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, tuple):
        return {"__tuple__": [_value(x, where) for x in v]}
    if isinstance(v, list):
        return [_value(x, where) for x in v]
    if isinstance(v, dict):
        if any(not isinstance(k, str) for k in v):
            raise ProgramError(f"{where}: dict keys must be strings to serialize, got {list(v)}")
        return {k: _value(x, where) for k, x in v.items()}
    if isinstance(v, np.ndarray):
        return {"__array__": _array(v)}
    if type(v).__name__ == "AccumulationModel" and dataclasses.is_dataclass(v):
        return {"__accumulation__": dataclasses.asdict(v)}
    raise ProgramError(
        f"{where}: value {v!r} of type {type(v).__name__} cannot be serialized; use numbers, strings, lists, "
        "dicts, tuples, numpy arrays or an AccumulationModel"
    )


def _array(values) -> dict:
    arr = np.asarray(values)
    if arr.dtype.kind in "fc" or arr.dtype.kind == "V":  # ml_dtypes floats have kind "V"
        data = arr.astype(np.float64).ravel().tolist()  # exact: every float32/16/8 value is a float64
    else:
        data = arr.ravel().tolist()
    return {"dtype": arr.dtype.name, "shape": list(arr.shape), "data": data}


# ---- reading ----------------------------------------------------------------------------------------------------


def _load_buffer(d: dict) -> Buffer:
    layout = None
    if "layout" in d:
        layout = StickLayout(tuple(d["layout"]["device_size"]), tuple(d["layout"]["stride_map"]), d["dtype"])
    return Buffer(
        name=d["name"],
        dtype=d["dtype"],
        shape=tuple(d["shape"]),
        layout=layout,
        placement=d.get("placement", "dram"),
        lx_offset=d.get("lx_offset", 0),
        lx_bytes_per_core=d.get("lx_bytes_per_core", 0),
    )


def _load_arg(d: dict) -> Arg:
    view = d.get("view")
    return Arg(
        buffer=d["buffer"],
        dims=tuple(d["dims"]),
        offset=tuple(d["offset"]) if "offset" in d else None,
        view=tuple(view) if view is not None else None,
    )


def _load_step(d: dict):
    kind = d.get("type")
    if kind == "kernel":
        return Kernel(
            name=d["name"],
            op=d["op"],
            fn=d.get("fn"),
            inputs=[_load_arg(a) for a in d["inputs"]],
            outputs=[_load_arg(a) for a in d["outputs"]],
            space={dim: n for dim, n in d["space"]},
            reduce_dims=tuple(d.get("reduce_dims", ())),
            split={dim: n for dim, n in d.get("split", [])},
            cores=tuple(d["cores"]) if d.get("cores") is not None else None,
            attrs=_load_attrs(d.get("attrs", {})),
            reduction_order=d.get("reduction_order", "chain"),
            bundle=d.get("bundle"),
        )
    if kind == "h2d":
        return HostToDevice(d["name"], d["src"], d["dst"], d["host_dtype"])
    if kind == "d2h":
        return DeviceToHost(d["name"], d["src"], d["dst"], d["host_dtype"])
    if kind == "host":
        return HostOp(
            d["name"], d["fn"], list(d["inputs"]), list(d["outputs"]), _load_attrs(d.get("attrs", {}))
        )
    if kind == "collective":
        return Collective(
            d["name"], d["op"], list(d["inputs"]), list(d["outputs"]), _load_attrs(d.get("attrs", {}))
        )
    raise ProgramError(
        f"step {d.get('name')!r}: unknown step type {kind!r}; expected kernel, h2d, d2h, host or collective"
    )


def _load_attrs(attrs: dict) -> dict:
    return {k: _load_value(v) for k, v in attrs.items()}


def _load_value(v):
    if isinstance(v, list):
        return [_load_value(x) for x in v]
    if isinstance(v, dict):
        if set(v) == {"__tuple__"}:
            return tuple(_load_value(x) for x in v["__tuple__"])
        if set(v) == {"__array__"}:
            return _load_array(v["__array__"])
        if set(v) == {"__accumulation__"}:
            from aiu_sim.numerics.accumulate import AccumulationModel

            return AccumulationModel(**v["__accumulation__"])
        return {k: _load_value(x) for k, x in v.items()}
    return v


def _load_array(d: dict) -> np.ndarray:
    name = d["dtype"]
    try:
        dtype = np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else np.dtype(name)
    except TypeError as e:
        raise ProgramError(f"constant dtype {name!r} is not a numpy / ml_dtypes dtype") from e
    return (
        np.asarray(d["data"], dtype=np.float64 if dtype.kind == "V" else None)
        .astype(dtype)
        .reshape(d["shape"])
    )
