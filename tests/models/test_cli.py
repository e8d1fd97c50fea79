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


def test_simulate_times_a_small_matmul_and_writes_its_trace(tmp_path):
    trace = tmp_path / "t.json"
    result = runner.invoke(app, ["simulate", "--m", "64", "--k", "64", "--n", "64", "--trace", str(trace)])
    assert result.exit_code == 0, result.output
    assert "unit utilization" in result.output and trace.stat().st_size > 0


def test_simulate_refuses_a_size_out_of_range_in_one_line():
    result = runner.invoke(app, ["simulate", "--m", "-3"])
    assert result.exit_code == 2 and result.output.strip() == "error: --m must be at least 1 (a matmul dimension), got -3"


def test_simulate_reports_a_matmul_the_chip_cannot_hold_without_a_traceback():
    result = runner.invoke(app, ["simulate", "--m", "1000000", "--k", "100000", "--n", "100000"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.startswith("error: kernel 'mm' (matmul)") and "split it across more cores" in result.output
