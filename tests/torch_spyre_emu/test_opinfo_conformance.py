"""torch's own OpInfo samples (torch.testing._internal's op_db, what upstream device tests and RFC 1287's configs run
for an out-of-tree device), on spyre tensors: every op either runs and matches the CPU, or raises one of the
emulator's typed errors (SpyreError: unsupported op, compile error, device error), never an untyped error from
inside the stack. Each op takes its first sample that runs on the CPU.

- eager in fp16 and fp32, compiled in fp16: the error contract;
- values in fp32, where the device is IEEE fp32, against the CPU at 1e-3 (random ops excluded).

This sweep found a segfault (to_sparse traced in dynamo's fake run), schema errors from the eager dispatch (x % 2,
bernoulli_()), functionalization errors (cummax) and a placeholder object returned as a result (native_layer_norm's
statistics). The default run takes every fifth op; the whole table is marked slow.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from torch_spyre_emu.errors import SpyreError

common_methods_invocations = pytest.importorskip("torch.testing._internal.common_methods_invocations")
from tests.marks import slow_where  # noqa: E402

OPS = {(op.name, op.variant_test_name): op for op in common_methods_invocations.op_db}
# random ops (values differ by construction) and ops whose sample passes an index tensor torch requires on the CPU
RANDOM = {
    "bernoulli",
    "normal",
    "rand_like",
    "randn_like",
    "randint_like",
    "randint",
    "randn",
    "rand",
    "uniform",
    "exponential",
    "geometric",
    "cauchy",
    "log_normal",
    "multinomial",
    "nn.functional.rrelu",
    "nn.functional.dropout",
    "nn.functional.dropout2d",
    "nn.functional.dropout3d",
    "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout",
    "empty",
    "empty_like",
    "new_empty",
    "empty_strided",
    "new_empty_strided",
    "empty_permuted",
}
HOST_INDICES = {"tensor_split"}  # tensor_indices_or_sections must be a CPU tensor (torch's rule, CUDA's too)
NAMES = sorted(k for k in OPS if k[0] not in HOST_INDICES)
DEFAULT = set(NAMES[::5])


def _ids(keys):
    return [f"{name}.{variant}" if variant else name for name, variant in keys]


def _first_sample(op, dtype):
    if dtype not in op.supported_dtypes("cpu"):
        pytest.skip(f"{op.name} has no {dtype} on the CPU")
    for sample in op.sample_inputs("cpu", dtype, requires_grad=False):
        args, kwargs = (sample.input, *sample.args), sample.kwargs
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return args, kwargs, op(*args, **kwargs)
        except Exception:  # noqa: BLE001 (a sample the CPU itself refuses is not this test's)
            continue
    pytest.skip(f"no {dtype} sample of {op.name} runs on the CPU")


def _on_spyre(tree):
    return torch.utils._pytree.tree_map(lambda t: t.to("spyre") if isinstance(t, torch.Tensor) else t, tree)


def _run(op, args, kwargs, compiled: bool):
    args, kwargs = _on_spyre((args, kwargs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if compiled:
            torch._dynamo.reset()
            return torch.compile(lambda *a, **k: op(*a, **k))(*args, **kwargs)
        return op(*args, **kwargs)


def _typed_or_runs(key, dtype, compiled):
    op = OPS[key]
    args, kwargs, _ = _first_sample(op, dtype)
    try:
        out = _run(op, args, kwargs, compiled)
    except SpyreError:
        return None
    except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError):
        return None  # dynamo's own refusal of the Python, before the stack sees a graph
    for t in torch.utils._pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor):
            t.cpu()
    return out


@pytest.mark.parametrize("key", slow_where(NAMES, set(NAMES) - DEFAULT), ids=_ids(NAMES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_eager_runs_or_raises_a_typed_error(key, dtype):
    _typed_or_runs(key, dtype, compiled=False)


@pytest.mark.parametrize("key", slow_where(NAMES, set(NAMES) - DEFAULT), ids=_ids(NAMES))
def test_compiled_runs_or_raises_a_typed_error(key):
    _typed_or_runs(key, torch.float16, compiled=True)


@pytest.mark.parametrize("key", slow_where(NAMES, set(NAMES) - DEFAULT), ids=_ids(NAMES))
def test_fp32_values_match_the_cpu(key):
    if key[0] in RANDOM:
        pytest.skip("random values")
    op = OPS[key]
    args, kwargs, ref = _first_sample(op, torch.float32)
    try:
        out = _run(op, args, kwargs, compiled=False)
    except SpyreError:
        pytest.skip("a typed gap (the error contract is the other tests')")
    got = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    want = [t for t in torch.utils._pytree.tree_leaves(ref) if isinstance(t, torch.Tensor)]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu(), w, atol=1e-3, rtol=1e-3, equal_nan=True)
