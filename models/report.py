"""What the demo reports: agreement with CPU fp32, and where a program's simulated time went."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from torch_spyre_emu.profiling import COPY_KINDS, HOST_CODE, KernelRecord, ProfileReport


@dataclass
class Agreement:
    """Spyre greedy tokens judged by the unpatched CPU fp32 model."""

    teacher_forced: float  # share of generated positions where CPU fp32's argmax equals the Spyre token
    matches: list[bool]  # per generated position
    cpu_ids: list[int]  # CPU fp32's own greedy continuation
    first_divergence: int | None  # first step where the greedy token sequences differ (None: identical)

    @property
    def positions(self) -> int:
        return len(self.matches)


@torch.no_grad()
def teacher_forced_predictions(cpu_model, prompt_ids: torch.Tensor, new_ids: list[int]) -> list[int]:
    """Feed prompt + the tokens once; entry t is the model's argmax for the position of new_ids[t]."""
    n = prompt_ids.shape[1]
    seq = torch.cat([prompt_ids, torch.tensor([new_ids[:-1]], dtype=prompt_ids.dtype)], dim=1)
    logits = cpu_model(input_ids=seq, attention_mask=torch.ones_like(seq), use_cache=False).logits
    return logits[0, n - 1 :].argmax(-1).tolist()


def teacher_forced_matches(cpu_model, prompt_ids: torch.Tensor, new_ids: list[int]) -> list[bool]:
    predicted = teacher_forced_predictions(cpu_model, prompt_ids, new_ids)
    return [p == t for p, t in zip(predicted, new_ids, strict=True)]


@torch.no_grad()
def cpu_greedy(
    cpu_model, prompt_ids: torch.Tensor, max_new_tokens: int, eos_token_id: int | None
) -> list[int]:
    out = cpu_model.generate(
        prompt_ids,
        attention_mask=torch.ones_like(prompt_ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
    )
    return out[0, prompt_ids.shape[1] :].tolist()


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def agreement(cpu_model, prompt_ids: torch.Tensor, new_ids: list[int], eos_token_id: int | None) -> Agreement:
    """Teacher-forced top-1 over the generated positions, and CPU fp32's own greedy text.

    Up to the first teacher-forced mismatch the CPU's greedy tokens are the Spyre tokens by definition (same
    prefix, same argmax), so CPU generation only runs from that step on (none at all when every position agrees).
    """
    predicted = teacher_forced_predictions(cpu_model, prompt_ids, new_ids)
    matches = [p == t for p, t in zip(predicted, new_ids, strict=True)]
    k = next((i for i, ok in enumerate(matches) if not ok), None)
    if k is None:
        cpu_ids = list(new_ids)
    else:
        cpu_ids = list(new_ids[:k]) + [predicted[k]]
        left = len(new_ids) - len(cpu_ids)
        if left > 0 and predicted[k] != eos_token_id:
            prefix = torch.cat([prompt_ids, torch.tensor([cpu_ids], dtype=prompt_ids.dtype)], dim=1)
            cpu_ids += cpu_greedy(cpu_model, prefix, left, eos_token_id)
    return Agreement(sum(matches) / len(matches), matches, cpu_ids, first_divergence(new_ids, cpu_ids))


# --- where the time went ---------------------------------------------------------------------------------


def step_class(step: KernelRecord) -> str:
    """Kernel class for breakdowns: the kernel op (matmul, restickify, binary ...), PCIe copies, CPU islands,
    host code between graphs."""
    if step.op in COPY_KINDS:  # a program's copy steps and eager copies
        return "pcie copy"
    if step.program == HOST_CODE:
        return "host code"
    if step.op.startswith("host"):
        return "cpu island"
    return step.op


def class_breakdown(report: ProfileReport) -> dict[str, float]:
    """Simulated us per step class over every step of the report, largest first."""
    out: dict[str, float] = defaultdict(float)
    for s in report.steps:
        out[step_class(s)] += s.duration_us
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


@dataclass
class KernelGroup:
    label: str
    count: int
    total_us: float
    unit_utilization: dict[str, float]


def top_kernels(report: ProfileReport, top: int = 8) -> list[KernelGroup]:
    """Device kernels grouped by (op, fn, shapes): identical kernels (e.g. the same matmul in 30 layers)."""
    groups: dict[tuple, list[KernelRecord]] = defaultdict(list)
    for k in report.kernels:
        groups[(k.op, k.fn, k.shapes)].append(k)
    out = []
    for (op, fn, shapes), ks in groups.items():
        label = f"{op}:{fn}" if fn else op
        label += " " + "x".join(str(list(s)) for s in shapes)
        out.append(KernelGroup(label, len(ks), sum(k.duration_us for k in ks), ks[0].unit_utilization))
    return sorted(out, key=lambda g: -g.total_us)[:top]


def unit_utilization(report: ProfileReport) -> dict[str, float]:
    """Busy share per unit kind (mean over the chip's units of that kind), time-weighted over the programs."""
    total = sum(t.total_ns for t in report.timing_reports)
    if not total:
        return {}
    acc: dict[str, float] = defaultdict(float)
    for t in report.timing_reports:
        for kind, u in t.unit_utilization().items():
            acc[kind] += u * t.total_ns / total
    return dict(acc)


def cpu_islands(report: ProfileReport) -> list[str]:
    """Ops that ran as CPU islands inside the program (fallbacks), by name."""
    return sorted({s.fn or s.name for s in report.steps if s.op.startswith("host")})
