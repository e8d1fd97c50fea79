"""A matmul of two dtypes is a typed error naming the op, the dtypes, the module and what to do (issue 10 §5: MRA's
fp32 attention output met fp16 weights and died in mm_to_bmm with a plain RuntimeError)."""

import pytest
import torch

from torch_spyre_emu.errors import SpyreDtypeMismatchError


class _Fp32Attention(torch.nn.Module):
    """What MRA does: the attention computes in fp32 (.float()) and hands the result to an fp16 projection."""

    def __init__(self):
        super().__init__()
        self.dense = torch.nn.Linear(64, 64)

    def forward(self, x):
        return self.dense(x.float())


def test_mixed_dtype_linear_is_a_typed_error():
    model = _Fp32Attention().half()
    x = torch.randn(4, 64, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="same dtype"):  # not runnable on the CPU either
        model(x)
    with pytest.raises(
        SpyreDtypeMismatchError, match=r"mm in dense multiplies float32 \[4, 64\] by float16"
    ) as e:
        torch.compile(model, backend="spyre")(x)
    assert "x.to(weight.dtype)" in str(e.value)


def test_mixed_dtype_matmul_of_activations_is_a_typed_error():
    a, b = torch.randn(4, 64), torch.randn(64, 64, dtype=torch.float16)
    with pytest.raises(SpyreDtypeMismatchError, match="float32 .* by float16 .*one dtype"):
        torch.compile(lambda p, q: p @ q, backend="spyre")(a, b)
