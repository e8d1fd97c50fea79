"""The `spyre-emu` command line (typer + rich)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from models.zoo.catalog import FAMILIES, MODALITIES, TASKS

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Spyre hardware simulator and torch-spyre stack emulator.",
)
console = Console(soft_wrap=True, highlight=False)


@app.command()
def info(
    config: str = typer.Option("spyre", help="Preset name (spyre, small) or path to a hardware TOML file."),
) -> None:
    """Print the simulated chip."""
    console.print(_load_config_or_exit(config).summary())


@app.command()
def simulate(
    m: int = typer.Option(512, help="Rows of A."),
    k: int = typer.Option(4096, help="Reduction size."),
    n: int = typer.Option(4096, help="Columns of B."),
    config: str = typer.Option("spyre", help="Preset name or hardware TOML path."),
    trace: Path = typer.Option(
        Path("spyre_emu_out/simulate.trace.json"), help="Where to write the Perfetto trace."
    ),
) -> None:
    """Time one fp16 matmul on the simulated chip (aiu_sim alone, no torch) and print where the time went."""
    from aiu_sim import run
    from aiu_sim.builders import matmul_program
    from aiu_sim.errors import AiuSimError
    from aiu_sim.timing.summary import format_summary

    for flag, size in (("--m", m), ("--k", k), ("--n", n)):
        if size < 1:
            console.print(f"[red]error:[/red] {flag} must be at least 1 (a matmul dimension), got {size}")
            raise typer.Exit(2)
    cfg = _load_config_or_exit(config)
    try:
        program = matmul_program(m, k, n, config=cfg)
        trace.parent.mkdir(parents=True, exist_ok=True)
        result = run(program, {}, config=cfg, mode="timing", trace_path=str(trace))
    except AiuSimError as e:  # e.g. a matmul the chip cannot hold
        console.print(f"[red]error:[/red] {escape(str(e))}")
        raise typer.Exit(2) from None
    console.print(format_summary(result.timing))
    console.print(f"trace: {trace} (open in https://ui.perfetto.dev)")


@app.command()
def demo(
    model: str = typer.Option(
        "smollm2", help="Which demo: smollm2 (chat answer) or minilm (sentence embeddings)."
    ),
    prompt: str = typer.Option(None, help="Chat prompt for smollm2 (default: a question about France)."),
    max_new_tokens: int = typer.Option(
        32, help="Greedy tokens to generate (smollm2; stops early at end-of-turn)."
    ),
    config: str = typer.Option("spyre", help="Preset name (spyre, small) or path to a hardware TOML file."),
    out: Path = typer.Option(Path("spyre_emu_out"), help="Output directory for traces, plot and summary."),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="smollm2: continue the interrupted run in --out after its last complete step (same prompt, "
        "--max-new-tokens and --config; another job there is an error). Starts a new run if there is none.",
    ),
    tp: int = typer.Option(
        1,
        "--tp",
        help="smollm2: tensor-parallel degree: shard the model over this many emulated cards, one process per card "
        "(1..8; launched for you), and print every rank's timing with its all-reduce share.",
    ),
) -> None:
    """The main job: a real model on emulated Spyre, compared with CPU fp32, with simulated timings."""
    from models import demo as demo_mod
    from models.generate import GenerationError
    from models.weights import WeightsNotInstalledError

    if model not in demo_mod.MODELS:
        console.print(
            f"[red]error:[/red] unknown --model {model!r}; choose one of: {', '.join(demo_mod.MODELS)}"
        )
        raise typer.Exit(2)
    if resume and model != "smollm2":
        console.print(
            f"[red]error:[/red] --resume applies to the smollm2 demo only (--model {model} is one program)"
        )
        raise typer.Exit(2)
    if tp != 1 and (model != "smollm2" or resume):
        why = "a tensor-parallel run cannot be resumed" if resume else f"--model {model} runs on one card"
        console.print(f"[red]error:[/red] --tp applies to a fresh smollm2 run only ({why})")
        raise typer.Exit(2)
    _load_config_or_exit(config)
    try:
        if tp != 1:
            result = demo_mod.run_chat_tp(
                prompt or demo_mod.DEFAULT_PROMPT, max_new_tokens, config, out, console, tp
            )
            demo_mod.print_chat_tp(result, console)
        elif model == "smollm2":
            result = demo_mod.run_chat(
                prompt or demo_mod.DEFAULT_PROMPT, max_new_tokens, config, out, console, resume=resume
            )
            demo_mod.print_chat(result, console)
        else:
            demo_mod.print_embed(demo_mod.run_embed(None, config, out, console), console)
    except (WeightsNotInstalledError, GenerationError, demo_mod.DemoError) as e:
        console.print(f"[red]error:[/red] {escape(str(e))}")  # messages quote prompts and configs: no markup
        raise typer.Exit(2) from None


@app.command()
def sweep(
    results: Path = typer.Option(None, help="The JSONL results file (default: spyre_emu_out/zoo/results.jsonl)."),
    resume: bool = typer.Option(False, "--resume", help="Skip the models already in --results and append."),
    workers: int = typer.Option(1, help="Models run at once, each in its own process."),
    ray: bool = typer.Option(False, "--ray", help="Run the models as Ray tasks (a local Ray instance)."),
    ray_address: str = typer.Option(None, help="Run on this Ray cluster (implies --ray)."),
    only: str = typer.Option(None, help="Comma list of model types (default: all of them)."),
    family: str = typer.Option(None, help=f"Only this architecture family ({', '.join(FAMILIES)})."),
    modality: str = typer.Option(None, help=f"Only this modality ({', '.join(MODALITIES)})."),
    task: str = typer.Option(None, help=f"Only this task ({', '.join(TASKS)})."),
    variant: str = typer.Option("default", help="default (whole-stick widths), ragged, or both."),
    timeout: float = typer.Option(
        None, help="Wall limit per model in seconds (default: DEFAULT_TIMEOUT_S of models/zoo/sweep.py)."
    ),
    mem_gb: float = typer.Option(
        None, help="Resident memory cap per model in GiB (default: DEFAULT_MEM_GB of models/zoo/sweep.py)."
    ),
    report: bool = typer.Option(False, "--report", help="Write the coverage report from --results; run nothing."),
    rerun: list[Path] = typer.Option(
        None,
        "--rerun",
        help="With --report: the results of a later partial re-sweep (repeatable); each record replaces --results'"
        " record of the same model type and variant.",
    ),
    out: Path = typer.Option(
        None, help="Where --report writes the report and plots (default: the folder of --results)."
    ),
    list_types: bool = typer.Option(False, "--list", help="Print the model types the zoo knows and exit."),
    audit: bool = typer.Option(
        False,
        "--audit",
        help="Only the adapter audit per model: every adapter applied on the CPU in fp32 against the stock output,"
        " nothing compiled (default --results: spyre_emu_out/zoo/audit.jsonl; with --report: adapter_audit.md).",
    ),
) -> None:
    """Run every HuggingFace model type (tiny, random weights) on emulated Spyre and classify it; --report writes
    the coverage matrix, class counts and plots."""
    from models.zoo import sweep as sw

    if results is None:
        results = sw.DEFAULT_AUDIT_RESULTS if audit else sw.DEFAULT_RESULTS
    try:
        if list_types:
            from models.zoo.catalog import model_types

            console.print("\n".join(model_types()))
            return
        if report:
            _sweep_report(results, results.parent if out is None else out, rerun or [], audit)
            return
        timeout = sw.DEFAULT_TIMEOUT_S if timeout is None else timeout
        mem_gb = sw.DEFAULT_MEM_GB if mem_gb is None else mem_gb
        result = sw.sweep(
            sw.select_tasks(only, variant),
            results,
            workers=workers,
            resume=resume,
            timeout_s=timeout,
            mem_gb=mem_gb,
            family=family,
            modality=modality,
            task=task,
            ray=ray,
            ray_address=ray_address,
            console=console,
            audit=audit,
        )
    except sw.SweepError as e:
        console.print(f"[red]error:[/red] {escape(str(e))}")
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        console.print(f"interrupted: every finished model is in {escape(str(results))}; --resume continues")
        raise typer.Exit(130) from None
    counts = ", ".join(f"{c} {n}" for c, n in sw.ordered_counts(result.counts)) or "nothing new"
    filtered = f", {result.filtered} filtered out by --family/--modality/--task" if result.filtered else ""
    console.print(
        f"{result.ran} models in {result.wall_s:.0f} s ({result.skipped} already done{filtered}): {counts}\n"
        + escape(
            f"results: {results}; the report: spyre-emu sweep{' --audit' if audit else ''} --report --results {results}"
        )
    )
    if result.lost:
        console.print(
            f"[yellow]{len(result.lost)} tasks were lost by the runner (not recorded; --resume reruns them):[/yellow] "
            + escape("; ".join(f"{t.model_type}: {why}" for t, why in result.lost[:5]))
        )


@app.command()
def plan(
    model: str = typer.Argument(
        ..., help="A zoo model type (e.g. llama), a directory with a config.json, or smollm2 / minilm."
    ),
    variant: str = typer.Option("default", help="Zoo variant: default (whole-stick widths) or ragged."),
    json_out: str = typer.Option(
        None,
        "--json",
        help="Also write the plan as a JSON document to this file ('-': stdout, nothing else).",
    ),
    strict_run: bool = typer.Option(
        True, "--strict-run/--no-strict-run", help="Compile and run with the adapters in strict mode."
    ),
    seed: int = typer.Option(0, help="Seed of the random weights and inputs."),
) -> None:
    """What blocks one model on the stack: the ops it cannot lower yet and where, which adapters bridge what, the
    gaps nothing bridges, and the strict-mode result (format of --json: docs/zoo.md, "spyre-emu plan")."""
    from models.weights import WeightsNotInstalledError
    from models.zoo import plan as plan_mod
    from models.zoo.catalog import VARIANTS
    from models.zoo.recipes import ZooBuildError

    if variant not in VARIANTS:
        console.print(
            f"[red]error:[/red] unknown --variant {variant!r}; choose one of: {', '.join(VARIANTS)}"
        )
        raise typer.Exit(2)
    try:
        target = plan_mod.resolve(model, variant, seed)
    except (plan_mod.PlanInputError, ZooBuildError, WeightsNotInstalledError) as e:
        console.print(f"[red]error:[/red] {escape(str(e).splitlines()[0])}")
        raise typer.Exit(2) from None
    doc = plan_mod.make_plan(target, strict_run=strict_run)
    if json_out != "-":
        console.print(escape(plan_mod.format_plan(doc)))
    if json_out:
        plan_mod.write_json(doc, json_out)
        if json_out != "-":
            console.print(escape(f"plan written to {json_out}"))
    if doc["status"] != "ok":
        raise typer.Exit(1)


@app.command()
def whatif(
    set_: list[str] = typer.Option(
        [], "--set", help="A HardwareConfig field and its values, FIELD=V1,V2,... (repeat: the grid is the product)."
    ),
    model: str = typer.Option(
        "llama-3.1-8b", help="Comma list: llama-3.1-8b, granite-3.3-8b, mistral-7b, mixtral-8x7b (synthetic shapes)."
    ),
    prefill: str = typer.Option("512", help="Comma list of prefill lengths ('' for none)."),
    decode_kv: str = typer.Option("1024", help="Comma list of decode KV-cache lengths ('' for none)."),
    batch: str = typer.Option("1", help="Comma list of batch sizes."),
    config: str = typer.Option("spyre", help="The base chip: preset name or hardware TOML path."),
    dtype: str = typer.Option("dl16", help="Weight and activation format of the synthetic model."),
    out: Path = typer.Option(Path("spyre_emu_out/whatif"), help="Where the CSV, PNGs and summary.md go."),
    serve_rate: float = typer.Option(
        None, help="Also run a serving what-if on the base chip: Poisson arrivals per second."
    ),
    serve_requests: int = typer.Option(64, help="Requests of the serving trace."),
    serve_max_batch: int = typer.Option(8, help="Largest decode batch of the serving what-if."),
    serve_prompt: str = typer.Option("64,1024", help="Prompt length range LO,HI of the serving trace."),
    serve_output: str = typer.Option("16,256", help="Output length range LO,HI of the serving trace."),
    tp: str = typer.Option(
        None, help="Comma list of tensor-parallel degrees (cards, 1..8) to sweep too, e.g. 1,2,4,8."
    ),
    keep_going: bool = typer.Option(
        False, help="A point whose program does not build (e.g. over the per-core span) becomes a row with its "
        "error instead of stopping the study."
    ),
) -> None:
    """Time synthetic full-size LLM steps (timing only) across a grid of HardwareConfig overrides and
    tensor-parallel degrees; writes whatif.csv, PNGs and summary.md (models/whatif.py; docs/studies.md)."""
    from models import whatif as wi

    _load_config_or_exit(config)
    try:
        files = wi.run_command(
            model, prefill, decode_kv, batch, set_, config, dtype, out, console,
            serve_rate, serve_requests, serve_max_batch, serve_prompt, serve_output, tp=tp,
            keep_going=keep_going,
        )
    except wi.WhatIfError as e:
        console.print(f"[red]error:[/red] {escape(str(e))}")
        raise typer.Exit(2) from None
    plots = ", ".join(str(p) for p in files.plots.values())
    console.print(escape(f"table: {files.csv}; summary: {files.markdown}; plots: {plots}"))


@app.command()
def precision(
    model: str = typer.Option("smollm2", help="smollm2 (real weights) or tiny-llama (random weights)."),
    settings: str = typer.Option(
        "dl16,fp8_e4m3_channel",
        help="Comma list of models/precision.py settings: dl16, dl16_acc, chunked, chunked:N, "
        "fp8_<e4m3|e5m2>_<tensor|channel>, fp32:MODULE[+MODULE...]; hardware what-ifs (hypothetical: the stack "
        "lowers no such matmul; labelled so in every output): int8_<tensor|channel>, fp8_matmul_<e4m3|e5m2>.",
    ),
    prompt: str = typer.Option(None, help="Chat prompt for smollm2 (default: a question about France)."),
    new_tokens: int = typer.Option(16, help="Greedy tokens of the fp32 reference to compare, teacher-forced."),
    strict: bool = typer.Option(True, "--strict/--fallback", help="Strict mode: no CPU islands on the device run."),
    fp32: str = typer.Option(
        None,
        "--fp32",
        help="Comma list of modules (model.named_modules() names, e.g. model.layers.0.mlp) to keep in fp32: adds "
        "one fp32-islands setting, run in fallback mode.",
    ),
    out: Path = typer.Option(Path("spyre_emu_out/precision"), help="Where summary.md, modules.csv, JSON, PNGs go."),
) -> None:
    """Per-module error of emulated Spyre against CPU fp32 under numeric settings (DL16, DL16 or chunked
    accumulation, FP8 weights, fp32 islands, and the hardware what-ifs int8 and FP8 x FP8 matmuls), and where the
    greedy output first changes; writes a table, PNGs and JSON (models/precision.py; docs/studies.md)."""
    from models import precision as prec
    from models.weights import WeightsNotInstalledError

    try:
        files = prec.run_command(model, settings, prompt, new_tokens, out, strict, console, fp32=fp32)
    except (prec.PrecisionError, WeightsNotInstalledError) as e:
        console.print(f"[red]error:[/red] {escape(str(e))}")
        raise typer.Exit(2) from None
    plots = ", ".join(str(p) for p in files.plots.values())
    console.print(escape(f"table: {files.table}; json: {files.json}; plots: {plots}"))


def _sweep_report(results: Path, out: Path, reruns: list[Path] = (), audit: bool = False) -> None:
    from models.zoo.report import latest, measured, targets, write_audit_report, write_report
    from models.zoo.sweep import SweepError, read_results

    for path in (results, *reruns):
        if not path.exists():
            raise SweepError(f"no results file {path}: run `spyre-emu sweep` first, or pass --results")
    records = read_results(results)
    if not records:
        raise SweepError(f"{results} holds no finished model yet")
    source = str(results)
    for path in reruns:  # later records replace earlier ones of the same (model type, variant): report.latest
        again = read_results(path)
        records += again
        source += f", {len(again)} records re-run in {path}"
    if audit:
        console.print(escape(f"report: {write_audit_report(records, out, source=source)}"))
        return
    files = write_report(records, out, source=source)
    default = [r for r in latest(records) if r.get("variant", "default") == "default"]
    for label, n, of, share, met in targets(default) if default else []:
        console.print(escape(f"{'met' if met else 'NOT met'}: {label}: {measured(n, of, share)}"))
    plots = ", ".join(str(p) for p in files.plots.values())
    console.print(escape(f"report: {files.markdown}, {files.html}; plots: {plots}"))


def _load_config_or_exit(spec: str):
    from aiu_sim.config import load_config
    from aiu_sim.errors import ConfigError

    try:
        return load_config(spec)
    except ConfigError as e:
        console.print(f"[red]error:[/red] {escape(str(e))}")  # a TOML path or key may look like markup
        raise typer.Exit(2) from None


@app.command()
def cache(
    action: str = typer.Argument(..., help="info: where the caches are and what they hold; clear: empty them."),
    weights: bool = typer.Option(False, help="clear: also remove the de-quantized weights (models/weights_cache)."),
) -> None:
    """Show or empty the persistent compile cache ($SPYRE_EMU_CACHE, else XDG; torch_spyre_emu/compiler/cache.py)."""
    from torch_spyre_emu.compiler import cache as compile_cache

    weight_files = sorted(compile_cache.cache_root().glob("*.safetensors"))
    if action == "info":
        n, size = len(compile_cache.entries()), compile_cache.size_bytes()
        state = "on" if compile_cache.enabled() else "off (SPYRE_EMU_COMPILE_CACHE=0 or SPYRE_EMU_DEBUG)"
        console.print(escape(f"compile cache: {compile_cache.cache_dir()} ({state})"))
        console.print(
            f"  {n} {'entry' if n == 1 else 'entries'}, {size / 2**20:.1f} MiB of "
            f"{compile_cache.max_bytes() / 2**20:.0f} MiB (SPYRE_EMU_CACHE_MAX_MB; least recently used pruned)"
        )
        wsize = sum(p.stat().st_size for p in weight_files)
        console.print(escape(f"weights cache: {compile_cache.cache_root()}"))
        console.print(f"  {len(weight_files)} de-quantized weight files, {wsize / 2**20:.1f} MiB")
    elif action == "clear":
        removed = compile_cache.clear()
        console.print(f"removed {removed} compile cache {'entry' if removed == 1 else 'entries'}")
        if weights:
            for p in weight_files:
                p.unlink(missing_ok=True)
            console.print(f"removed {len(weight_files)} de-quantized weight files")
    else:
        console.print(f"[red]error:[/red] unknown action {escape(repr(action))}; use info or clear")
        raise typer.Exit(2)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
