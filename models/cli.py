"""The `spyre-emu` command line (typer + rich)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

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
    from aiu_sim.timing.summary import format_summary

    cfg = _load_config_or_exit(config)
    program = matmul_program(m, k, n, config=cfg)
    trace.parent.mkdir(parents=True, exist_ok=True)
    result = run(program, {}, config=cfg, mode="timing", trace_path=str(trace))
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
    _load_config_or_exit(config)
    try:
        if model == "smollm2":
            result = demo_mod.run_chat(
                prompt or demo_mod.DEFAULT_PROMPT, max_new_tokens, config, out, console, resume=resume
            )
            demo_mod.print_chat(result, console)
        else:
            demo_mod.print_embed(demo_mod.run_embed(None, config, out, console), console)
    except (WeightsNotInstalledError, GenerationError, demo_mod.DemoError) as e:
        console.print(f"[red]error:[/red] {escape(str(e))}")  # messages quote prompts and configs: no markup
        raise typer.Exit(2) from None


def _load_config_or_exit(spec: str):
    from aiu_sim.config import load_config
    from aiu_sim.errors import ConfigError

    try:
        return load_config(spec)
    except ConfigError as e:
        console.print(f"[red]error:[/red] {escape(str(e))}")  # a TOML path or key may look like markup
        raise typer.Exit(2) from None


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
