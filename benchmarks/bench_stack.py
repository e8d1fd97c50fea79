"""Speed of the emulated stack against yardsticks measured in the same run (issue 4 §6).

1. A small transformers decoder (LlamaConfig hidden 256, 4 layers, random weights, fp16, hf adapters applied) run
   through torch.compile(backend="spyre") with numbers and timing (config.mode "both"), against the same model's
   CPU fp32 eager forward. Target: median ratio <= 5 (issue 4), <= 3 (issue 15). Three calls warm up first
   (compile, numba specializations); the ratio is the median of five alternating blocks (emulated calls, then CPU
   calls).
2. Compile time (first call after a dynamo reset, minus one steady-state call) of a 24-layer model relative to a
   2-layer model of the same width. Target <= 2. Measured two ways: whole-model torch.compile (dynamo traces every
   layer, so this grows with depth; the same measurement with torch's no-op "eager" backend shows dynamo's own share,
   a floor no backend can go below) and torch_spyre_emu.compile_blocks (one compiled graph reused by every identical
   decoder layer, plus the final norm and LM head compiled singly), which is how the target is met.

Run: .venv/bin/python benchmarks/bench_stack.py [--repeats N]. Prints medians; the last four lines are the ratios.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import torch_spyre_emu


def decoder(layers: int, hidden: int = 256) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        vocab_size=1024,
    )
    return LlamaForCausalLM(cfg).eval()


def spyre_model(model: LlamaForCausalLM, blocks: bool = False, backend: str = "spyre"):
    """The fp16 model with the adapters applied, compiled whole (torch.compile with `backend`) or per decoder block."""
    import adapters

    m = copy.deepcopy(model).half()
    adapters.apply(m)
    if blocks:
        torch_spyre_emu.compile_blocks(m, extra=("model.norm", "lm_head"))
        return m
    return torch.compile(m, backend=backend, dynamic=False)


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def forward_ratio(repeats: int, blocks: int = 5) -> float:
    """The median, over `blocks` alternating blocks, of (median emulated forward / median CPU forward) of `repeats`
    calls each. Blocks rather than one long run each: this 2-core VM's speed drifts over seconds (the same code
    measured 3.4 to 5.0 in single runs of one afternoon), and a block pair sees the same machine. Not interleaved
    call by call: torch's and numba's OpenMP threads spin for a while after each parallel region, so alternate calls
    would each pay for the other's spinning threads."""
    model = decoder(4)
    ids = torch.randint(0, 1024, (1, 64), generator=torch.Generator().manual_seed(0))
    compiled = spyre_model(model)
    ratios, emu, cpu = [], [], []
    with torch.no_grad():
        for _ in range(3):  # compile, then let first-use costs (numba specializations, caches) settle
            compiled(input_ids=ids, use_cache=False)
        for _ in range(blocks):
            e = timed(lambda: compiled(input_ids=ids, use_cache=False), repeats)
            c = timed(lambda: model(input_ids=ids, use_cache=False), repeats)
            ratios.append(statistics.median(e) / statistics.median(c))
            emu, cpu = emu + e, cpu + c
        # profile() merges every graph of the forward (adapters' host code splits it); last_profile() has only one
        rep = torch_spyre_emu.profile(lambda: compiled(input_ids=ids, use_cache=False), mode="both")
    print(
        f"decoder 4x256, 64 tokens: emulated forward (numbers + timing) median {statistics.median(emu) * 1e3:.1f} ms "
        f"({len(rep.kernels)} kernels, {rep.total_us:.0f} us simulated)"
    )
    print(f"decoder 4x256, 64 tokens: CPU fp32 eager forward median {statistics.median(cpu) * 1e3:.1f} ms")
    print(f"forward ratio per block of {repeats} calls each: {', '.join(f'{r:.2f}' for r in ratios)}")
    return statistics.median(ratios)


def compile_seconds(layers: int, repeats: int, blocks: bool = False, backend: str = "spyre") -> float:
    model = decoder(layers)
    ids = torch.randint(0, 1024, (1, 16), generator=torch.Generator().manual_seed(0))
    samples = []
    for _ in range(repeats):
        torch._dynamo.reset()
        compiled = spyre_model(model, blocks=blocks, backend=backend)
        with torch.no_grad():
            t = time.perf_counter()
            compiled(input_ids=ids, use_cache=False)
            first = time.perf_counter() - t
            t = time.perf_counter()
            compiled(input_ids=ids, use_cache=False)
            steady = time.perf_counter() - t
        samples.append(first - steady)
    s = statistics.median(samples)
    how = "compile_blocks" if blocks else f"whole-model torch.compile(backend={backend!r})"
    print(f"compile time, {layers} layers x 256, {how}: median {s:.2f} s")
    return s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=9)
    a = p.parse_args()
    warnings.simplefilter(
        "ignore"
    )  # fallback islands (embedding, RoPE) warn once per graph; not measured here
    torch_spyre_emu.config.mode = "both"
    ratio = forward_ratio(a.repeats)
    n = max(1, a.repeats // 2)
    whole = compile_seconds(24, n) / compile_seconds(2, n)
    # the floor of any whole-model backend: dynamo tracing every layer, with torch's no-op "eager" backend
    dynamo = compile_seconds(24, n, backend="eager") / compile_seconds(2, n, backend="eager")
    blocks = compile_seconds(24, n, blocks=True) / compile_seconds(2, n, blocks=True)
    print(f"forward ratio emulated/CPU fp32 (targets: <= 5 issue 4, <= 3 issue 15): {ratio:.2f}")
    print(f"compile time ratio 24 layers / 2 layers, whole-model torch.compile: {whole:.2f}")
    print(f"  (dynamo alone, backend='eager', no Spyre lowering at all: {dynamo:.2f})")
    print(f"compile time ratio 24 layers / 2 layers, compile_blocks (target <= 2): {blocks:.2f}")


if __name__ == "__main__":
    main()
