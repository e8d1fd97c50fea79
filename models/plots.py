"""The demo's PNG: simulated latency per generated token, and per kernel class where prefill/decode time went."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def plot_generation(
    path: Path,
    step_us: list[float],
    breakdowns: dict[str, dict[str, float]],
    title: str,
) -> Path:
    """step_us: simulated us of each step (step 0 = prefill, the time to first token); breakdowns: program name
    -> {kernel class: us}. Writes a two-panel PNG to `path`."""
    fig, (ax_lat, ax_cls) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    tokens = list(range(1, len(step_us) + 1))
    colors = ["tab:orange"] + ["tab:blue"] * (len(step_us) - 1)
    ax_lat.bar(tokens, [u / 1e3 for u in step_us], color=colors)
    ax_lat.set_xlabel("generated token (1 = prefill: time to first token)")
    ax_lat.set_ylabel("simulated time (ms)")
    ax_lat.set_title("simulated latency per generated token")
    ax_lat.grid(axis="y", alpha=0.3)

    classes = sorted(
        {c for b in breakdowns.values() for c in b},
        key=lambda c: -max(b.get(c, 0) for b in breakdowns.values()),
    )
    names = list(breakdowns)
    bottom = [0.0] * len(names)
    cmap = plt.get_cmap("tab20")
    for i, cls in enumerate(classes):
        share = [100 * breakdowns[n].get(cls, 0.0) / (sum(breakdowns[n].values()) or 1) for n in names]
        ax_cls.bar(names, share, bottom=bottom, label=cls, color=cmap(i % 20))
        bottom = [b + s for b, s in zip(bottom, share, strict=True)]
    ax_cls.set_ylabel("share of the program's simulated time (%)")
    ax_cls.set_title("where the time went, by kernel class")
    ax_cls.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_similarity(path: Path, spyre, cpu, labels: list[str], title: str) -> Path:
    """Two cosine-similarity heatmaps side by side (emulated Spyre, CPU fp32)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    for ax, mat, name in ((axes[0], spyre, "emulated Spyre (fp16/DL16)"), (axes[1], cpu, "CPU fp32")):
        im = ax.imshow(mat, vmin=-0.2, vmax=1.0, cmap="viridis")
        ax.set_title(name)
        ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        for i in range(len(labels)):
            for j in range(len(labels)):
                ax.text(j, i, f"{float(mat[i][j]):.3f}", ha="center", va="center", fontsize=7, color="w")
    fig.colorbar(im, ax=list(axes), shrink=0.8)
    fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
