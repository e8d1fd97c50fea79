"""The console script's commands that need no model weights."""

from typer.testing import CliRunner

from models.cli import app

runner = CliRunner()


def test_info_prints_the_default_chip():
    result = runner.invoke(app, ["info"])
    assert result.exit_code == 0, result.output
    assert "32 cores x 2 corelets" in result.output
    assert "72.1 TFLOPS" in result.output


def test_info_small_preset():
    result = runner.invoke(app, ["info", "--config", "small"])
    assert result.exit_code == 0 and "4 cores" in result.output


def test_info_unknown_preset_is_a_clear_error():
    result = runner.invoke(app, ["info", "--config", "nope"])
    assert result.exit_code == 2
    assert "unknown hardware preset 'nope'" in result.output and "available" in result.output


def test_config_errors_print_names_that_look_like_markup_as_they_are():
    result = runner.invoke(app, ["info", "--config", "[bold]chip"])
    assert result.exit_code == 2
    assert "unknown hardware preset '[bold]chip'" in result.output
