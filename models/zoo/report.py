"""The sweep's report: a coverage matrix in Markdown and HTML, class counts, and plots (the stack's to-do list).

`write_report(records, out)` writes into `out`:
  coverage.md, coverage.html        summary counts per class (overall, per modality, decoder-only LMs), the
                                    targets and whether they are met, what each adapter bridged in the models that
                                    run, the gaps ranked by how many model types each blocks, errors of ours, and
                                    the matrix
  coverage_by_modality.png          records per class, per modality
  gaps.png                          the gaps that block the most model types
  latency.png                       simulated latency per model that ran

`write_audit_report(records, out)` writes adapter_audit.md from `spyre-emu sweep --audit` records (audit.py).
"""

from __future__ import annotations

import html
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from models.zoo.classify import CLASSES  # noqa: E402

# One color per class in the plots and the HTML: greens ran, yellow/magenta are gaps, reds are our bugs,
# greys are not ours (the model or the machine).
CLASS_COLORS = {
    "pass_device": "#2ca02c",
    "pass_fallback": "#98df8a",
    "numeric_mismatch": "#ffbb78",
    "unsupported": "#c5b0d5",
    "adapter_error": "#ff9896",
    "emulator_error": "#d62728",
    "not_buildable": "#c7c7c7",
    "timeout": "#9edae5",
    "out_of_memory": "#17becf",
}
RUNS = ("pass_device", "pass_fallback")  # classes whose model ran on emulated Spyre within tolerance
# Issue 11's targets for the default variant, as shares of the model types that build on the CPU (a timeout or an
# out_of_memory built, so it counts against): (label, rows of summary_rows it is measured on, classes, at least).
TARGETS = (
    ("decoder-only LMs run", "decoder-only LMs", RUNS, 0.90),
    ("decoder-only LMs pass_device", "decoder-only LMs", ("pass_device",), 0.60),
    ("all model types run", "all", RUNS, 0.75),
)
OUR_ERRORS = ("emulator_error", "adapter_error")  # target: none of either
GAPS_SHOWN = 25  # rows of the to-do plot
PLOTS = {
    "modality": "coverage_by_modality.png",
    "gaps": "gaps.png",
    "latency": "latency.png",
}


@dataclass
class ReportFiles:
    markdown: Path
    html: Path
    plots: dict[str, Path]


# ------------------------------------------------------------------------------------------------------- the facts


def _modality(r: dict) -> str:
    return r.get("modality") or "unknown"


def _is_decoder_lm(r: dict) -> bool:
    return bool(r.get("is_decoder_lm"))


def _counts(records: list[dict]) -> Counter:
    return Counter(r["class"] for r in records)


def summary_rows(records: list[dict]) -> list[tuple[str, Counter]]:
    """(label, class counts) for all records, each modality (most records first), and the decoder-only LMs."""
    rows = [("all", _counts(records))]
    by_mod: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_mod[_modality(r)].append(r)
    for mod, rs in sorted(by_mod.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        rows.append((f"modality: {mod}", _counts(rs)))
    lms = [r for r in records if _is_decoder_lm(r)]
    rows.append(("decoder-only LMs", _counts(lms)))
    return rows


def built(c: Counter) -> int:
    """Model types of these counts that build on the CPU (the targets' denominator)."""
    return sum(c.values()) - c.get("not_buildable", 0)


def targets(records: list[dict]) -> list[tuple[str, int, int, float | None, bool]]:
    """Issue 11's targets on these (default-variant) records: (label, count, of, share, met) per target, then one row
    per class of ours (share None), met when it is 0."""
    rows = dict(summary_rows(records))
    out = []
    for label, row, classes, least in TARGETS:
        c = rows[row]
        n, of = sum(c.get(k, 0) for k in classes), built(c)
        share = n / of if of else 0.0
        out.append((f"{label} >= {least:.0%} of those that build", n, of, share, of > 0 and share >= least))
    for cls in OUR_ERRORS:
        n = rows["all"].get(cls, 0)
        out.append((f"{cls} = 0", n, sum(rows["all"].values()), None, n == 0))
    return out


def measured(n: int, of: int, share: float | None) -> str:
    """A target's measurement as the report and the CLI print it."""
    return f"{n} of {of}" + ("" if share is None else f" ({100 * share:.1f}%)")


def adapter_credit(records: list[dict]) -> list[tuple[str, int, int, int, int]]:
    """What each adapter did for the models that run: (adapter, types it applied to, of which run, run types in which
    it bridged a gap that stops the model without a bridge (an unsupported op), pass_device types in which it bridged
    only CPU islands (fallback ops)), most credited first. A record's plan lists the stock model's gaps and, per
    capability, the adapters that declare they bridge it; an applied adapter that declares a gap's capability is
    credited with it. Two applied adapters that declare the same capability are both credited: the records do not say
    which one bridged which call."""
    applied: Counter = Counter()
    ran: Counter = Counter()
    made_run: Counter = Counter()
    kept_on_device: Counter = Counter()
    for r in records:
        names = set(_adapter_names(r.get("adapters_applied")))
        plan = r.get("plan") or {}
        bridges = plan.get("bridges") or {}
        status: dict[str, set[str]] = defaultdict(set)  # adapter -> statuses of the stock gaps it bridges
        for g in plan.get("unsupported") or []:
            for a in set(bridges.get(g.get("capability") or g.get("op"), [])) & names:
                status[a].add(g.get("status"))
        for a in names:
            applied[a] += 1
            if r["class"] not in RUNS:
                continue
            ran[a] += 1
            if "unsupported" in status[a]:
                made_run[a] += 1
            elif r["class"] == "pass_device" and "fallback" in status[a]:
                kept_on_device[a] += 1
    return sorted(
        ((a, applied[a], ran[a], made_run[a], kept_on_device[a]) for a in applied),
        key=lambda x: (-x[3], -x[4], -x[1], x[0]),
    )


def _gap_key(b: dict) -> str:
    op, cap = b.get("op") or "?", b.get("capability")
    return f"{op} ({cap})" if cap and cap != op else op


def gaps(records: list[dict]) -> list[tuple[str, list[str]]]:
    """Each gap with the model types it blocks, most model types first: the to-do list. A gap is an op a record lists
    as blocking: nothing bridges it (unsupported), or it runs as a CPU island and keeps a pass_fallback model from
    pass_device."""
    blocked: dict[str, set[str]] = defaultdict(set)
    for r in records:
        for b in r.get("blocking") or []:
            blocked[_gap_key(b)].add(r["model_type"])
    return sorted(((g, sorted(ts)) for g, ts in blocked.items()), key=lambda gt: (-len(gt[1]), gt[0]))


def _metric(r: dict, name: str):
    return (r.get("metrics") or {}).get(name)


def _latency_us(r: dict):
    return (r.get("sim") or {}).get("latency_us")


def _fmt(v, spec: str) -> str:
    if v is None:
        return ""
    try:
        return format(float(v), spec)
    except (TypeError, ValueError):
        return str(v)  # 'nan' / 'inf' as the sweep wrote them


def _uniq(xs) -> list[str]:
    return list(dict.fromkeys(str(x) for x in xs if x))


def _adapter_names(xs) -> list[str]:
    return _uniq(x.get("name", x) if isinstance(x, dict) else x for x in xs or [])


def _error_line(r: dict) -> str:
    err = r.get("error") or {}
    if not err:
        return ""
    msg = str(err.get("message") or "").strip().splitlines()
    return f"{err.get('type', '')}: {msg[0] if msg else ''}"[:200]


def _island(name: str) -> str:
    # host steps are numbered per graph and position (cpu_convolution_3_0): one name per kind of island
    return re.sub(r"(_\d+)+$", "", str(name))


def _why(r: dict) -> str:
    """Why a model did not pass: its blocking ops say it for unsupported; the reason for a numeric mismatch or a
    model nothing builds; the first line of the error otherwise."""
    if r["class"] in RUNS or r["class"] == "unsupported":
        return ""
    if r["class"] in ("numeric_mismatch", "not_buildable") and r.get("reason"):
        return str(r["reason"])[:200]
    return _error_line(r)


MATRIX_COLUMNS = (
    "model type",
    "variant",
    "modality",
    "class",
    "blocking ops",
    "blocked at",
    "CPU islands",
    "adapters applied",
    "adapters retired",
    "max rel err",
    "cosine",
    "top-1",
    "sim latency (us)",
    "kernels",
    "on the device",
    "why",
)


def _resident_cell(r: dict) -> str:
    """The device-resident run's class (and what blocked it); empty where it was not run (a model that did not run
    compiled, or a record from before run_one measured it)."""
    d = r.get("device_resident")
    if not d:
        return ""
    ops = ", ".join(_uniq(b.get("op") for b in d.get("blocking") or []))
    return d["class"] + (f": {ops}" if ops else "")


def _resident_error(r: dict) -> str:
    d = r["device_resident"]
    reason = (d.get("reason") or "").splitlines()
    return reason[0][:200] if reason else _error_line(d)  # d's error has a record's form


def device_resident(records: list[dict]) -> tuple[int, int, list[dict]]:
    """(types measured, of which pass, the records that do not) of the records whose model ran compiled and was
    also run moved to the device."""
    measured = [r for r in records if r["class"] in RUNS and r.get("device_resident")]
    failed = [r for r in measured if r["device_resident"]["class"] != "pass"]
    return len(measured), len(measured) - len(failed), failed


def matrix_rows(records: list[dict]) -> list[list[str]]:
    rows = []
    for r in sorted(records, key=lambda r: (r["model_type"], r.get("variant", ""))):
        sim = r.get("sim") or {}
        rows.append(
            [
                r["model_type"],
                r.get("variant", ""),
                _modality(r),
                r["class"],
                ", ".join(_uniq(b.get("op") for b in r.get("blocking") or [])),
                ", ".join(_uniq(b.get("module_path") for b in r.get("blocking") or [])[:3]),
                ", ".join(_uniq(_island(x) for x in r.get("fallback_ops") or [])),
                ", ".join(_adapter_names(r.get("adapters_applied"))),
                ", ".join(_adapter_names(r.get("adapters_retired"))),
                _fmt(_metric(r, "rel_max_err"), ".2e"),
                _fmt(_metric(r, "cosine"), ".6f"),
                _fmt(_metric(r, "top1_agreement"), ".3f"),
                _fmt(_latency_us(r), ".1f"),
                _fmt(sim.get("kernels"), ".0f"),
                _resident_cell(r),
                _why(r),
            ]
        )
    return rows


# --------------------------------------------------------------------------------------------------------- the plots


def _primary(records: list[dict]) -> tuple[str, list[dict]]:
    """The variant the to-do plot is drawn for: default (the shapes real checkpoints have) where present."""
    variants = _by_variant(records)
    return next(iter(variants.items()), ("default", []))


def _plot_modality(records: list[dict], path: Path) -> Path:
    variant, rs = _primary(records)
    rows = [(label.removeprefix("modality: "), c) for label, c in summary_rows(rs) if label != "all"]
    labels = [lab for lab, _ in rows][::-1]
    counts = [c for _, c in rows][::-1]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.45 * len(rows)))
    left = [0] * len(rows)
    for cls in CLASSES:
        vals = [c.get(cls, 0) for c in counts]
        if any(vals):
            ax.barh(
                labels, vals, left=left, color=CLASS_COLORS[cls], label=cls, edgecolor="white", linewidth=0.5
            )
            left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_xlabel("model types")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"zoo coverage on emulated Spyre, by modality ({variant} variant)")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def _plot_gaps(records: list[dict], path: Path) -> Path:
    variant, rs = _primary(records)
    fallback = {r["model_type"] for r in rs if r["class"] == "pass_fallback"}
    top = gaps(rs)[:GAPS_SHOWN][::-1]
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.3 * max(1, len(top))))
    if top:
        names = [g for g, _ in top]
        on_cpu = [sum(1 for t in ts if t in fallback) for _, ts in top]
        stopped = [len(ts) - n for (_, ts), n in zip(top, on_cpu, strict=True)]
        ax.barh(names, stopped, color=CLASS_COLORS["unsupported"], label="the model does not run")
        ax.barh(
            names, on_cpu, left=stopped, color=CLASS_COLORS["pass_fallback"], label="runs it as a CPU island"
        )
        for i, (_, ts) in enumerate(top):
            ax.text(len(ts), i, f" {len(ts)}", va="center", fontsize=8)
        ax.legend(fontsize=8, loc="lower right")
    else:
        ax.text(0.5, 0.5, "no gap blocks any model type", ha="center", va="center", transform=ax.transAxes)
    ax.tick_params(axis="y", labelsize=8)
    ax.set_xlabel("model types it keeps from running on the device")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"the to-do list: ops by the model types they block ({variant} variant)")
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def _plot_latency(records: list[dict], path: Path) -> Path:
    ran = sorted(
        (
            (
                f"{r['model_type']}" + ("" if r.get("variant") == "default" else f" [{r.get('variant')}]"),
                float(lat),
                r,
            )
            for r in records
            if (lat := _latency_us(r)) is not None
        ),
        key=lambda x: x[1],
    )
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.14 * max(1, len(ran))))
    if ran:
        ax.barh(
            [n for n, _, _ in ran],
            [us / 1e3 for _, us, _ in ran],
            color=[CLASS_COLORS.get(r["class"], "grey") for _, _, r in ran],
        )
        ax.set_xscale("log")
        shown = {r["class"] for _, _, r in ran}
        handles = [Patch(color=CLASS_COLORS[c], label=c) for c in CLASSES if c in shown]
        ax.legend(handles=handles, fontsize=8, loc="lower right")
    else:
        ax.text(0.5, 0.5, "no model ran on emulated Spyre", ha="center", va="center", transform=ax.transAxes)
    ax.tick_params(axis="y", labelsize=6)
    ax.margins(y=0.005)
    ax.set_xlabel("simulated latency of one forward (ms, log scale; color: class)")
    ax.set_title("simulated latency per model on the default chip")
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------------- the documents


def _summary_table(rows: list[tuple[str, Counter]]) -> tuple[list[str], list[list[str]]]:
    header = ["", "model types", "build on the CPU", "run (pass_device + pass_fallback)", *CLASSES]
    body = []
    for label, c in rows:
        ran, b = sum(c.get(k, 0) for k in RUNS), built(c)
        body.append(
            [
                label,
                str(sum(c.values())),
                str(b),
                f"{ran} ({100 * ran / b:.1f}% of those that build)" if b else str(ran),
                *(str(c.get(k, 0)) for k in CLASSES),
            ]
        )
    return header, body


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    def cell(s: str) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _html_table(header: list[str], rows: list[list[str]], class_col: int | None = None) -> str:
    out = ["<table>", "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"]
    for row in rows:
        cells = []
        for i, c in enumerate(row):
            style = f' style="background:{CLASS_COLORS[c]}"' if i == class_col and c in CLASS_COLORS else ""
            cells.append(f"<td{style}>{html.escape(str(c))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _by_variant(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        out[r.get("variant", "default")].append(r)
    return dict(sorted(out.items(), key=lambda kv: (kv[0] != "default", kv[0])))


def _sections(records: list[dict], source: str) -> list[tuple[str, str, object]]:
    """The report as (kind, title, content) parts, rendered by both writers: kind is 'p' (text), 'table'
    ((header, rows, class column)) or 'img' (a file name)."""
    variants = _by_variant(records)
    parts: list[tuple[str, str, object]] = [
        (
            "p",
            "",
            f"{len({r['model_type'] for r in records})} model types, {len(records)} records "
            f"(variants: {', '.join(variants) or 'none'}), from {source}, written {time.strftime('%Y-%m-%d %H:%M')}. "
            "Classes: pass_device (strict mode passes), pass_fallback (within tolerance with CPU islands), "
            "numeric_mismatch, unsupported (a gap nothing bridges), adapter_error, emulator_error (a bug of ours), "
            "not_buildable (fails on the CPU too), timeout, out_of_memory.",
        )
    ]
    for variant, rs in variants.items():
        header, body = _summary_table(summary_rows(rs))
        parts.append(("table", f"Summary: {variant} variant", (header, body, None)))
    default = variants.get("default")
    if default:
        parts.append(
            (
                "table",
                "Targets (issue 11; default variant)",
                (
                    ["target", "measured", "met"],
                    [
                        [
                            label,
                            measured(n, of, share),
                            "yes" if ok else "no",
                        ]
                        for label, n, of, share, ok in targets(default)
                    ],
                    None,
                ),
            )
        )
        parts.append(
            (
                "table",
                "Adapters: what each one bridged in the models that run (default variant)",
                (
                    [
                        "adapter",
                        "applied to (types)",
                        "of which run",
                        "run types it bridged an unsupported op in",
                        "pass_device types it bridged only CPU islands in",
                    ],
                    [[a, str(n), str(r), str(m), str(k)] for a, n, r, m, k in adapter_credit(default)],
                    None,
                ),
            )
        )
        n, ok, failed = device_resident(default)
        if n:
            parts.append(
                (
                    "p",
                    "Moved to the device (the real stack's flow; default variant)",
                    f"Of the {n} model types that ran compiled and were also run as the real stack runs them "
                    "(adapters applied on the CPU, `Module.to(\"spyre\")`, one eager forward with the inputs on "
                    f"the device), {ok} ran within tolerance. The compiled flow feeds CPU inputs, so host code "
                    "between its graphs runs on the CPU"
                    + ("; these stop there on the device:" if failed else "; none of them stops on the device."),
                )
            )
            if failed:
                parts.append(
                    (
                        "table",
                        "",
                        (
                            ["model type", "class", "on the device", "error"],
                            [
                                [r["model_type"], r["class"], _resident_cell(r), _resident_error(r)]
                                for r in sorted(failed, key=lambda r: r["model_type"])
                            ],
                            None,
                        ),
                    )
                )
    parts.append(("img", "Coverage by modality", PLOTS["modality"]))
    for variant, rs in variants.items():
        island = {r["model_type"]: r["class"] == "pass_fallback" for r in rs}
        parts.append(
            (
                "table",
                f"To-do: gaps ranked by the model types they block ({variant} variant)",
                (
                    [
                        "#",
                        "gap: op (capability)",
                        "model types",
                        "of which run it on the CPU",
                        "blocked types",
                    ],
                    [
                        [
                            str(i),
                            g,
                            str(len(ts)),
                            str(sum(1 for t in ts if island.get(t))),
                            ", ".join(ts[:12]) + (" ..." if len(ts) > 12 else ""),
                        ]
                        for i, (g, ts) in enumerate(gaps(rs), 1)
                    ],
                    None,
                ),
            )
        )
    parts.append(("img", "", PLOTS["gaps"]))
    ours = [r for r in records if r["class"] in ("emulator_error", "adapter_error")]
    parts.append(
        (
            "table",
            "Errors of ours (emulator_error, adapter_error)",
            (
                ["model type", "variant", "class", "error"],
                [[r["model_type"], r.get("variant", ""), r["class"], _error_line(r)] for r in ours],
                2,
            ),
        )
    )
    parts += audit_parts([{"model_type": r["model_type"], **r["adapter_audit"]} for r in records if r.get("adapter_audit")])
    parts.append(("img", "Simulated latency per model", PLOTS["latency"]))
    parts.append(("table", "Coverage matrix", (list(MATRIX_COLUMNS), matrix_rows(records), 3)))
    return parts


def _markdown(parts, title: str) -> str:
    out = [f"# {title}", ""]
    for kind, heading, content in parts:
        if heading:
            out += [f"## {heading}", ""]
        if kind == "p":
            out.append(str(content))
        elif kind == "img":
            out.append(f"![{heading or content}]({content})")
        else:
            header, rows, _ = content
            out.append(_md_table(header, rows) if rows else "_none_")
        out.append("")
    return "\n".join(out)


_CSS = (
    "body{font-family:sans-serif;margin:2em;max-width:120em} table{border-collapse:collapse;font-size:12px;"
    "margin-bottom:1.5em} td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top} "
    "th{background:#eee;position:sticky;top:0} img{max-width:100%}"
)


def _html(parts, title: str) -> str:
    out = [
        "<!DOCTYPE html>",
        f"<html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for kind, heading, content in parts:
        if heading:
            out.append(f"<h2>{html.escape(heading)}</h2>")
        if kind == "p":
            out.append(f"<p>{html.escape(str(content))}</p>")
        elif kind == "img":
            out.append(
                f"<img src='{html.escape(str(content))}' alt='{html.escape(heading or str(content))}'>"
            )
        else:
            header, rows, class_col = content
            out.append(_html_table(header, rows, class_col) if rows else "<p><em>none</em></p>")
    out.append("</body></html>")
    return "\n".join(out)


TITLE = "HuggingFace zoo on emulated Spyre: coverage"
AUDIT_TITLE = "HuggingFace zoo: adapter audit"


def audit_parts(records: list[dict], full: bool = False) -> list[tuple[str, str, object]]:
    """The adapter audit's section: verdict counts and the findings (an adapter that changes a model's CPU fp32
    output or raises), from records whose `class` is an audit verdict (audit.py); `full` adds every record."""
    from models.zoo.audit import AUDIT_CLASSES, FINDINGS, ROUNDING_MAX

    counts = Counter(r["class"] for r in records)
    text = (
        f"Every adapter applied to the tiny model on the CPU in fp32, its judged output compared with the stock "
        f"model's at real positions (models/zoo/audit.py; rounding: within {ROUNDING_MAX:g} norm-wise). "
        f"{len(records)} model types audited: "
        + ", ".join(f"{c} {counts[c]}" for c in AUDIT_CLASSES if counts[c])
        + f". Target: no {' and no '.join(FINDINGS)}."
        if records
        else "No record here carries the adapter audit (sweeps before it was added): run `spyre-emu sweep --audit`."
    )
    fine = ("exact", "rounding", "no_adapters", "not_buildable")  # a model nothing builds has nothing to audit
    rows = sorted((r for r in records if r["class"] not in fine), key=_audit_key)
    parts: list[tuple[str, str, object]] = [
        ("p", "Adapter audit: do the adapters leave what each model computes unchanged?", text),
        ("table", "", (list(AUDIT_COLUMNS), [_audit_row(r) for r in rows], 1)),
    ]
    if full:
        parts.append(("table", "Every model type", (list(AUDIT_COLUMNS), [_audit_row(r) for r in records], 1)))
    return parts


AUDIT_COLUMNS = ("model type", "verdict", "rel. difference", "max abs. difference", "adapters applied", "why")


def _audit_key(r: dict):
    order = {c: i for i, c in enumerate(("changed", "adapter_error", "emulator_error", "timeout", "out_of_memory"))}
    return order.get(r["class"], len(order)), r["model_type"]


def _audit_row(r: dict) -> list[str]:
    why = r.get("reason") or ""
    if r.get("error") and r["class"] != "not_buildable":
        # the error's own line; a changed row's reason already ends with the culprits, an error row's would be lost
        why = _error_line(r) + (f"; alone: {', '.join(r['culprits']) or 'none'}" if "culprits" in r else "")
    return [
        r["model_type"],
        r["class"],
        _fmt(r.get("rel_err"), ".2e"),
        _fmt(r.get("max_abs_err"), ".2e"),
        ", ".join(r.get("adapters_applied") or []),
        why[:300],
    ]


def write_audit_report(records: list[dict], out: str | Path, source: str = "the audit") -> Path:
    """Write adapter_audit.md (the audit's counts, findings and every record) into `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    records = sorted(latest(records), key=lambda r: r["model_type"])
    stamp = time.strftime("%Y-%m-%d %H:%M")
    parts = [("p", "", f"{len(records)} records from {source}, written {stamp}."), *audit_parts(records, full=True)]
    md = out / "adapter_audit.md"
    md.write_text(_markdown(parts, AUDIT_TITLE))
    return md


def latest(records: list[dict]) -> list[dict]:
    """One record per (model type, variant): a later one (a rerun appended to the same file) replaces an earlier one."""
    return list({(r["model_type"], r.get("variant", "default")): r for r in records}.values())


def write_report(records: list[dict], out: str | Path, source: str = "the sweep") -> ReportFiles:
    """Write the Markdown and HTML coverage report and its three plots into `out` (file names: PLOTS, coverage.md,
    coverage.html)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    records = latest(records)
    plots = {
        "modality": _plot_modality(records, out / PLOTS["modality"]),
        "gaps": _plot_gaps(records, out / PLOTS["gaps"]),
        "latency": _plot_latency(records, out / PLOTS["latency"]),
    }
    parts = _sections(records, source)
    md = out / "coverage.md"
    md.write_text(_markdown(parts, TITLE))
    page = out / "coverage.html"
    page.write_text(_html(parts, TITLE))
    return ReportFiles(markdown=md, html=page, plots=plots)
