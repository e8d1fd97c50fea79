"""Execute the notebooks with nbclient: `make notebooks` (full mode, outputs written back) and the test suite
(reduced mode, nothing written).

    python notebooks/execute.py            # every notebook, full mode, outputs committed with it
    python notebooks/execute.py whatif_llama8b.ipynb --reduced --check

A full run also saves each notebook's first plot as docs/notebooks/<name>.png (the README's pictures) and stamps
the notebook's metadata with the hash of its code cells ("spyre_emu.source_sha256"), so a test can
tell that the committed outputs were produced by the committed code. In reduced mode (env SPYRE_EMU_NOTEBOOK_MODE=
reduced) each notebook picks smaller workloads itself; the numbers differ, the cells and the kinds of output do not.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
PICTURES = HERE.parent / "docs" / "notebooks"  # the README shows one picture per notebook from here
NOTEBOOKS = (
    "run_on_spyre.ipynb",
    "whatif_llama8b.ipynb",
    "precision_smollm2.ipynb",
    "writing_an_adapter.ipynb",
    "adapters_tour.ipynb",
)
MODE_ENV = "SPYRE_EMU_NOTEBOOK_MODE"
TIMEOUT_S = 1800  # one cell; a full-mode SmolLM2 precision cell takes minutes on two cores


def source_sha256(nb) -> str:
    """Hash of the code cells' sources, in order: what the outputs were computed from."""
    h = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            h.update(cell.source.encode() + b"\0")
    return h.hexdigest()


def execute(path: Path, reduced: bool, write: bool, workdir: Path | None = None):
    """Run every cell in a fresh kernel (working directory: workdir, default a temporary one); return the
    executed notebook. write=True stores it back with its outputs and the source stamp."""
    nb = nbformat.read(path, as_version=4)
    old = os.environ.get(MODE_ENV)
    os.environ[MODE_ENV] = "reduced" if reduced else "full"
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    os.environ.setdefault("TQDM_DISABLE", "1")  # no weight-loading progress bars in the committed outputs
    try:
        with tempfile.TemporaryDirectory(prefix="spyre_nb_") as tmp:
            cwd = str(workdir or tmp)
            NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                           resources={"metadata": {"path": cwd}}).execute()
    finally:
        if old is None:
            os.environ.pop(MODE_ENV, None)
        else:
            os.environ[MODE_ENV] = old
    if write:
        nb.metadata["spyre_emu"] = {"source_sha256": source_sha256(nb), "mode": "reduced" if reduced else "full"}
        for cell in nb.cells:  # a stable file: no per-run ids or timings in cell metadata
            cell.metadata.pop("execution", None)
        nbformat.write(nb, path)
        save_picture(nb, PICTURES / f"{path.stem}.png")
    return nb


def save_picture(nb, target: Path) -> Path | None:
    """The notebook's first plot as a PNG file (None when it has no plot)."""
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            png = out.get("data", {}).get("image/png")
            if png:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(base64.b64decode(png))
                return target
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", default=list(NOTEBOOKS))
    p.add_argument("--reduced", action="store_true", help="small workloads (what the test suite runs)")
    p.add_argument("--check", action="store_true", help="execute only; do not write the outputs back")
    args = p.parse_args(argv)
    for name in args.names:
        print(f"executing {name} ({'reduced' if args.reduced else 'full'} mode)", flush=True)
        execute(HERE / name, args.reduced, write=not args.check)
    return 0


if __name__ == "__main__":
    sys.exit(main())
