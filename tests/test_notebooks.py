"""The notebooks in notebooks/ run top to bottom as written (without jupyter: their code cells are executed in order
in one namespace, in a temporary directory, with matplotlib's non-interactive backend)."""

import json
import re
import sys
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
EXPECTED = ["adapters_tour.ipynb", "precision_layer_by_layer.ipynb", "whatif_llama8b_decode.ipynb"]
# Notebooks are user-facing examples: no imports of private modules or names.
PRIVATE_IMPORT = re.compile(r"^\s*(from\s+\S*\b_\w+|import\s+\S*\b_\w+|from\s+\S+\s+import\s+.*\b_\w+)", re.M)


def load(name: str) -> dict:
    return json.loads((NOTEBOOKS / name).read_text())


def code_cells(nb: dict) -> list[str]:
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def test_notebooks_present():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_is_valid_nbformat4(name):
    nb = load(name)
    assert nb["nbformat"] == 4 and isinstance(nb["metadata"], dict)
    assert nb["metadata"]["kernelspec"]["language"] == "python"
    kinds = [c["cell_type"] for c in nb["cells"]]
    assert kinds[0] == "markdown" and "code" in kinds and set(kinds) <= {"markdown", "code"}
    for cell in nb["cells"]:
        assert isinstance(cell["source"], list) and all(isinstance(line, str) for line in cell["source"])
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, (
                "commit notebooks without outputs"
            )
    for src in code_cells(nb):
        assert not PRIVATE_IMPORT.search(src), (
            f"{name} imports a private name: {PRIVATE_IMPORT.search(src)[0]}"
        )


def run_notebook(name: str, tmp_path: Path, monkeypatch) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Earlier tests' compiled graphs must not count against dynamo's recompile limit.
    if "torch" in sys.modules:
        sys.modules["torch"]._dynamo.reset()
    monkeypatch.chdir(tmp_path)  # notebooks write figures and traces into the working directory
    namespace = {"__name__": "__notebook__"}
    try:
        for i, src in enumerate(code_cells(load(name))):
            exec(compile(src, f"{name} code cell {i}", "exec"), namespace)
    finally:
        plt.close("all")
    return namespace


def test_whatif_llama8b_decode_runs(tmp_path, monkeypatch):
    ns = run_notebook("whatif_llama8b_decode.ipynb", tmp_path, monkeypatch)
    table = ns["table"]
    assert len(table) == sum(len(v) for v in ns["SWEEPS"].values())
    assert (table.tokens_per_s > 0).all()
    assert ns["report"].total_us > 0 and len(ns["program"].kernels) > 32
    assert (tmp_path / "whatif_llama8b_decode.png").stat().st_size > 0


def test_precision_layer_by_layer_runs(tmp_path, monkeypatch):
    ns = run_notebook("precision_layer_by_layer.ipynb", tmp_path, monkeypatch)
    errors, logits = ns["errors"], ns["logits"]
    assert len(errors) == ns["DEPTH"] + 1  # embeddings plus one hidden state per layer
    assert (errors.spyre_dl16 > 0).all() and (errors.spyre_dl16 < 0.1).all()
    assert logits.loc["spyre_dl16", "cosine"] > 0.999
    assert set(ns["acc"].columns) == {"fp32", "chunked", "dl16"}
    assert not ns["handle"].active


def test_adapters_tour_runs(tmp_path, monkeypatch):
    ns = run_notebook("adapters_tour.ipynb", tmp_path, monkeypatch)
    assert ns["plan"].unsupported and ns["plan"].ok
    assert ns["prof"].kernels and ns["cos"] > 0.999
    assert ns["same_state"] and ns["same_forwards"] and ns["same_output"]
