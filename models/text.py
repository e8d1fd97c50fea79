"""Text helpers around the real-weight models: chat prompts to token ids, sentence embeddings."""

from __future__ import annotations

import torch

from models.weights import load_minilm


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
