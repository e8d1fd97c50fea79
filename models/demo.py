"""`spyre-emu demo`: real models on emulated Spyre, judged against CPU fp32, with simulated timings.

smollm2: SmolLM2-135M-Instruct (fp16 on the device, adapters applied) answers a chat prompt by greedy decoding
with two static programs (models/generate.py); the unpatched CPU fp32 model judges every token.
minilm: all-MiniLM-L6-v2 embeds a few sentences; the cosine-similarity matrix is compared with CPU fp32's.

Each run writes into the output directory: Perfetto traces, a PNG and summary.json; a smollm2 run also run.json (its
job), steps.jsonl (one line per generated token) and decode_state.safetensors (the KV cache), both written as it
goes so that `--resume` can continue an interrupted run exactly (models/rundir.py).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import shutil
import statistics
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

import adapters
import torch_spyre_emu
from models import plots, report, rundir, text, weights, weights_cache
from models.generate import Generation, StaticGreedy, device_copy
from torch_spyre_emu.profiling import ProfileReport

DEFAULT_PROMPT = "What is the capital of France? Tell me three facts about it."
DEFAULT_SENTENCES = [
    "A man is playing a guitar.",
    "Someone is strumming a guitar.",
    "The stock market fell sharply today.",
    "Share prices dropped this morning.",
    "Paris is the capital of France.",
]
MODELS = ("smollm2", "minilm")


class DemoError(ValueError):
    """The demo was asked for something it cannot do (unknown model, too few tokens ...)."""


def progress(console: Console) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


@contextlib.contextmanager
def _quiet_loaders() -> Iterator[None]:
    """transformers' own tqdm bars and the stack's per-op fallback warnings would drown the rich output."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _hardware(config: str | None):
    from aiu_sim.config import load_config

    return load_config(config or "spyre")


# --- SmolLM2 ------------------------------------------------------------------------------------------------


@dataclass
class ChatResult:
    prompt: str
    answer: str
    generation: Generation
    agreement: report.Agreement
    cpu_answer: str
    hardware: str
    adapters_report: str
    prefill: ProfileReport
    decode: ProfileReport
    files: dict[str, Path] = field(default_factory=dict)
    wall_s: dict[str, float] = field(default_factory=dict)

    @property
    def ttft_us(self) -> float:
        return self.generation.prefill.sim_us

    @property
    def decode_us(self) -> float:
        steps = self.generation.decodes
        return statistics.fmean(s.sim_us for s in steps) if steps else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return 1e6 / self.decode_us


def chat_job(prompt: str, max_new_tokens: int, hw) -> dict:
    """What identifies a chat run in its output directory: --resume continues only the same job."""
    return {
        "model": "SmolLM2-135M-Instruct",
        "weights": f"{weights.SMOLLM2.package}=={weights.package_version(weights.SMOLLM2)}",
        "prompt": prompt,
        "max_new_tokens": max_new_tokens,
        "hardware_config": hw.token,
    }


def run_chat(
    prompt: str = DEFAULT_PROMPT,
    max_new_tokens: int = 32,
    config: str | None = None,
    out: Path = Path("spyre_emu_out"),
    console: Console | None = None,
    resume: bool = False,
) -> ChatResult:
    """resume=True continues the run of the same job in `out` after its last complete step (a new run if there
    is none); a different job there is a ResumeError."""
    console = console or Console()
    if max_new_tokens < 2:
        raise DemoError(
            f"--max-new-tokens must be at least 2 (one prefill and one decode step to time), got {max_new_tokens}"
        )
    hw = _hardware(config)
    run = rundir.RunDirectory(out, chat_job(prompt, max_new_tokens, hw))
    checkpoint = run.resume() if resume else None
    restored = len(checkpoint.steps) if checkpoint else 0
    if resume:
        console.print(
            f"resuming {out} after step {restored} of {max_new_tokens}"
            if checkpoint
            else f"nothing to resume in {out}: starting a new run"
        )
    if checkpoint is None:
        run.start()
    wall: dict[str, float] = {}
    with _quiet_loaders(), progress(console) as bar, torch_spyre_emu.config.use_hardware(hw):
        t0 = time.perf_counter()
        load = bar.add_task("loading SmolLM2-135M-Instruct (real weights, offline)", total=3)
        with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings(record=True) as caught:
            # the GGUF reader's own tqdm bar goes; a weights-cache problem is worth a line
            warnings.simplefilter("always", weights_cache.WeightsCacheWarning)
            cpu_model, tok = weights.load_smollm2()
        for w in caught:
            if issubclass(w.category, weights_cache.WeightsCacheWarning):
                console.print(f"[yellow]warning:[/yellow] {escape(str(w.message))}")
        bar.advance(load)
        model = device_copy(cpu_model, torch.float16)
        bar.advance(load)
        handle = adapters.apply(model)
        bar.advance(load)
        wall["load"] = time.perf_counter() - t0

        ids = text.chat_input_ids(tok, prompt)
        runner = StaticGreedy(model)
        prefill_what = (
            "re-timing the restored prefill program"
            if restored
            else "compiling + running the prefill program"
        )
        compile_prefill = bar.add_task(f"{prefill_what} [1, {-(-ids.shape[1] // 64) * 64}]", total=1)
        compile_decode = bar.add_task("compiling + running the decode program [1, 1]", total=1, start=False)
        gen_task = bar.add_task(
            "generating tokens on emulated Spyre", total=max_new_tokens, completed=restored
        )

        def on_step(rec) -> None:
            if bar.tasks[compile_prefill].completed == 0:
                bar.update(compile_prefill, completed=1)
                bar.stop_task(compile_prefill)
                bar.start_task(compile_decode)
            if rec.kind == "decode" and bar.tasks[compile_decode].completed == 0:
                bar.update(compile_decode, completed=1)
                bar.stop_task(compile_decode)
            bar.advance(gen_task)

        t0 = time.perf_counter()
        gen = run.generate(
            runner,
            ids,
            max_new_tokens,
            eos_token_id=tok.eos_token_id,
            text=lambda token: tok.decode([token]),
            resume_from=checkpoint,
            trace_dir=None,  # the step's traces are written from its report, all its programs in one file
            on_step=on_step,
        )
        wall["generate"] = time.perf_counter() - t0
        bar.update(gen_task, total=len(gen.new_ids), completed=len(gen.new_ids))
        for task in (compile_prefill, compile_decode):  # no step completed them (e.g. a resumed finished run)
            if bar.tasks[task].completed == 0:
                bar.start_task(task)
                bar.update(task, completed=1)
                bar.stop_task(task)

        t0 = time.perf_counter()
        ref = bar.add_task("CPU fp32 reference (teacher-forced + its own greedy text)", total=1)
        agree = report.agreement(cpu_model, ids, gen.new_ids, tok.eos_token_id)
        bar.advance(ref)
        wall["cpu_reference"] = time.perf_counter() - t0
    handle.remove()

    prefill = gen.prefill.report
    # the first decode step with a report: steps restored by --resume have none, unless re-timed
    decode = next((s.report for s in gen.decodes if s.report is not None), prefill)
    result = ChatResult(
        prompt=prompt,
        answer=tok.decode(gen.new_ids, skip_special_tokens=True),
        generation=gen,
        agreement=agree,
        cpu_answer=tok.decode(agree.cpu_ids, skip_special_tokens=True),
        hardware=hw.name,
        adapters_report=str(handle.report),
        prefill=prefill,
        decode=decode,
        wall_s=wall,
    )
    result.files = _write_chat_files(result, out)
    return result


def _move_trace(rep: ProfileReport, dest: Path) -> Path | None:
    """The report's Perfetto trace at `dest`: a one-program report's own file, moved; else one trace of all its
    programs one after the other (a decode step runs a decoder-block program per layer, then the head's)."""
    if len(rep.timing_reports) > 1:
        return _merged_trace(rep, dest)
    if rep.trace_path and Path(rep.trace_path).exists():
        shutil.move(rep.trace_path, dest)
        return dest
    return None


def _merged_trace(rep: ProfileReport, dest: Path) -> Path:
    from aiu_sim.timing.trace import trace_events

    events, seen, t0 = [], set(), 0.0
    for timing in rep.timing_reports:
        for e in trace_events(timing):
            if e.get("ph") == "M":  # track names: the same tracks for every program
                key = json.dumps(e, sort_keys=True)
                if key in seen:
                    continue
                seen.add(key)
            elif "ts" in e:
                e = {**e, "ts": e["ts"] + t0}
            events.append(e)
        t0 += timing.total_us
    other = {"programs": rep.programs, "total_us": rep.total_us, "generator": "models.demo"}
    dest.write_text(
        json.dumps({"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}, separators=(",", ":"))
    )
    return dest


def _write_chat_files(r: ChatResult, out: Path) -> dict[str, Path]:
    files: dict[str, Path] = {"steps": out / rundir.STEPS_FILE, "run": out / rundir.RUN_FILE}
    for name, rep in (("prefill", r.prefill), ("decode", r.decode)):
        moved = _move_trace(rep, out / f"{name}.trace.json")
        if moved:
            files[f"{name} trace"] = moved
    files["plot"] = plots.plot_generation(
        out / "smollm2_demo.png",
        [s.sim_us for s in r.generation.steps],
        {"prefill": report.class_breakdown(r.prefill), "decode step": report.class_breakdown(r.decode)},
        f"SmolLM2-135M-Instruct on emulated Spyre ({r.hardware}): {len(r.generation.new_ids)} tokens",
    )
    summary = {
        "prompt": r.prompt,
        "answer": r.answer,
        "cpu_fp32_answer": r.cpu_answer,
        "new_tokens": len(r.generation.new_ids),
        "teacher_forced_top1": r.agreement.teacher_forced,
        "first_divergence_step": r.agreement.first_divergence,
        "hardware": r.hardware,
        "ttft_us": r.ttft_us,
        "decode_us_per_token": r.decode_us,
        "tokens_per_s": r.tokens_per_s,
        "resumed_after_step": r.generation.resumed_after,
        "prompt_padded_to": r.generation.prompt_pad,
        "cache_slots": r.generation.cache_len,
        "breakdown_us": {
            "prefill": report.class_breakdown(r.prefill),
            "decode": report.class_breakdown(r.decode),
        },
        "unit_utilization": {
            "prefill": report.unit_utilization(r.prefill),
            "decode": report.unit_utilization(r.decode),
        },
        "wall_s": r.wall_s,
    }
    files["summary"] = out / "summary.json"
    files["summary"].write_text(json.dumps(summary, indent=2))
    return files


# --- MiniLM -------------------------------------------------------------------------------------------------


@dataclass
class EmbedResult:
    sentences: list[str]
    spyre: torch.Tensor  # [N, 384] unit-norm
    cpu: torch.Tensor
    hardware: str
    adapters_report: str
    profile: ProfileReport
    files: dict[str, Path] = field(default_factory=dict)
    wall_s: dict[str, float] = field(default_factory=dict)

    @property
    def cosine(self) -> torch.Tensor:
        """Per-sentence cosine between the Spyre and CPU fp32 embeddings."""
        return (self.spyre * self.cpu).sum(-1)


def run_embed(
    sentences: list[str] | None = None,
    config: str | None = None,
    out: Path = Path("spyre_emu_out"),
    console: Console | None = None,
) -> EmbedResult:
    console = console or Console()
    sentences = list(sentences or DEFAULT_SENTENCES)
    hw = _hardware(config)
    out.mkdir(parents=True, exist_ok=True)
    wall: dict[str, float] = {}
    with _quiet_loaders(), progress(console) as bar, torch_spyre_emu.config.use_hardware(hw):
        t0 = time.perf_counter()
        load = bar.add_task("loading all-MiniLM-L6-v2 (real weights, offline)", total=2)
        cpu_model, tok = weights.load_minilm()
        cpu = text.embed(sentences, cpu_model, tok)
        bar.advance(load)
        model = copy.deepcopy(cpu_model).half()
        handle = adapters.apply(model)
        bar.advance(load)
        wall["load"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        batch = dict(tok(sentences, padding=True, pad_to_multiple_of=64, return_tensors="pt"))
        run = bar.add_task(
            f"compiling + running the encoder program [{len(sentences)}, {batch['input_ids'].shape[1]}]",
            total=1,
        )
        compiled = torch.compile(model, backend="spyre", dynamic=False)
        rep = torch_spyre_emu.profile(compiled, mode="both", trace_path=str(out / "traces"), **batch)
        hidden = rep.outputs.last_hidden_state.float()
        spyre = text.mean_pool(hidden, batch["attention_mask"])
        bar.advance(run)
        wall["compile_and_run"] = time.perf_counter() - t0
    handle.remove()
    result = EmbedResult(sentences, spyre, cpu, hw.name, str(handle.report), rep, wall_s=wall)
    trace = _move_trace(rep, out / "minilm.trace.json")
    shutil.rmtree(out / "traces", ignore_errors=True)
    if trace:
        result.files["trace"] = trace
    labels = [s if len(s) <= 24 else s[:22] + ".." for s in sentences]
    result.files["plot"] = plots.plot_similarity(
        out / "minilm_demo.png", spyre @ spyre.T, cpu @ cpu.T, labels, "all-MiniLM-L6-v2 cosine similarity"
    )
    return result


# --- printing -----------------------------------------------------------------------------------------------


def _util_line(rep: ProfileReport) -> str:
    return "  ".join(f"{k} {100 * v:.1f}%" for k, v in report.unit_utilization(rep).items())


def _time_table(title: str, rep: ProfileReport):
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_edge=False)
    table.add_column("kernel group (op / shapes)", overflow="fold")
    table.add_column("count", justify="right")
    table.add_column("us", justify="right")
    table.add_column("share", justify="right")
    table.add_column("PT / SFP / DRAM util", justify="right")
    for g in report.top_kernels(rep, top=6):
        u = g.unit_utilization
        table.add_row(
            escape(g.label),
            str(g.count),
            f"{g.total_us:,.1f}",
            f"{100 * g.total_us / rep.total_us:.1f}%",
            f"{u.get('pt', 0):.2f} / {u.get('sfp', 0):.2f} / {u.get('dram', 0):.2f}",
        )
    return table


def print_chat(r: ChatResult, console: Console) -> None:
    a, gen = r.agreement, r.generation
    console.rule("SmolLM2-135M-Instruct on emulated Spyre")
    console.print(f"[bold]prompt:[/bold] {r.prompt}")
    console.print(
        f"[bold]answer[/bold] ({len(gen.new_ids)} new tokens, greedy, fp16 weights, DL16 arithmetic):"
    )
    console.print(escape("  " + r.answer.replace("\n", "\n  ")))
    console.print()
    console.print("[bold]agreement with CPU fp32[/bold] (same weights, stock model, no adapters):")
    console.print(
        f"  teacher-forced top-1: {100 * a.teacher_forced:.1f}% ({sum(a.matches)}/{a.positions} generated positions "
        "where CPU fp32's argmax is the Spyre token)"
    )
    if a.first_divergence is None:
        console.print("  greedy texts: identical")
    else:
        console.print(
            f"  greedy texts first differ at step {a.first_divergence} (0 = first new token); CPU fp32 says:"
        )
        console.print(escape("  " + r.cpu_answer.replace("\n", "\n  ")))
    console.print()
    console.print(f"[bold]simulated timing[/bold] on chip '{r.hardware}':")
    console.print(
        f"  time to first token (prefill program, prompt of {len(gen.prompt_ids)} tokens padded to {gen.prompt_pad}): "
        f"{r.ttft_us / 1e3:,.2f} ms"
    )
    if gen.decodes:
        console.print(
            f"  decode: {r.decode_us / 1e3:,.2f} ms per token -> {r.tokens_per_s:,.1f} tokens/s "
            f"(one [1, 1] program over a {gen.cache_len}-slot static KV cache)"
        )
    else:
        console.print("  decode: no decode step ran (the answer ended at its first token)")
    uploads = max((r.prefill, r.decode), key=lambda rep: rep.weights_upload_bytes)  # the first program run
    if uploads.weights_upload_bytes:
        console.print(
            f"  weights: {uploads.weights_upload_bytes / 2**20:,.0f} MiB uploaded once "
            f"({uploads.weights_upload_us / 1e3:,.1f} ms PCIe, not counted per token)"
        )
    if gen.resumed_after:
        console.print(
            f"  resumed: steps 0..{gen.resumed_after - 1} restored from the interrupted run (their simulated times "
            "as recorded; the programs were re-timed and agree)"
        )
    console.print()
    for name, rep in (("prefill", r.prefill), ("decode step", r.decode)):
        classes = report.class_breakdown(rep)
        console.print(
            f"[bold]where the {name} time went[/bold] ({rep.total_us / 1e3:,.2f} ms, {len(rep.kernels)} kernels): "
            + ", ".join(f"{c} {100 * us / rep.total_us:.1f}%" for c, us in list(classes.items())[:6])
        )
        console.print(_time_table(f"top kernel groups ({name})", rep))
        console.print(f"  unit utilization: {_util_line(rep)}")
        islands = report.cpu_islands(rep)
        if islands:
            console.print(
                f"  CPU islands (ops without a Spyre lowering, run on the host): {', '.join(islands)}"
            )
        console.print()
    console.print(
        "[bold]what runs where:[/bold] device: 30 decoder layers, final norm, LM head, KV-cache write (one-hot blend); "
        "host: token embedding gather, RoPE table gather, attention mask, argmax (between programs)."
    )
    console.print("[bold]adapters:[/bold] " + escape(r.adapters_report))
    console.print("[bold]wall time:[/bold] " + ", ".join(f"{k} {v:.1f} s" for k, v in r.wall_s.items()))
    console.print("[bold]files:[/bold]")
    for name, path in r.files.items():
        hint = " (open in https://ui.perfetto.dev)" if "trace" in name else ""
        console.print(f"  {name}: {path}{hint}")


def print_embed(r: EmbedResult, console: Console) -> None:
    from rich.table import Table

    console.rule("all-MiniLM-L6-v2 on emulated Spyre")
    n = len(r.sentences)
    sim_s, sim_c = r.spyre @ r.spyre.T, r.cpu @ r.cpu.T
    for i, s in enumerate(r.sentences):
        console.print(f"  {i}: {s}", markup=False)
    # Compact (no box, one space of padding) so both 5x5 matrices fit an 80-column terminal side by side.
    table = Table(
        title="cosine similarity: emulated Spyre | CPU fp32", title_justify="left", box=None, padding=(0, 1)
    )
    table.add_column("", no_wrap=True)
    for j in range(n):
        table.add_column(str(j), justify="right", no_wrap=True, min_width=6)
    table.add_column("|", no_wrap=True)
    for j in range(n):
        table.add_column(str(j), justify="right", no_wrap=True, min_width=6)
    for i in range(n):
        row = (
            [f"{float(sim_s[i, j]):.3f}" for j in range(n)]
            + ["|"]
            + [f"{float(sim_c[i, j]):.3f}" for j in range(n)]
        )
        table.add_row(str(i), *row)
    console.print(table)
    cos = r.cosine
    console.print(
        "per-sentence cosine(Spyre, CPU fp32): "
        + ", ".join(f"{float(c):.5f}" for c in cos)
        + f"  (min {float(cos.min()):.5f}); max |similarity difference| {float((sim_s - sim_c).abs().max()):.4f}"
    )
    rep = r.profile
    console.print(
        f"simulated time on '{r.hardware}': {rep.total_us / 1e3:,.2f} ms for {n} sentences "
        f"({len(rep.kernels)} kernels); by class: "
        + ", ".join(
            f"{c} {100 * us / rep.total_us:.1f}%" for c, us in list(report.class_breakdown(rep).items())[:5]
        )
    )
    console.print(f"unit utilization: {_util_line(rep)}")
    console.print("[bold]adapters:[/bold] " + escape(r.adapters_report))
    console.print("[bold]wall time:[/bold] " + ", ".join(f"{k} {v:.1f} s" for k, v in r.wall_s.items()))
    console.print("[bold]files:[/bold]")
    for name, path in r.files.items():
        hint = " (open in https://ui.perfetto.dev)" if "trace" in name else ""
        console.print(f"  {name}: {path}{hint}")
