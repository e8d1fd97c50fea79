"""`spyre-emu precision`: the accumulation settings, --fp32 islands and their one-line errors (tiny Llama)."""

from typer.testing import CliRunner

from models.cli import app


def test_precision_command_settings_and_fp32(tmp_path):
    runner = CliRunner()
    out = tmp_path / "p"
    r = runner.invoke(
        app,
        ["precision", "--model", "tiny-llama", "--settings", "chunked:16", "--fp32", "model.norm,lm_head",
         "--new-tokens", "1", "--out", str(out)],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    summary = (out / "summary.md").read_text()
    assert "| chunked:16 |" in summary and "| fp32:model.norm+lm_head |" in summary
    r = runner.invoke(
        app, ["precision", "--model", "tiny-llama", "--settings", "dl16", "--fp32", "model.nrom"]
    )
    assert r.exit_code == 2 and "no module 'model.nrom'; did you mean model.norm" in r.output
    assert len(r.output.strip().splitlines()) == 1
    r = runner.invoke(app, ["precision", "--model", "tiny-llama", "--settings", "dl16,fp16_acc"])
    assert r.exit_code == 2 and "unknown precision setting 'fp16_acc'" in r.output
    r = runner.invoke(app, ["precision", "--model", "tiny-llama", "--new-tokens", "0"])
    assert r.exit_code == 2 and r.output.strip() == "error: --new-tokens must be at least 1, got 0"
