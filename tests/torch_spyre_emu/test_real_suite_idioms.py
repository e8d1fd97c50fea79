"""The idioms torch-spyre's own test suite is written in (STACK §5), run against the emulator as that suite would:

- `compare_with_cpu` (tests/inductor/utils_inductor.py): a CPU reference, then the function compiled with
  backend="inductor" after a cache reset and run on spyre inputs, then run eagerly on spyre inputs, each checked with
  assert_close(atol=0.1, rtol=0.1, equal_nan=True) against the CPU;
- upstream PyTorch test classes instantiated for the out-of-tree device (RFC 1287's SpyreTestBase path):
  `instantiate_device_type_tests(..., only_for="privateuse1")` with `device` as the test argument;
- the imports the op tests make (DtypeOpTable, IDENTITY_OP, torch.ops.spyre.overwrite) and the hint API;
- `self.assertEqual` / `assert_close` between two spyre tensors (test_view_ops: a view written, its base compared).

This is not the real suite (it is not installable here); it keeps the machinery that suite relies on working.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

from torch_spyre_emu.errors import FallbackWarning

DEVICE = torch.device("spyre")


def compare_with_cpu(fn, *args, atol=0.1, rtol=0.1, expect_fallback=False):
    cpu = fn(*args)
    dargs = [a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args]
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FallbackWarning)
        compiled = torch.compile(fn, backend="inductor")(*dargs)
        eager = fn(*dargs)
    fell_back = any(issubclass(w.category, FallbackWarning) for w in caught)
    assert fell_back == expect_fallback, [str(w.message) for w in caught]
    for got in (compiled, eager):
        for g, c in zip(
            torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(cpu), strict=True
        ):
            assert g.device.type == "spyre"
            torch.testing.assert_close(g.cpu(), c, atol=atol, rtol=rtol, equal_nan=True)


def randn(*shape, dtype=torch.float16):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=torch.float32).to(
        dtype
    )


CASES = {
    "add": (lambda a, b: a + b, lambda: (randn(67, 129), randn(67, 129)), False),
    "mul_broadcast": (lambda a, b: a * b, lambda: (randn(3, 67, 129), randn(129)), False),
    "softmax": (lambda a: torch.softmax(a, -1), lambda: (randn(4, 130),), False),
    "sum_keepdim": (lambda a: a.sum(1, keepdim=True), lambda: (randn(4, 5, 64),), False),
    "layer_norm": (lambda a, w: F.layer_norm(a, (128,), w), lambda: (randn(8, 128), randn(128)), False),
    "rms_norm": (lambda a, w: F.rms_norm(a, (128,), w), lambda: (randn(8, 128), randn(128)), False),
    "linear": (lambda a, w: F.linear(a, w), lambda: (randn(16, 128) * 0.5, randn(64, 128) * 0.5), False),
    "bmm": (torch.bmm, lambda: (randn(3, 16, 64) * 0.5, randn(3, 64, 32) * 0.5), False),
    "sdpa": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        lambda: (randn(1, 2, 16, 64), randn(1, 2, 16, 64), randn(1, 2, 16, 64)),
        False,
    ),
    "topk": (lambda a: torch.topk(a, 4, -1).values, lambda: (randn(8, 100),), False),
    "to_fp32": (lambda a: a.to(torch.float32) * 2, lambda: (randn(4, 64),), False),
    "where": (lambda a, b: torch.where(a > 0, a, b), lambda: (randn(4, 64), randn(4, 64)), False),
    "cat_transpose": (
        lambda a, b: torch.cat([a, b], 0).t().contiguous(),
        lambda: (randn(4, 64), randn(4, 64)),
        False,
    ),
    "tril": (lambda a: torch.tril(a), lambda: (randn(64, 64),), True),  # a CPU fallback in the real stack
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_compare_with_cpu(name):
    fn, make, expect_fallback = CASES[name]
    compare_with_cpu(fn, *make(), expect_fallback=expect_fallback)


def test_the_op_tests_imports_resolve():
    from torch_spyre._inductor import spyre_hint  # noqa: F401
    from torch_spyre._inductor.dtype_ops import IDENTITY_OP, DtypeOpTable  # noqa: F401

    assert callable(torch.ops.spyre.overwrite) and callable(torch.ops.spyre.overwrite_f)


UPSTREAM = """
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase, run_tests


class TestOnDevice(TestCase):
    def test_add(self, device):
        a, b = torch.randn(4, 64, dtype=torch.float16), torch.randn(4, 64, dtype=torch.float16)
        self.assertEqual((a.to(device) + b.to(device)).cpu(), a + b, atol=0.1, rtol=0.1)

    def test_device(self, device):
        self.assertEqual(torch.empty(3, device=device).device.type, "spyre")

    def test_views_compare_on_device(self, device):  # test_view_ops' idiom: two spyre tensors in assertEqual
        t = torch.ones((5, 5), device=device)
        v = torch.diagonal(t)
        self.assertTrue(v._is_view() and v._base is t)
        self.assertEqual(v.untyped_storage().data_ptr(), t.untyped_storage().data_ptr())
        v[0] = 0
        self.assertEqual(t[0, 0], v[0])
        t = torch.zeros((5, 5), device=device)
        for idx, row in enumerate(torch.unbind(t)):
            row[0] = idx + 1
            self.assertEqual(t[idx, 0], row[0])
        self.assertEqual(t.t()[0], torch.arange(1.0, 6.0).to(device))

    def test_a_mismatch_fails_the_test(self, device):
        a = torch.zeros(4, 64, dtype=torch.float16, device=device)
        with self.assertRaisesRegex(AssertionError, "Mismatched elements: 4 / 256"):
            self.assertEqual(a, torch.zeros(4, 64, dtype=torch.float16).index_fill(1, torch.tensor([3]), 1).to(device))
        with self.assertRaisesRegex(AssertionError, "The values for attribute 'dtype' do not match"):
            torch.testing.assert_close(a, a.float())


instantiate_device_type_tests(TestOnDevice, globals(), only_for="privateuse1")
if __name__ == "__main__":
    run_tests()
"""


def test_upstream_device_type_tests_instantiate_for_spyre(tmp_path):
    """In a process of its own, as a test file would run: torch.testing._internal changes global test state."""
    pytest.importorskip("expecttest")  # torch.testing._internal needs it (the dev extra installs it)
    script = tmp_path / "test_upstream_style.py"
    script.write_text(UPSTREAM)
    # torch's run_tests writes XML reports (and needs xmlrunner) whenever CI is set, as it is on our CI
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    out = subprocess.run([sys.executable, str(script), "-v"], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    for name in ("test_add", "test_device", "test_views_compare_on_device", "test_a_mismatch_fails_the_test"):
        assert f"{name}_spyre" in out.stderr
    assert "OK" in out.stderr and "Ran 4 tests" in out.stderr
