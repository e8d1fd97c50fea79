"""ProgramBuilder: assemble a KernelProgram step by step, with a work-division policy filling in kernel splits.

The default policy, `equal_split`, is torch-spyre's pass 3 (STACK §1.4) in miniature: output dims are split first,
largest first, each by a divisor of its size (in sticks for stick dims), then at most one reduction dim (matmul and
reduce only) with the cores that remain; every core gets the same number of sticks. Among such splits it takes the
one that keeps the most cores busy (a small exhaustive search: the divisor combinations under 32 cores are few), and
among those the one whose cores read the fewest input elements each. It does not model costs beyond that (pass 2) or
enforce the span rule (validation checks that).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from aiu_sim.config import HardwareConfig, load_config
from aiu_sim.errors import ProgramError
from aiu_sim.ir.ops import OpGroup
from aiu_sim.ir.program import (
    Arg,
    Buffer,
    DeviceToHost,
    HostOp,
    HostToDevice,
    Kernel,
    KernelProgram,
    stick_dims,
)
from aiu_sim.numerics.formats import DEFAULT_HOST_DTYPE as HOST_DTYPE  # format -> default host dtype

SplitPolicy = Callable[[Kernel, dict[str, Buffer], int], dict[str, int]]
ArgSpec = Arg | tuple


def equal_split(kernel: Kernel, buffers: dict[str, Buffer], num_cores: int) -> dict[str, int]:
    """Equal-stick work division over at most `num_cores` cores (see the module docstring).

    Among the splits that divide whole sticks, it picks the one using the most cores, then the one with the most
    cores on output dims (a K split costs a partial-sum combine), then larger splits of the larger dims."""
    sticky = stick_dims(kernel, buffers)
    units = {d: (math.ceil(n / sticky[d]) if d in sticky else n) for d, n in kernel.space.items()}
    out_dims = sorted((d for d in kernel.space if d not in kernel.reduce_dims), key=lambda d: -units[d])
    k_dims = []
    if kernel.op in OpGroup.ACCUMULATING and kernel.reduce_dims:
        k_dims = [max(kernel.reduce_dims, key=lambda d: units[d])]  # at most one reduce dim may be split
    best: tuple = ()
    best_split: dict[str, int] = {}

    def search(i: int, left: int, chosen: list[int]) -> None:
        nonlocal best, best_split
        if i == len(out_dims):
            k_pieces = [_largest_divisor(units[d], left) for d in k_dims]
            out_cores = math.prod(chosen)
            split = dict(zip(out_dims + k_dims, chosen + k_pieces, strict=True))
            # Then output dims before K (a K split costs a partial-sum combine); then the fewest input elements read
            # per core: splitting a prefill
            # projection on tokens would make every core stream the whole weight through its LX port.
            score = (
                out_cores * math.prod(k_pieces),
                out_cores,
                -_input_elems_per_core(kernel, split),
                tuple(chosen),
            )
            if score > best:
                best = score
                best_split = {
                    d: n for d, n in zip(out_dims + k_dims, chosen + k_pieces, strict=True) if n > 1
                }
            return
        for pieces in _divisors(units[out_dims[i]], left):
            search(i + 1, left // pieces, [*chosen, pieces])

    search(0, num_cores, [])
    return best_split


def _input_elems_per_core(kernel: Kernel, split: dict[str, int]) -> float:
    total = 0.0
    for arg in kernel.inputs:
        total += math.prod(kernel.space[d] / split.get(d, 1) for d in arg.dims if d is not None)
    return total


def single_core(kernel: Kernel, buffers: dict[str, Buffer], num_cores: int) -> dict[str, int]:
    return {}


POLICIES: dict[str, SplitPolicy] = {"equal": equal_split, "single": single_core}


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(min(n, limit), 0, -1) if n % d == 0]


def _largest_divisor(n: int, limit: int) -> int:
    for d in range(min(n, limit), 0, -1):
        if n % d == 0:
            return d
    return 1


class ProgramBuilder:
    """Collects buffers and steps; `build()` returns the validated KernelProgram."""

    def __init__(
        self,
        name: str,
        config: HardwareConfig | str | None = None,
        split_policy: str | SplitPolicy = "equal",
    ) -> None:
        self.name = name
        self.config = load_config(config)
        if isinstance(split_policy, str):
            if split_policy not in POLICIES:
                raise ProgramError(
                    f"unknown split policy {split_policy!r}; known: {sorted(POLICIES)} or a callable"
                )
            split_policy = POLICIES[split_policy]
        self.split_policy = split_policy
        self.buffers: dict[str, Buffer] = {}
        self.steps: list = []
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.constants: dict[str, np.ndarray] = {}

    def buffer(self, name: str, dtype: str, shape: Sequence[int], **kwargs) -> str:
        if name in self.buffers:
            raise ProgramError(f"buffer {name!r} is declared twice")
        self.buffers[name] = Buffer(name, dtype, tuple(shape), **kwargs)
        return name

    def constant(self, buffer: str, values) -> None:
        self.constants[buffer] = np.asarray(values)

    def host_input(self, host_name: str, buffer: str, host_dtype: str | None = None) -> None:
        dtype = host_dtype or HOST_DTYPE[self.buffers[buffer].dtype]
        self.steps.append(HostToDevice(f"load_{host_name}", host_name, buffer, dtype))
        self.inputs.append(host_name)

    def host_output(self, buffer: str, host_name: str, host_dtype: str | None = None) -> None:
        dtype = host_dtype or HOST_DTYPE[self.buffers[buffer].dtype]
        self.steps.append(DeviceToHost(f"store_{host_name}", buffer, host_name, dtype))
        self.outputs.append(host_name)

    def host_op(self, name: str, fn: str, inputs: list[str], outputs: list[str], **attrs) -> None:
        self.steps.append(HostOp(name, fn, list(inputs), list(outputs), attrs))

    def kernel(
        self,
        name: str,
        op: str,
        inputs: Sequence[ArgSpec],
        outputs: Sequence[ArgSpec],
        space: dict[str, int],
        *,
        fn: str | None = None,
        reduce_dims: Sequence[str] = (),
        attrs: dict | None = None,
        split: dict[str, int] | None = None,
        cores: Sequence[int] | None = None,
        reduction_order: str = "chain",
    ) -> Kernel:
        """Add a kernel. Args are Arg objects or (buffer, dims[, offset]) tuples. split=None asks the policy."""
        fields = dict(
            name=name,
            op=op,
            inputs=[_arg(a) for a in inputs],
            outputs=[_arg(a) for a in outputs],
            space=dict(space),
            fn=fn,
            reduce_dims=tuple(reduce_dims),
            attrs=dict(attrs or {}),
            reduction_order=reduction_order,
        )
        if split is None:
            for arg in [*fields["inputs"], *fields["outputs"]]:
                if arg.buffer not in self.buffers:
                    raise ProgramError(f"kernel {name!r}: buffer {arg.buffer!r} is not declared")
            split = self.split_policy(Kernel(**fields), self.buffers, self.config.num_cores)
        kernel = Kernel(**fields, split=split, cores=tuple(cores) if cores is not None else None)
        self.steps.append(kernel)
        return kernel

    def build(self) -> KernelProgram:
        return KernelProgram(
            self.name,
            dict(self.buffers),
            list(self.steps),
            inputs=list(self.inputs),
            outputs=list(self.outputs),
            constants=dict(self.constants),
            config=self.config,
        )


def _arg(spec: ArgSpec) -> Arg:
    if isinstance(spec, Arg):
        return spec
    return Arg(*spec)
