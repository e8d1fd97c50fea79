"""Greedy decoding on emulated Spyre with static shapes: one prefill shape and one decode shape.

Spyre binaries are static-shape: every new shape is a new compiled program. `model.generate` grows its KV
cache by one position per token (a recompile per step) and slices logits in-graph, so this module runs its
own loop, the way IBM's hf-adapters do ("64-token decode blocks"):

* the prompt is right-padded to a multiple of 64 (`BLOCK`), so prefill is one [1, P] program;
* the KV cache is a fixed [1, kv_heads, L, head_dim] buffer per layer (L = prompt + new tokens rounded up to
  64), so every decode step is the same [1, 1] program;
* aten.index_copy_ (a static cache's write) is a gap on the stack, so the compiled step writes its new K/V
  rows with a blend the device can run: ``cache * keep + write @ k`` with 0/1 `keep` [L, 1] and one-hot
  `write` [L, q] built on the host (exact: every output element is one product by 1 plus zeros);
* what runs on the host, between device programs: the token embedding gather, the RoPE cos/sin table
  gather (both via the adapters), the additive attention mask, the one-hot write/select vectors, and the
  argmax over the logits.

The step runs the patched HuggingFace decoder layers (adapters.apply: RMSNorm, RoPE-as-matmul, explicit
attention ...), then the final norm and LM head on the one row whose next token is wanted. Each shape compiles one
decoder-block program shared by every layer and one head program (StaticStep, blocks=True), so dynamo traces one
layer and compile time does not grow with depth.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import nn

import torch_spyre_emu
from torch_spyre_emu.profiling import ProfileReport, host_code

BLOCK = 64  # sequence lengths are padded to whole 64-token blocks (one stick of fp16)


class GenerationError(ValueError):
    """The decode loop cannot run as asked (e.g. the prompt and new tokens do not fit the cache)."""


class ResumeError(GenerationError):
    """A checkpoint cannot be continued: it belongs to another job, or the emulator changed since it was taken."""


def round_up(n: int, block: int = BLOCK) -> int:
    return -(-n // block) * block


def cache_length(prompt_tokens: int, max_new_tokens: int, config) -> int:
    """Slots of the static KV cache for a prompt and its new tokens; a GenerationError if the model has fewer
    positions."""
    cache_len = round_up(prompt_tokens + max_new_tokens)
    limit = config.max_position_embeddings
    if cache_len > limit:
        raise GenerationError(
            f"{prompt_tokens} prompt + {max_new_tokens} new tokens need a {cache_len}-slot cache, over the model's "
            f"{limit} positions"
        )
    return cache_len


def device_copy(causal_lm: nn.Module, dtype: torch.dtype = torch.float16) -> nn.Module:
    """A fresh instance of the model's class with its weights cast to `dtype`; the original is untouched.

    (transformers refuses `.half()` on GGUF-loaded models: it flags them quantized although the weights are
    already de-quantized.) Tied weights stay tied; buffers (e.g. RoPE inv_freq) are copied as they are.
    """
    import copy

    with torch.device("meta"):
        fresh = type(causal_lm)(copy.deepcopy(causal_lm.config))
    state = {k: v.detach().to(dtype) for k, v in causal_lm.state_dict().items()}
    fresh.load_state_dict(state, assign=True)
    for name, buf in causal_lm.named_buffers():
        owner, _, attr = name.rpartition(".")
        fresh.get_submodule(owner).register_buffer(attr, buf.detach().clone(), persistent=False)
    if getattr(fresh.config, "tie_word_embeddings", False):
        fresh.lm_head.weight = fresh.model.embed_tokens.weight
    return fresh.eval()


class _BlendCache:
    """Duck-typed transformers cache for one compiled step: K/V written into fixed-size buffers by a blend."""

    def __init__(
        self, kv: tuple[torch.Tensor, ...], write: torch.Tensor, keep: torch.Tensor, one_layer: bool = False
    ):
        self.kv, self.write, self.keep = kv, write, keep
        # one_layer: kv is one layer's (K, V), whatever layer_idx the attention passes, so that every layer's
        # block traces to the same graph (dynamo then has no per-layer constant to guard on)
        self.one_layer = one_layer
        self.out: list[torch.Tensor] = []

    def _blend(self, buf: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        if new.shape[-2] == 1:  # decode: a broadcast multiply, not a K=1 matmul
            return buf * self.keep + self.write * new
        return buf * self.keep + torch.matmul(self.write, new)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        slot = 0 if self.one_layer else 2 * layer_idx
        k = self._blend(self.kv[slot], key_states)
        v = self._blend(self.kv[slot + 1], value_states)
        self.out += [k, v]
        return k, v


def _decoder_block(layer, hidden, cos, sin, mask, write, keep, k, v):
    """One decoder layer over its own K/V buffers: the graph compiled once and shared by every layer."""
    cache = _BlendCache((k, v), write, keep, one_layer=True)
    hidden = layer(hidden, attention_mask=mask, position_embeddings=(cos, sin), cache=cache)
    return (hidden, *cache.out)


def _head(norm, lm_head, select, hidden):
    if hidden.shape[1] > 1:
        hidden = torch.matmul(select, hidden)  # [1, 1, H]: the last real prompt position
    return lm_head(norm(hidden))


class StaticStep(nn.Module):
    """The device work of one step: decoder layers over a static cache, final norm, LM head on one selected row.

    blocks=True (what StaticGreedy compiles): one compiled graph per decoder layer, the same graph for every layer
    (the layer is an argument, so dynamo lifts its weights as inputs), and one for the norm and head, as IBM's
    hf-adapters compile decoder blocks (blocks.py): dynamo traces one layer, not all of them, and the compiler
    builds one block program. Each program's results come back to the host between layers. blocks=False runs the
    same code as it is (eager, or as one whole-model graph when torch.compile'd)."""

    def __init__(self, causal_lm: nn.Module, blocks: bool = False):
        super().__init__()
        self.layers = causal_lm.model.layers
        self.norm = causal_lm.model.norm
        self.lm_head = causal_lm.lm_head
        self.blocks = blocks
        if blocks:
            self._block = torch.compile(_decoder_block, backend="spyre", dynamic=False)
            self._head = torch.compile(_head, backend="spyre", dynamic=False)
            self._spyre_compiled = True  # profile() runs it as it is: its graphs are compiled already

    def forward(self, hidden, cos, sin, mask, select, write, keep, *kv):
        if self.blocks:
            out: list[torch.Tensor] = []
            for i, layer in enumerate(self.layers):
                hidden, k, v = self._block(layer, hidden, cos, sin, mask, write, keep, kv[2 * i], kv[2 * i + 1])
                out += [k, v]
            return (self._head(self.norm, self.lm_head, select, hidden), *out)
        cache = _BlendCache(kv, write, keep)
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=(cos, sin), cache=cache)
        return (_head(self.norm, self.lm_head, select, hidden), *cache.out)


@dataclass
class StepRecord:
    kind: str  # "prefill" or "decode"
    position: int  # position of the (last) token fed
    token: int  # the greedy token chosen from this step's logits
    sim_us: float  # simulated device-timeline time of the step's program(s)
    wall_s: float
    report: ProfileReport | None = None
    restored: bool = False  # taken from a checkpoint, not run by this generate() call


@dataclass
class Checkpoint:
    """The loop's state after len(steps) completed steps: the steps and the KV cache they filled.

    generate(resume=checkpoint) continues exactly where the loop stopped because `kv` holds the device's own bits.
    Recomputing it with a prefill over prompt + generated tokens would not: that is another program shape, and
    its cache rows need not be bit-identical to the ones the decode program wrote (on a tiny Llama with a 128-row
    prefill, one layer's V rows differ), so the continued tokens could drift from an uninterrupted run's."""

    steps: list[StepRecord]
    kv: tuple[torch.Tensor, ...]


@dataclass
class Generation:
    prompt_ids: list[int]
    new_ids: list[int]
    steps: list[StepRecord] = field(default_factory=list)
    prompt_pad: int = 0  # P
    cache_len: int = 0  # L

    @property
    def resumed_after(self) -> int:
        """Steps restored from a checkpoint rather than run by this generate() call (0 for a fresh run)."""
        return sum(1 for s in self.steps if s.restored)

    @property
    def prefill(self) -> StepRecord:
        return self.steps[0]

    @property
    def decodes(self) -> list[StepRecord]:
        return [s for s in self.steps if s.kind == "decode"]


class StaticGreedy:
    """Greedy decoding of a patched fp16 LlamaForCausalLM on emulated Spyre with two static programs."""

    def __init__(self, causal_lm: nn.Module, compile: bool = True, blocks: bool = True):
        """compile=False runs the same step eagerly on the CPU (a reference for the loop's logic, no timing).
        blocks=False compiles the whole step as one graph (dynamo traces every layer) instead of one decoder block
        shared by all layers plus the head (StaticStep)."""
        self.lm = causal_lm
        cfg = causal_lm.config
        self.layers = cfg.num_hidden_layers
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = causal_lm.model.layers[0].self_attn.head_dim
        self.dtype = causal_lm.lm_head.weight.dtype
        # where the weights are: CPU tensors into the compiled programs, or spyre tensors (Module.to("spyre"), after
        # the adapters), whose step inputs, KV cache and results then stay on that card
        self.device = causal_lm.lm_head.weight.device
        self.compiled = compile
        self.blocks = compile and blocks
        step = StaticStep(causal_lm, blocks=self.blocks)
        self.step = torch.compile(step, backend="spyre", dynamic=False) if compile and not blocks else step

    # --- host side ---------------------------------------------------------------------------------
    def host_inputs(self, ids: torch.Tensor, start: int, cache_len: int, last: int) -> tuple:
        """Everything the step needs besides the cache, built on the host for tokens at start..start+q-1."""
        q = ids.shape[1]
        inner = self.lm.model
        with torch.no_grad():
            hidden = inner.embed_tokens(ids).to(self.dtype)  # host gather (embedding adapter)
            positions = torch.arange(start, start + q).unsqueeze(0)
            cos, sin = inner.rotary_emb(hidden, position_ids=positions)  # host table gather (rope adapter)
        slots = torch.arange(cache_len)
        allowed = slots[None, :] <= positions[0][:, None]  # [q, L]: causal over the filled slots
        mask = torch.zeros(1, 1, q, cache_len, dtype=self.dtype)
        mask = mask.masked_fill(~allowed[None, None], torch.finfo(self.dtype).min)
        write = torch.zeros(cache_len, q, dtype=self.dtype)
        write[start + torch.arange(q), torch.arange(q)] = 1
        keep = 1 - write.sum(dim=1, keepdim=True)
        select = torch.zeros(1, q, dtype=self.dtype)
        select[0, last] = 1
        out = hidden, cos.to(self.dtype), sin.to(self.dtype), mask, select, write, keep
        return tuple(t.to(self.device) for t in out)

    def empty_cache(self, cache_len: int) -> tuple[torch.Tensor, ...]:
        shape = (1, self.kv_heads, cache_len, self.head_dim)
        return tuple(torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(2 * self.layers))

    def _run(self, inputs: Callable[[], tuple], kv: tuple, profiled: bool, trace_dir: str | None):
        if not self.compiled:
            with torch.no_grad():
                return self.step(*inputs(), *kv), None
        rep = self._profile(inputs, kv, "both", trace_dir if profiled else None)
        return rep.outputs, rep

    def _profile(self, inputs: Callable[[], tuple], kv: tuple, mode: str, trace_dir: str | None) -> ProfileReport:
        """One step timed as the device waits for it: the host work that builds its inputs (`host_inputs`: the
        embedding and RoPE gathers, the mask; charged as host code, per eager CPU op) and then its program(s),
        with the host code between them. Every step goes through profile(): only it reports all the graphs of a
        step of blocks and the host code, so each step's sim_us counts the same things. With the weights on a card,
        the inputs' eager copies to it are steps too (profiling.CopyRun: PCIe, whole sticks)."""

        def step():
            with host_code("host_inputs"):
                args = inputs()
            return self.step(*args, *kv)

        return torch_spyre_emu.profile(step, mode=mode, trace_path=trace_dir, compile=False)

    # --- the loop ----------------------------------------------------------------------------------
    def generate(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        eos_token_id: int | None = None,
        trace_dir: str | None = None,
        on_step: Callable[[StepRecord], None] | None = None,
        on_checkpoint: Callable[[Checkpoint], None] | None = None,
        resume: Checkpoint | None = None,
        forced: Sequence[int] | None = None,
    ) -> Generation:
        """Greedy tokens after `prompt_ids` [1, n]; prefill and the first decode step write Perfetto traces.

        forced=<tokens> is teacher forcing: each step is fed forced[i] instead of its own argmax, and new_ids are
        the argmax predictions (entry i is the model's choice where forced[i] stands); it runs max_new_tokens =
        len(forced) steps, not stopping at end-of-turn, and cannot resume.

        on_checkpoint gets the loop's state after every step (after on_step); resume=<such a checkpoint> continues
        from it and returns the same Generation an uninterrupted call would (restored steps keep their recorded
        timings; the prefill, and the decode program if no step is left to run, are re-timed without values for
        their reports)."""
        if prompt_ids.dim() != 2 or prompt_ids.shape[0] != 1:
            raise GenerationError(f"prompt_ids must be [1, n], got {tuple(prompt_ids.shape)}")
        if max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if forced is not None and (len(forced) != max_new_tokens or resume is not None):
            raise GenerationError(
                f"teacher forcing feeds exactly max_new_tokens={max_new_tokens} tokens from a fresh start; got "
                f"{len(forced)} tokens" + (" and a checkpoint to resume" if resume is not None else "")
            )
        n = prompt_ids.shape[1]
        pad = round_up(n)
        cache_len = cache_length(n, max_new_tokens, self.lm.config)
        gen = Generation(prompt_ids[0].tolist(), [], prompt_pad=pad, cache_len=cache_len)
        padded = torch.zeros(1, pad, dtype=prompt_ids.dtype)
        padded[:, :n] = prompt_ids  # right padding: pads sit in slots n..P-1, never attended by real tokens
        kv = self.empty_cache(cache_len)
        ids, start, last, kind = padded, 0, n - 1, "prefill"
        if resume is not None and resume.steps:
            kv = self._restore(gen, resume, padded, n, max_new_tokens, eos_token_id, trace_dir)
            ids, start, last, kind = torch.tensor([[gen.new_ids[-1]]]), n + len(gen.steps) - 1, 0, "decode"
            if len(gen.steps) == max_new_tokens or gen.new_ids[-1] == eos_token_id:
                return gen
        decode_profiled = False
        for i in range(len(gen.steps), max_new_tokens):
            t0 = time.perf_counter()
            inputs = functools.partial(self.host_inputs, ids, start, cache_len, last)
            profiled = kind == "prefill" or not decode_profiled  # the reports (and traces) callers look at
            out, rep = self._run(inputs, kv, profiled=profiled, trace_dir=trace_dir)
            decode_profiled = decode_profiled or kind == "decode"
            logits, kv = out[0], tuple(out[1:])
            token = int(torch.argmax(logits[0, -1].cpu().float()))  # host argmax (aten.argmax is a fallback)
            pos = start + last
            rec = StepRecord(
                kind, pos, token, rep.total_us if rep else float("nan"), time.perf_counter() - t0, rep
            )
            gen.steps.append(rec)
            gen.new_ids.append(token)
            if on_step is not None:
                on_step(rec)
            if on_checkpoint is not None:
                on_checkpoint(Checkpoint(list(gen.steps), kv))
            if forced is not None:
                token = int(forced[i])
            elif eos_token_id is not None and token == eos_token_id:
                break
            ids, start, last, kind = torch.tensor([[token]]), n + i, 0, "decode"
        return gen

    def _restore(
        self,
        gen: Generation,
        checkpoint: Checkpoint,
        padded: torch.Tensor,
        n: int,
        max_new_tokens: int,
        eos_token_id: int | None,
        trace_dir: str | None,
    ) -> tuple[torch.Tensor, ...]:
        """Load the checkpoint's steps into `gen` after checking they continue this prompt; return its KV cache."""
        steps = checkpoint.steps
        if len(steps) > max_new_tokens:
            raise ResumeError(
                f"the checkpoint holds {len(steps)} steps, more than max_new_tokens={max_new_tokens}"
            )
        for i, step in enumerate(steps):
            kind = "prefill" if i == 0 else "decode"
            if (step.kind, step.position) != (kind, n - 1 + i):
                raise ResumeError(
                    f"step {i} of the checkpoint is a {step.kind} at position {step.position}; for this "
                    f"{n}-token prompt it would be a {kind} at position {n - 1 + i}"
                )
            if i < len(steps) - 1 and step.token == eos_token_id:
                raise ResumeError(
                    f"step {i} of the checkpoint ends the answer (end-of-turn) but more steps follow"
                )
        want = self.empty_cache(gen.cache_len)
        got = [(tuple(t.shape), t.dtype) for t in checkpoint.kv]
        if got != [(tuple(t.shape), t.dtype) for t in want]:
            raise ResumeError(
                f"the checkpoint's KV cache ({len(got)} tensors, first {got[:1]}) does not fit this model and "
                f"length ({len(want)} tensors of {tuple(want[0].shape)} {want[0].dtype})"
            )
        gen.steps = [replace(s, report=None, restored=True) for s in steps]
        gen.new_ids = [s.token for s in steps]
        if self.compiled:
            inputs = functools.partial(self.host_inputs, padded, 0, gen.cache_len, n - 1)
            gen.steps[0].report = self._retime(gen.steps[0], inputs, want, trace_dir)
            done = len(steps) == max_new_tokens or steps[-1].token == eos_token_id
            if done and len(steps) > 1:  # no decode step will run, so none would leave a report
                ids = torch.tensor([[steps[-1].token]])
                inputs = functools.partial(self.host_inputs, ids, n + len(steps) - 1, gen.cache_len, 0)
                gen.steps[1].report = self._retime(gen.steps[1], inputs, tuple(checkpoint.kv), trace_dir)
        return tuple(checkpoint.kv)

    def _retime(self, step: StepRecord, inputs: Callable[[], tuple], kv: tuple, trace_dir: str | None) -> ProfileReport:
        """A restored step's program timed again (no values): its report, checked against the recorded time."""
        rep = self._profile(inputs, kv, "timing", trace_dir)
        if rep.total_us != step.sim_us:
            raise ResumeError(
                f"the {step.kind} program now takes {rep.total_us:.3f} us on the simulated chip; the interrupted "
                f"run recorded {step.sim_us:.3f} us. The emulator changed since, and a resumed run would mix two "
                "timing models: start over instead."
            )
        return rep
