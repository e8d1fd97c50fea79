"""host_generate: the index work of transformers' `generate()` between the forwards, on the host.

Each step of `GenerationMixin.generate` turns the last position's logits into the next token with stock index work:
the logits processors and warpers (top-k, top-p and min-p: `masked_fill`, top-p's `sort` and `scatter`; repetition
penalty: `gather` and `scatter`; forced BOS/EOS, suppressed tokens and bad words: `scores[:, ids] = -inf`, an
`index_put`; no-repeat n-grams: `all`) and, when sampling, `torch.multinomial`. Before the first step it derives a
decoder's position ids from the attention mask (a cumsum, then `masked_fill` of the pad positions) and checks that
the mask is all ones (`all`). None of these lowers on Spyre and none has a CPU island in the real stack, so on a
model moved with `Module.to("spyre")` a decoder given its attention mask, greedy decoding with a generation config's
forced tokens (Marian, Pegasus, mBART), a repetition penalty or any sampling stops before the first token. The
forward passes are not the problem: they stay on the device.

The patch (this model instance only; its forward is untouched):
- `_get_logits_processor` builds the stock list with its own tensors (EOS ids, suppressed ids) on the host and returns
  it wrapped: a call with device tensors copies `input_ids` and `scores` to the host, runs the stock processors there
  and hands the scores back on their device in their dtype. An empty list (plain greedy) is not copied anywhere.
- `_prepare_position_ids_for_generation` (the model's own, where a VLM adds its rope index) runs on host copies.
- `generate` runs under a TorchFunctionMode with two handlers, for device tensors: `torch.multinomial` draws on the
  host from the device's generator (`torch.spyre`'s, seeded by `torch.manual_seed` as the CPU's), so a seeded run
  samples as a seeded CPU run does from the same probabilities; `torch.all` reduces on the host.
- Beam search (`num_beams > 1`, greedy or sampled) keeps its running beams on the device and picks them with
  floor division, modulo and `take_along_dim` in five helpers it calls through `self` (`_get_top_k_continuations`
  and the rest: `BEAM_HELPERS`): they run on host copies, a sampled beam search drawing from the device's generator;
  the cache reorder between steps (`index_select` of every layer's rows: no lowering either) picks its rows on the
  host, through `_reorder_cache`, which beam search prefers when a model has one (the model's own, XLNet's or RAG's,
  runs inside). generate() looks `_beam_search` itself up on the class, so the loop is stock.
- Whisper's own generate picks each row's start tokens with `init_tokens[batch_idx_map]` (`aten.index`) before the
  first step, in `_prepare_decoder_input_ids`: on host copies too (`HOST_HELPERS`).
The same functions on the same values: what each returns is bit-identical to the stock code's on CPU copies. The
rest of the loop (argmax, the forwards, the cache, stopping criteria) stays stock on the device.

Not bridged: a caller's own `logits_processor` that holds device tensors, classifier-free guidance (its processor
runs the model on the host inputs), assisted decoding, and Whisper's long-form (> 30 s) transcription.
"""

from __future__ import annotations

import copy
import functools
import inspect

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.overrides import TorchFunctionMode

from adapters._stack import back_on, device_generator, device_of, host, on_host, pass_through, to_host
from adapters.base import Adapter
from adapters.patch import Patch
from adapters.registry import register_adapter


@functools.cache
def _processor_list_class():
    from transformers.generation.logits_process import LogitsProcessorList

    class HostLogitsProcessorList(LogitsProcessorList):
        """The stock processors, run on host copies when the scores live on a device."""

        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.FloatTensor:
            if not self or scores.device.type == "cpu":
                return super().__call__(input_ids, scores, **kwargs)
            return host_logits_processors(super().__call__, input_ids, scores, **kwargs)

    return HostLogitsProcessorList


@host
def host_logits_processors(call, input_ids, scores, **kwargs):
    """`call` (the stock LogitsProcessorList.__call__) on host copies; the scores back on their device and dtype."""
    kwargs = pytree.tree_map_only(torch.Tensor, to_host, kwargs)
    out = call(to_host(input_ids), to_host(scores), **kwargs)
    return out.to(device=scores.device, dtype=scores.dtype)


@host
def host_multinomial(probs: torch.Tensor, num_samples: int, replacement: bool = False, *, generator=None, out=None):
    """torch.multinomial of device probabilities, drawn on the host from the device's generator."""
    if out is not None:
        raise NotImplementedError("host_generate: torch.multinomial(..., out=) is not bridged; drop out=")
    gen = generator if generator is not None else device_generator(probs.device)
    draws = torch.multinomial(to_host(probs), num_samples, replacement, generator=gen)
    return draws.to(probs.device)


# generate()'s own bookkeeping reduces device masks with torch.all (`(attention_mask == 1).all()` before a decoder's
# prefill, beam search's finished flags): a check on the host, its 0-d result back on the device
host_all = on_host(torch.all)


class _HostSteps(TorchFunctionMode):
    """torch.multinomial and torch.all of a device tensor on the host; every other call unchanged. Flat: dynamo
    inlines this at every torch call of a compiled forward that generate() runs under it (an adapter's own mode,
    entered at the forward, sees a forward's calls first)."""

    @pass_through
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        if (func is torch.multinomial or func is torch.Tensor.multinomial) and args[0].device.type != "cpu":
            return host_multinomial(*args, **kwargs)
        if (func is torch.all or func is torch.Tensor.all) and args[0].device.type != "cpu":
            return host_all(*args, **kwargs)
        return func(*args, **kwargs)


def _builder(prev):
    """`_get_logits_processor` building the stock list on the host (its tensors there), wrapped."""
    signature = inspect.signature(prev)
    wrap = _processor_list_class()

    def build(self, *args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        if "device" in signature.parameters:
            bound.arguments["device"] = "cpu"
        config = bound.arguments.get("generation_config")
        if config is not None:
            # generate() put the special tokens on the inputs' device (`_eos_token_tensor`, ...); the processors keep
            # them (MinLength compares the vocabulary with the EOS ids): a shallow copy holds host copies instead
            config = copy.copy(config)
            for name, value in vars(config).items():
                if isinstance(value, torch.Tensor):
                    setattr(config, name, to_host(value))
            bound.arguments["generation_config"] = config
        if isinstance(bound.arguments.get("encoder_input_ids"), torch.Tensor):
            # EncoderRepetitionPenalty / EncoderNoRepeatNGram keep them to compare with the host copies
            bound.arguments["encoder_input_ids"] = to_host(bound.arguments["encoder_input_ids"])
        return wrap(prev(*bound.args, **bound.kwargs))

    return build


def _position_ids(prev):
    """`_prepare_position_ids_for_generation` (the mask's cumsum, its pad positions masked_fill'ed; a VLM's rope
    index on top) on host copies of its tensors, the position ids back on the inputs' device."""

    def prepare(self, inputs_tensor, model_kwargs):
        if inputs_tensor.device.type == "cpu":
            return prev(inputs_tensor, model_kwargs)
        return host_generation_positions(prev, inputs_tensor, model_kwargs)

    return prepare


@host
def host_generation_positions(prepare, inputs_tensor, model_kwargs):
    """`prepare` (the model's `_prepare_position_ids_for_generation`) on host copies; the ids back on the device."""
    host_kwargs = {k: to_host(v) if isinstance(v, torch.Tensor) else v for k, v in model_kwargs.items()}
    return back_on(prepare(to_host(inputs_tensor), host_kwargs), inputs_tensor.device)


# Beam search. generate() looks `_beam_search` up on the class (the instance cannot replace it); the loop keeps its
# state on the inputs' device and calls its bookkeeping through `self`, so these helpers, which floor-divide and
# take_along_dim the beams, run on host copies (their results back on the device): the stock functions on the same
# values. The rest of the loop (the forwards, log_softmax, the stopping criteria) stays on the device.
BEAM_HELPERS = (
    "_get_top_k_continuations",  # a sampled beam search draws here: from the device's generator, as host_multinomial
    "_get_running_beams_for_next_iteration",
    "_update_finished_beams",
    "_check_early_stop_heuristic",
    "_beam_search_has_unfinished_sequences",
)
# Whisper's own generate (WhisperGenerationMixin) picks each row's start tokens with `init_tokens[batch_idx_map]`
# (aten.index) before the first step, through this static helper; the rest of its short-form path is stock generate
HOST_HELPERS = (*BEAM_HELPERS, "_prepare_decoder_input_ids")


class _DrawFrom(TorchFunctionMode):
    """torch.multinomial without a generator draws from `generator` (entered only around one host helper)."""

    def __init__(self, generator: torch.Generator | None):
        super().__init__()
        self.generator = generator

    @pass_through
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func is torch.multinomial or func is torch.Tensor.multinomial) and kwargs.get("generator") is None:
            kwargs = {**kwargs, "generator": self.generator}
        return func(*args, **kwargs)


def _host_helper(prev):
    """`prev` (a bound generate helper, or a static one) on host copies when its tensors live on a device."""
    stock = on_host(prev)

    def helper(*args, **kwargs):
        device = device_of(args, kwargs)
        if device is None or device.type == "cpu":
            return prev(*args, **kwargs)
        with _DrawFrom(device_generator(device)):
            return stock(*args, **kwargs)

    return helper


# the cache's own reorder (every Cache layer, XLNet's mems, RAG's) picks the beams' rows with index_select
host_index_select = on_host(torch.index_select)


class _HostIndexSelect(TorchFunctionMode):
    """index_select of a device tensor on the host (entered only around a cache reorder)."""

    @pass_through
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        if (func is torch.index_select or func is torch.Tensor.index_select) and args[0].device.type != "cpu":
            return host_index_select(*args, **kwargs)
        return func(*args, **kwargs)


def _reorder(prev):
    """What beam search calls as `self._reorder_cache(cache, beam_idx)` when the model has it: `prev` (the model's
    own: XLNet, RAG) or the cache's `reorder_cache`, with its row picks on the host."""

    def reorder(cache, beam_idx):
        with _HostIndexSelect():
            if prev is not None:
                return prev(cache, beam_idx)
            cache.reorder_cache(beam_idx)
            return cache

    return reorder


def _generate(prev):
    @pass_through  # an error of the model's generate is the model's (models.zoo.classify), not this adapter's
    def generate(self, *args, **kwargs):
        with _HostSteps():
            return prev(*args, **kwargs)

    return generate


@register_adapter
class HostGenerate(Adapter):
    name = "host_generate"
    gap = "aten.masked_fill"
    also = (
        "aten.gather",
        "aten.scatter",
        "aten.index_put",
        "aten.all",
        "aten.sort",
        "aten.multinomial",
        "aten.floor_divide",  # beam search: the beams' topk_indices // vocab_size
        "aten.remainder",  # and % vocab_size
        "aten.index_select",  # the cache reorder
        "aten.index",  # Whisper's init_tokens[batch_idx_map]
    )
    applies_to = frozenset({"any model that can generate (transformers' GenerationMixin)"})
    order = 97  # touches generate only; after every forward patch
    summary = (
        "generate(): logits processors, warpers, multinomial draws, position ids, mask checks and beam search's"
        " bookkeeping on the host, the forwards on the device"
    )
    patches_forward = False

    def applicable(self, model: nn.Module) -> bool:
        can = getattr(model, "can_generate", None)
        return callable(getattr(model, "_get_logits_processor", None)) and callable(can) and bool(can())

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        patch.override_method(
            model,
            "_get_logits_processor",
            _builder(model._get_logits_processor),
            f"{type(model).__name__}._get_logits_processor: the stock processors, run on host copies of the scores",
        )
        if callable(getattr(model, "_prepare_position_ids_for_generation", None)):
            patch.override_method(
                model,
                "_prepare_position_ids_for_generation",
                _position_ids(model._prepare_position_ids_for_generation),
                f"{type(model).__name__}._prepare_position_ids_for_generation on host copies",
            )
        for name in HOST_HELPERS:
            if not callable(getattr(model, name, None)):
                continue
            # a plain function in the instance's dict: `self.name(...)` calls it without self (the stock one, bound
            # or static, is inside)
            what = f"{type(model).__name__}.{name} on host copies"
            patch.set_attr(model, name, _host_helper(getattr(model, name)), what)
        patch.set_attr(
            model,
            "_reorder_cache",
            _reorder(getattr(model, "_reorder_cache", None)),
            f"{type(model).__name__}._reorder_cache: beam search's cache reorder picks its rows on the host",
        )
        patch.override_method(
            model,
            "generate",
            _generate(model.generate),
            f"{type(model).__name__}.generate under a mode running torch.multinomial and torch.all on the host",
        )
        return patch
