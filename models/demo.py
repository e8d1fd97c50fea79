"""`spyre-emu demo`: real models on emulated Spyre, judged against CPU fp32, with simulated timings.

smollm2: SmolLM2-135M-Instruct (fp16 on the device, adapters applied) answers a chat prompt by greedy decoding
with two static programs (models/generate.py); the unpatched CPU fp32 model judges every token.
minilm: all-MiniLM-L6-v2 embeds a few sentences; the cosine-similarity matrix is compared with CPU fp32's.
smollm2 with --tp N: the same chat sharded over N emulated cards (models/tensor_parallel.py), one process per card
launched here with torch's launcher; rank 0 judges the answer and gathers every rank's timing and all-reduce share.

Each run writes into the output directory: Perfetto traces, a PNG and summary.json; a smollm2 run also run.json (its
job), steps.jsonl (one line per generated token) and decode_state.safetensors (the KV cache), both written as it
goes so that `--resume` can continue an interrupted run exactly (models/rundir.py).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import logging
import os
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
from models.generate import Generation, StaticGreedy, cache_length, device_copy
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


# --- SmolLM2 over several cards (tensor parallel) -------------------------------------------------------------


@dataclass
class RankTiming:
    """One rank's share of the model and its simulated times (each rank times its own card)."""

    rank: int
    device: str
    share: str  # TensorParallel.summary(): its heads, KV heads and MLP width
    collectives: str  # where its all-reduces ran: "graph" (Collective steps) or "host" (eager spyreccl)
    prefill_us: float
    decode_us: float  # mean per decode step
    prefill_comm_us: float
    decode_comm_us: float
    all_reduces_per_step: int
    weights_mib: float  # this card's share of the weights (fp16), resident on it
    decode_classes: dict[str, float]
    wall_s: dict[str, float]


@dataclass
class TensorParallelChat:
    """What rank 0 of `spyre-emu demo --tp N` hands back: the answer, its agreement with CPU fp32, every rank's
    timing. The ranks meet at every all-reduce, so a step takes as long as its slowest rank (a lower bound: the
    emulated collectives are timed without waiting for the other cards)."""

    prompt: str
    answer: str
    cpu_answer: str
    agreement: report.Agreement
    tp: int
    hardware: str
    new_tokens: int
    prompt_tokens: int
    prompt_pad: int
    cache_len: int
    adapters_report: str
    ranks: list[RankTiming]
    files: dict[str, Path] = field(default_factory=dict)
    wall_s: dict[str, float] = field(default_factory=dict)
    ended_at: float = 0.0  # wall clock when rank 0 finished (the launcher's return measures the exit from it)

    @property
    def ttft_us(self) -> float:
        return max(r.prefill_us for r in self.ranks)

    @property
    def decode_us(self) -> float:
        return max(r.decode_us for r in self.ranks)

    @property
    def tokens_per_s(self) -> float:
        return 1e6 / self.decode_us


def check_tp(tp: int, model: torch.nn.Module | None = None) -> None:
    """A DemoError naming what is wrong with --tp: 1..8 cards, and (given the model) no more than its heads."""
    from aiu_sim.timing.interconnect import MAX_CARDS
    from models import tensor_parallel

    if not 1 <= tp <= MAX_CARDS:
        raise DemoError(
            f"--tp must be 1..{MAX_CARDS} (spyreccl runs on one node of up to {MAX_CARDS} cards), got {tp}"
        )
    if model is None:
        return
    try:
        tensor_parallel.plan(model, tp)
    except tensor_parallel.TensorParallelError as e:
        raise DemoError(f"--tp {tp}: {e}") from None


def run_chat_tp(
    prompt: str = DEFAULT_PROMPT,
    max_new_tokens: int = 32,
    config: str | None = None,
    out: Path = Path("spyre_emu_out"),
    console: Console | None = None,
    tp: int = 2,
) -> TensorParallelChat:
    """SmolLM2 sharded over `tp` emulated cards: launches one process per card with torch's own launcher
    (torch.distributed.launcher, as torchrun does: a c10d rendezvous, RANK/LOCAL_RANK/WORLD_SIZE per process,
    AIU_WORLD_SIZE=tp); rank 0 shows the progress and returns the result."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    console = console or Console()
    if max_new_tokens < 2:
        raise DemoError(
            f"--max-new-tokens must be at least 2 (one prefill and one decode step to time), got {max_new_tokens}"
        )
    _hardware(config)  # a bad --config or --tp fails here, before any process starts
    check_tp(tp)
    with _quiet_loaders(), contextlib.redirect_stderr(io.StringIO()):
        # de-quantized once here (if the weights cache is cold), so the ranks only read the cache
        cpu_model, tok = weights.load_smollm2()
    check_tp(tp, cpu_model)
    cache_length(text.chat_input_ids(tok, prompt).shape[1], max_new_tokens, cpu_model.config)
    out.mkdir(parents=True, exist_ok=True)
    job = {"prompt": prompt, "max_new_tokens": max_new_tokens, "config": config, "out": str(out), "tp": tp}
    job["launched_at"] = time.time()  # wall clock: the ranks measure their start-up (spawn, imports) from it
    launch = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=tp,
        run_id=f"spyre-emu-demo-{os.getpid()}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # torchrun --standalone: a free port on this machine
        max_restarts=0,
        monitor_interval=0.5,
    )
    # each process is one card; the cores are shared out so the ranks' numba/OpenMP pools do not oversubscribe them
    threads = str(max(1, (os.cpu_count() or 1) // tp))
    env = {
        "AIU_WORLD_SIZE": str(tp),  # the emulated cards, as the real stack reads it
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads),
        "NUMBA_NUM_THREADS": os.environ.get("NUMBA_NUM_THREADS", threads),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the spawned processes inherit it
    console.print(
        f"launching {tp} processes, one per emulated card (torch.distributed.launcher, c10d rendezvous)"
    )
    t0 = time.perf_counter()
    # the launcher logs a failed rank's traceback and the terminations that follow; the CLI says it in one line
    loggers = [logging.getLogger(n) for n in ("torch.distributed.elastic", "torch.multiprocessing")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        results = elastic_launch(launch, _tp_rank)(job)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        raise DemoError(f"rank {rank} of {tp} failed: {_failure_line(failure)}") from None
    except SignalException as e:  # Ctrl-C or a kill: the launcher stopped the ranks
        raise DemoError(f"interrupted by {e.sigval.name}: the {tp} processes were stopped") from None
    finally:
        for lg, lvl in zip(loggers, levels, strict=True):
            lg.setLevel(lvl)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    result: TensorParallelChat = results[0]
    result.wall_s["processes' exit"] = time.time() - result.ended_at
    result.wall_s["total (launch to last rank)"] = time.perf_counter() - t0
    result.files["summary"] = out / "summary.json"
    result.files["summary"].write_text(json.dumps(_tp_summary(result), indent=2))
    return result


def _failure_line(failure) -> str:
    """The exception line of a failed rank (its error file, which the launcher's record() writes), else its exit
    code."""
    data = failure.error_file_data if isinstance(failure.error_file_data, dict) else {}
    message = data.get("message", {})
    text = message.get("message", "") if isinstance(message, dict) else str(message)
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else f"exit code {failure.exitcode}"


def _tp_rank(job: dict) -> TensorParallelChat | None:
    """One card of `spyre-emu demo --tp N` (a spawned process, so module level; the launcher records its
    exception for the parent): its shard of SmolLM2 in fp16 on spyre:LOCAL_RANK, the adapters, the static decode
    loop; rank 0 gathers every rank's timing and judges the tokens against the unsharded CPU fp32 model."""
    import torch.distributed as dist

    from models.tensor_parallel import tensor_parallel

    warnings.simplefilter("ignore")
    wall = {"start-up (spawn, imports)": time.time() - job["launched_at"]}
    t0 = time.perf_counter()
    dist.init_process_group("cpu:gloo,spyre:spyreccl")
    wall["process group"] = time.perf_counter() - t0
    try:
        rank, tp, out = dist.get_rank(), job["tp"], Path(job["out"])
        console = Console(soft_wrap=True, highlight=False) if rank == 0 else Console(file=io.StringIO())
        hw = _hardware(job["config"])
        with _quiet_loaders(), progress(console) as bar, torch_spyre_emu.config.use_hardware(hw):
            t0 = time.perf_counter()
            load = bar.add_task(f"loading SmolLM2-135M-Instruct, sharding it over {tp} cards", total=1)
            with contextlib.redirect_stderr(io.StringIO()):
                cpu_model, tok = weights.load_smollm2()
            model = device_copy(cpu_model, torch.float16)
            shard = tensor_parallel(model, world_size=tp)
            handle = adapters.apply(model)  # on the CPU, before the move, as hf-adapters prepare a model
            model.to("spyre")  # this process's card: spyre:LOCAL_RANK
            bar.advance(load)
            wall["load"] = time.perf_counter() - t0

            ids = text.chat_input_ids(tok, job["prompt"])
            steps = bar.add_task(
                f"compiling + generating on {tp} emulated cards (rank 0 shown)", total=job["max_new_tokens"]
            )
            t0 = time.perf_counter()
            on_step = lambda rec: bar.advance(steps)  # noqa: E731
            runner = StaticGreedy(model)
            gen = runner.generate(ids, job["max_new_tokens"], eos_token_id=tok.eos_token_id, on_step=on_step)
            wall["generate"] = time.perf_counter() - t0
            bar.update(steps, total=len(gen.new_ids), completed=len(gen.new_ids))
            prefill = gen.prefill.report
            decode = next((s.report for s in gen.decodes if s.report is not None), prefill)
            files = {}
            for name, rep in (("prefill", prefill), ("decode", decode)):
                moved = _move_trace(rep, out / f"tp{tp}_rank{rank}_{name}.trace.json")
                if moved:
                    files[f"rank {rank} {name} trace"] = moved
            mine = RankTiming(
                rank=rank,
                device=str(model.lm_head.weight.device),
                share=shard.summary(),
                collectives=shard.collectives,
                prefill_us=gen.prefill.sim_us,
                decode_us=statistics.fmean(s.sim_us for s in gen.decodes) if gen.decodes else float("nan"),
                prefill_comm_us=prefill.collective_us,
                decode_comm_us=decode.collective_us,
                all_reduces_per_step=len(decode.collectives),
                weights_mib=sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20,
                decode_classes=report.class_breakdown(decode),
                wall_s=wall,
            )
            gathered = [None] * tp if rank == 0 else None
            dist.gather_object((mine, files), gathered, dst=0)
            if rank != 0:
                return None
            t0 = time.perf_counter()
            ref = bar.add_task("CPU fp32 reference (teacher-forced + its own greedy text)", total=1)
            agree = report.agreement(cpu_model, ids, gen.new_ids, tok.eos_token_id)
            bar.advance(ref)
            wall["cpu_reference"] = time.perf_counter() - t0
        all_files: dict[str, Path] = {}
        for _, f in gathered:
            all_files.update(f)
        return TensorParallelChat(
            prompt=job["prompt"],
            answer=tok.decode(gen.new_ids, skip_special_tokens=True),
            cpu_answer=tok.decode(agree.cpu_ids, skip_special_tokens=True),
            agreement=agree,
            tp=tp,
            hardware=hw.name,
            new_tokens=len(gen.new_ids),
            prompt_tokens=len(gen.prompt_ids),
            prompt_pad=gen.prompt_pad,
            cache_len=gen.cache_len,
            adapters_report=str(handle.report),
            ranks=[m for m, _ in gathered],
            files=all_files,
            wall_s={f"rank 0 {k}": v for k, v in wall.items()},
            ended_at=time.time(),
        )
    finally:
        dist.destroy_process_group()


def _tp_summary(r: TensorParallelChat) -> dict:
    return {
        "prompt": r.prompt,
        "answer": r.answer,
        "cpu_fp32_answer": r.cpu_answer,
        "tp": r.tp,
        "new_tokens": r.new_tokens,
        "teacher_forced_top1": r.agreement.teacher_forced,
        "first_divergence_step": r.agreement.first_divergence,
        "hardware": r.hardware,
        "ttft_us": r.ttft_us,
        "decode_us_per_token": r.decode_us,
        "tokens_per_s": r.tokens_per_s,
        "ranks": [dataclasses.asdict(x) for x in r.ranks],
        "wall_s": r.wall_s,
    }


def _move_trace(rep: ProfileReport, dest: Path) -> Path | None:
    """The report's Perfetto trace at `dest`: a one-program report's own file, moved; else one trace of all its
    programs one after the other (a decode step runs a decoder-block program per layer, then the head's) with the
    host code between them where the report's timeline has it."""
    if len(rep.timing_reports) > 1 or rep.host_code:
        return _merged_trace(rep, dest)
    if rep.trace_path and Path(rep.trace_path).exists():
        shutil.move(rep.trace_path, dest)
        return dest
    return None


def _merged_trace(rep: ProfileReport, dest: Path) -> Path:
    from aiu_sim.timing.trace import host_step_event, trace_events, write_trace_json
    from torch_spyre_emu.profiling import HOST_CODE

    # a decode step runs one decoder-block program per layer, timed once (the runtime memoizes a program's timing
    # report): its events are made once per distinct report and shifted to each occurrence
    timed: dict[int, list[dict]] = {}  # id of a distinct report -> its timed events
    events, seen = [], set()
    for timing, t0 in zip(rep.timing_reports, rep.program_starts_us, strict=True):
        if id(timing) not in timed:
            timed[id(timing)] = []
            for e in trace_events(timing):
                if e.get("ph") != "M":
                    timed[id(timing)].append(e)
                    continue
                key = json.dumps(e, sort_keys=True)  # track names: the same tracks for every program
                if key not in seen:
                    seen.add(key)
                    events.append(e)
        events += [{**e, "ts": e["ts"] + t0} if "ts" in e else e for e in timed[id(timing)]]
    # the host code between the programs (an adapter's host lookup), where the profile's timeline has it
    events += [host_step_event(s.name, s.start_us, s.end_us, {"op": s.op}) for s in rep.steps if s.program == HOST_CODE]
    other = {"programs": rep.programs, "total_us": rep.total_us, "generator": "models.demo"}
    return write_trace_json({"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}, dest)


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


def _print_footer(adapters_report: str, wall_s: dict[str, float], files: dict[str, Path], console: Console) -> None:
    """The last lines of every demo: adapters, wall time, the files written."""
    console.print("[bold]adapters:[/bold] " + escape(adapters_report))
    console.print("[bold]wall time:[/bold] " + ", ".join(f"{k} {v:.1f} s" for k, v in wall_s.items()))
    console.print("[bold]files:[/bold]")
    for name, path in files.items():
        hint = " (open in https://ui.perfetto.dev)" if "trace" in name else ""
        console.print(f"  {name}: {path}{hint}")


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
        f"  time to first token (host inputs + prefill program, prompt of {len(gen.prompt_ids)} tokens padded to {gen.prompt_pad}): "
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
    _print_footer(r.adapters_report, r.wall_s, r.files, console)


def print_chat_tp(r: TensorParallelChat, console: Console) -> None:
    from rich.table import Table

    a = r.agreement
    console.rule(f"SmolLM2-135M-Instruct on {r.tp} emulated Spyre cards (tensor parallel)")
    console.print(f"[bold]prompt:[/bold] {escape(r.prompt)}")
    console.print(
        f"[bold]answer[/bold] ({r.new_tokens} new tokens, greedy, fp16 weights, DL16 arithmetic, from rank 0; every "
        "rank holds the same logits after the last all-reduce):"
    )
    console.print(escape("  " + r.answer.replace("\n", "\n  ")))
    console.print()
    console.print("[bold]agreement with CPU fp32[/bold] (same weights, unsharded stock model, no adapters):")
    console.print(
        f"  teacher-forced top-1: {100 * a.teacher_forced:.1f}% ({sum(a.matches)}/{a.positions} generated positions)"
    )
    if a.first_divergence is None:
        console.print("  greedy texts: identical")
    else:
        console.print(f"  greedy texts first differ at step {a.first_divergence}; CPU fp32 says:")
        console.print(escape("  " + r.cpu_answer.replace("\n", "\n  ")))
    console.print()
    console.print(
        f"[bold]simulated timing per rank[/bold] on chip '{r.hardware}' (prompt of {r.prompt_tokens} tokens padded "
        f"to {r.prompt_pad}, {r.cache_len}-slot static KV cache):"
    )
    for x in r.ranks:
        console.print(f"  {escape(x.share)}; {x.weights_mib:,.0f} MiB of weights on {x.device}")
    table = Table(show_edge=False)
    for col in ("rank", "prefill ms", "decode ms/token", "all-reduce ms/token", "all-reduces/token"):
        table.add_column(col, justify="right")
    for x in r.ranks:
        table.add_row(
            str(x.rank),
            f"{x.prefill_us / 1e3:,.2f}",
            f"{x.decode_us / 1e3:,.2f}",
            f"{x.decode_comm_us / 1e3:,.3f} ({100 * x.decode_comm_us / x.decode_us:.1f}%)",
            f"{x.all_reduces_per_step} ({x.collectives})",
        )
    console.print(table)
    comm_prefill = max(x.prefill_comm_us for x in r.ranks)
    console.print(
        f"  time to first token {r.ttft_us / 1e3:,.2f} ms (of it all-reduces {comm_prefill / 1e3:,.2f} ms), decode "
        f"{r.decode_us / 1e3:,.2f} ms per token -> {r.tokens_per_s:,.1f} tokens/s: the slowest rank, since the ranks "
        "meet at every all-reduce"
    )
    slowest = max(r.ranks, key=lambda x: x.decode_us)
    total = sum(slowest.decode_classes.values())
    console.print(
        f"  where rank {slowest.rank}'s decode step went: "
        + ", ".join(f"{c} {100 * us / total:.1f}%" for c, us in list(slowest.decode_classes.items())[:6])
    )
    console.print(
        "  all-reduces: two per decoder layer (after attention's o_proj and the MLP's down_proj), timed by the "
        "interconnect model (aiu_sim.timing.interconnect: PCIe Gen5 x16 per card, assumed ring algorithm)"
    )
    _print_footer(r.adapters_report, r.wall_s, r.files, console)


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
    _print_footer(r.adapters_report, r.wall_s, r.files, console)
