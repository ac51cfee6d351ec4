"""The documentation's benchmark page, made from the benchmarks' own JSON files.

    python scripts/docs/benchmark_page.py record docs/benchmarks/data/bench.json -- \\
        python -m heatinv.bench --out docs/benchmarks/data/bench.json
    python scripts/docs/benchmark_page.py show /tmp/benchmarks   # the page on stdout, its plots there

``record`` runs a benchmark command that writes the given JSON file, then wraps the records it
wrote with what the benchmarks do not record themselves: the command, the machine, the date,
the load average before and after, the wall time. The site's build
(``scripts/docs/gen_benchmarks.py``, run by mkdocs-gen-files) calls :func:`benchmark_page`
on the files in ``docs/benchmarks/data/``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = ROOT / "docs" / "benchmarks" / "data"


# --------------------------------------------------------------------------- reading the data


@dataclass
class Run:
    """One benchmark command's JSON file: its records and, where recorded, how and where they were measured.

    Attributes:
        name: the file's name without ``.json``; it names the run's plots.
        records: the benchmark's records, as it wrote them.
        command: the command that wrote them (None: the file holds the records only).
        machine: :func:`describe_machine`'s answer on the machine that ran it.
        measured_on: the day the command started, ISO format.
        wall_seconds: how long the command took.
        load_average: the machine's one-minute load average ``before`` and ``after`` the run.
    """

    name: str
    records: list[dict]
    command: str | None = None
    machine: dict | None = None
    measured_on: str | None = None
    wall_seconds: float | None = None
    load_average: dict | None = None


def load_run(path: Path) -> Run:
    """A data file as :func:`record` writes it, or as a benchmark writes it (a plain list of records)."""
    content = json.loads(path.read_text())
    if isinstance(content, list):
        return Run(path.stem, content)
    return Run(
        path.stem,
        content["records"],
        content.get("command"),
        content.get("machine"),
        content.get("measured_on"),
        content.get("wall_seconds"),
        content.get("load_average"),
    )


def _step_constant(name: str) -> int:
    """A constant of :mod:`heatinv.step`, read from its source: importing it would start TensorFlow."""
    source = Path(importlib.util.find_spec("heatinv.step").origin).read_text()
    return int(re.search(rf"^{name} = ([\d_]+)$", source, re.M).group(1).replace("_", ""))


# --------------------------------------------------------------------------- formatting


MISSING = "–"
VARIANT_LABELS = {
    "eager_reference": "eager ref.",
    "compiled": "compiled",
    "compiled_xla": "compiled XLA",
    "multi_step": "multi-step",
    "multi_step_xla": "multi-step XLA",
    "multi_step_xla_loop": "multi-step XLA loop",
    "keras_fit": "keras fit",
    "keras_fit_multi": "keras fit multi",
    "keras_fit_xla": "keras fit XLA",
    "heatmap_only": "heatmap",
    "heatmap_only_xla": "heatmap XLA",
    "forward_backward": "forward+backward",
    "forward_backward_xla": "forward+backward XLA",
}
"""A bench variant -> its column's header in the tables of milliseconds."""
MEMORY_CASE_LABELS = {
    "training_step": "training step",
    "heatmap": "heatmap",
    "inverse_step": "inverse step",
    "inverse_step_recompute": "inverse step, `recompute`",
}
MEMORY_GOALS = {"heatmap": 1.5, "inverse_step": 2.0, "inverse_step_recompute": 1.5}
"""Peak memory of a case over the training step's, at most; ``recompute`` also at most
:data:`RECOMPUTE_TIME_GOAL` times the inverse step's time."""
RECOMPUTE_TIME_GOAL = 1.5
MEMORY_GOAL_MIN_SIZE = 224
"""The memory goals are about ImageNet-sized inputs: smaller models' peaks are mostly the allocator's
pools, and ``recompute`` reaches only convolutions."""
ZENNIT_GOAL = 1.0
"""Zennit's heatmap time over heatinv's, at least: heatinv's heatmap is the faster one."""


def format_ms(value: float) -> str:
    return f"{value:.2f}"


def format_ratio(value: float) -> str:
    return f"{value:.2f}"


def format_rate(value: float) -> str:
    return f"{value:.0f}"


def format_mib(value: float) -> str:
    return f"{value:,.0f}"


def format_seconds(value: float) -> str:
    return f"{value:.2f}"


def format_error(value: float) -> str:
    return f"{value:.1e}"


def format_goal_value(ratio_name: str, value: float) -> str:
    """A goal row's value as the bench prints it: a rate for ``... steps/s ...``, else a ratio."""
    return format_rate(value) if "steps/s" in ratio_name else format_ratio(value)


def format_met(met: bool) -> str:
    return "yes" if met else "**no**"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} minutes" if seconds >= 90 else f"{seconds:.0f} s"


def describe_hardware(machine: dict) -> str:
    """``2-core AMD EPYC with AVX-512, TensorFlow's oneDNN kernels on, 23.4 GiB of memory``: what the speeds depend on."""
    vector = "with AVX-512" + (" and AMX" if machine.get("amx") else "") if machine.get("avx512") else "without AVX-512"
    onednn = {True: "on", False: "off"}.get(machine.get("onednn"), "unknown")
    return (
        f"{machine['cores']}-core {machine['cpu']} {vector}, TensorFlow's oneDNN kernels {onednn}, "
        f"{machine['memory_gib']} GiB of memory"
    )


def measured_on(run: Run) -> str:
    """The run's "measured on" line and its command, or a line saying the file does not record them."""
    if run.command is None or run.machine is None:
        return (
            f"**Measured on** a machine `{run.name}.json` does not name, by a command it does not record: run it "
            "through `python scripts/docs/benchmark_page.py record` to record both."
        )
    machine = run.machine
    versions = ", ".join(
        f"{label} {machine[key]}"
        for key, label in (("python", "Python"), ("tensorflow", "TensorFlow"), ("keras", "Keras"), ("torch", "PyTorch"))
        if machine.get(key)
    )
    load = run.load_average or {}
    return (
        f"**Measured on** {run.measured_on} on a {describe_hardware(machine)}, {machine['os'].split('-')[0]}; {versions}; "
        f"load average {load.get('before')} before and {load.get('after')} after; the command took "
        f"{_duration(run.wall_seconds)}:\n\n<!-- not run: the benchmark that wrote this data -->\n```bash\n{run.command}\n```"
    )


# --------------------------------------------------------------------------- plots


PLOT_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")


def _figure(width: float, height: float):
    """A figure of its own, drawn without pyplot: no global state, no display needed."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _save(figure, path: Path) -> str:
    figure.savefig(path, format="png", metadata={"Software": None})
    return path.name


def _cases(records: list[dict]) -> list[tuple]:
    """The (model, composite, batch) cases of the records, in their order."""
    return list(dict.fromkeys((r["model"], r["composite"], r["batch"]) for r in records))


def _ms(records: list[dict], case: tuple, variant: str) -> float | None:
    for r in records:
        if (r["model"], r["composite"], r["batch"]) == case and r["variant"] == variant:
            return r["ms_median"]
    return None


TIME_PLOT_VARIANTS = ("heatmap_only", "forward_backward", "compiled", "keras_fit")
PANELS_PER_ROW = 4


def _plain_log_ticks(axis) -> None:
    """Log-scale tick labels as plain numbers (0.5, 2, 30), not powers of ten."""
    from matplotlib.ticker import FuncFormatter

    def between_decades(value, _):
        # 2, 3 and 5 only: every minor tick labelled crowds a panel that spans decades
        return f"{value:g}" if f"{value:g}".lstrip("0.")[:1] in ("2", "3", "5") else ""

    axis.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.yaxis.set_minor_formatter(FuncFormatter(between_decades))
    axis.tick_params(axis="y", which="both", labelsize=7)


def plot_times(run: Run, path: Path) -> str | None:
    """Per model and composite, the median milliseconds of the heatmap, forward+backward, the
    inverse step and ``keras_fit`` at each batch."""
    records = [r for r in run.records if r["variant"] in TIME_PLOT_VARIANTS]
    panels = list(dict.fromkeys((r["model"], r["composite"]) for r in records))
    if not panels:
        return None
    variants = [v for v in TIME_PLOT_VARIANTS if any(r["variant"] == v for r in records)]
    columns = min(PANELS_PER_ROW, len(panels))
    rows = -(-len(panels) // columns)
    figure = _figure(3.2 * columns, 2.9 * rows + 0.4)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    bar = 0.8 / len(variants)
    for axis, (model, composite) in zip(axes, panels):
        cases = [case for case in _cases(records) if case[:2] == (model, composite)]
        shown = []
        for index, variant in enumerate(variants):
            values = [_ms(records, case, variant) or 0.0 for case in cases]
            shown += [value for value in values if value > 0]
            positions = [i + (index - (len(variants) - 1) / 2) * bar for i in range(len(cases))]
            axis.bar(positions, values, bar, label=VARIANT_LABELS[variant], color=PLOT_COLORS[index])
        # a log scale where the batches' times span decades; a linear one, from 0, keeps bars comparable otherwise
        logarithmic = max(shown) > 10 * min(shown)
        if logarithmic:
            axis.set_yscale("log")
            _plain_log_ticks(axis)
        axis.set_ylabel("ms per call, median" + (" (log scale)" if logarithmic else ""), fontsize=8)
        axis.set_xticks(range(len(cases)), [str(batch) for _, _, batch in cases])
        axis.set_xlabel("batch", fontsize=8)
        axis.set_title(f"{model}, {composite}", fontsize=9)
        axis.grid(axis="y", which="both", alpha=0.25)
    for axis in axes[len(panels):]:
        axis.set_visible(False)
    figure.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=len(variants), fontsize=8)
    return _save(figure, path)


RATIO_PLOTS = (
    ("default step / keras_fit", "inverse step / Keras training step"),
    ("heatmap_only / forward_backward", "heatmap / forward+backward"),
)


def plot_ratios(goal_rows: list[dict], path: Path) -> str | None:
    """The inverse step over ``keras_fit`` and the heatmap over forward+backward per case, each bar
    against its goal (the dashed mark): blue where met, red where missed."""
    panels = [(name, title, [row for row in goal_rows if row["ratio"] == name]) for name, title in RATIO_PLOTS]
    panels = [panel for panel in panels if panel[2]]
    if not panels:
        return None
    height = 1.0 + 0.28 * max(len(rows) for _, _, rows in panels)
    figure = _figure(5.0 * len(panels), height)
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for axis, (_, title, rows) in zip(axes, panels):
        positions = list(range(len(rows)))[::-1]
        colors = [PLOT_COLORS[0] if row["met"] else PLOT_COLORS[3] for row in rows]
        bars = axis.barh(positions, [row["value"] for row in rows], color=colors)
        axis.bar_label(bars, [format_ratio(row["value"]) for row in rows], padding=2, fontsize=7)
        for position, row in zip(positions, rows):
            goal = float(row["goal"].split()[1])
            axis.plot([goal, goal], [position - 0.45, position + 0.45], color="black", linestyle="--", linewidth=1)
        axis.set_yticks(positions, [f"{row['model']} {row['composite']} {row['batch']}" for row in rows], fontsize=7)
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("ratio of medians (dashed: goal; red: missed)", fontsize=8)
        axis.margins(x=0.12)
        axis.grid(axis="x", alpha=0.3)
    return _save(figure, path)


def plot_zennit(records: list[dict], path: Path) -> str | None:
    """Per case, heatinv's heatmap (without and with XLA) and Zennit's in ms per batch, and Zennit's
    time over heatinv's against the goal."""
    cases = _cases(records)
    if not cases:
        return None
    figure = _figure(11.0, 1.2 + 0.45 * len(cases))
    times, ratios = figure.subplots(1, 2, width_ratios=(3, 2))
    variants = (("heatmap_only", "heatinv"), ("heatmap_only_xla", "heatinv XLA"), ("zennit_heatmap", "Zennit"))
    positions = list(range(len(cases)))[::-1]
    labels = [f"{model} {composite}" for model, composite, _ in cases]
    bar = 0.8 / len(variants)
    for index, (variant, label) in enumerate(variants):
        values = [_ms(records, case, variant) or 0.0 for case in cases]
        offsets = [position + ((len(variants) - 1) / 2 - index) * bar for position in positions]
        times.barh(offsets, values, bar, label=label, color=PLOT_COLORS[index])
    times.set_xscale("log")
    times.set_yticks(positions, labels, fontsize=7)
    times.set_xlabel(f"ms per heatmap of a batch of {cases[0][2]}, median (log scale)", fontsize=8)
    times.legend(fontsize=7)
    times.grid(axis="x", which="both", alpha=0.25)
    values = [_ms(records, case, "zennit_heatmap") / _ms(records, case, "heatmap_only") for case in cases]
    colors = [PLOT_COLORS[0] if value >= ZENNIT_GOAL else PLOT_COLORS[3] for value in values]
    bars = ratios.barh(positions, values, color=colors)
    ratios.bar_label(bars, [format_ratio(value) for value in values], padding=2, fontsize=7)
    ratios.axvline(ZENNIT_GOAL, color="black", linestyle="--", linewidth=1)
    ratios.set_yticks(positions, labels, fontsize=7)
    ratios.set_title("Zennit / heatinv (dashed: goal; red: missed)", fontsize=9)
    ratios.margins(x=0.12)
    ratios.grid(axis="x", alpha=0.3)
    return _save(figure, path)


def plot_memory(records: list[dict], path: Path) -> str | None:
    """Per model, the peak memory of the heatmap and the inverse steps over the training step's."""
    rows = _memory_rows(records)
    models = list(dict.fromkeys(row["label"] for row in rows))
    if not models:
        return None
    cases = [case for case in MEMORY_GOALS if any(row["case"] == case for row in rows)]
    figure = _figure(1.6 + 1.3 * len(models), 3.8)
    axis = figure.subplots()
    bar = 0.8 / len(cases)
    for index, case in enumerate(cases):
        ratio = {row["label"]: row["peak_ratio"] for row in rows if row["case"] == case}
        values = [ratio.get(model) or 0.0 for model in models]
        positions = [i + (index - (len(cases) - 1) / 2) * bar for i in range(len(models))]
        axis.bar(positions, values, bar, label=MEMORY_CASE_LABELS[case].replace("`", ""), color=PLOT_COLORS[index + 1])
    for goal in sorted(set(MEMORY_GOALS.values())):
        axis.axhline(goal, color="black", linestyle="--", linewidth=1)
        axis.text(0.99, goal, f"goal {goal:g}x ({MEMORY_GOAL_MIN_SIZE}x{MEMORY_GOAL_MIN_SIZE})", ha="right", va="bottom",
                  fontsize=7, transform=axis.get_yaxis_transform())
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.set_xticks(range(len(models)), models, fontsize=7)
    axis.set_ylabel("peak memory / training step's")
    axis.legend(fontsize=8)
    axis.grid(axis="y", alpha=0.3)
    return _save(figure, path)


# --------------------------------------------------------------------------- the sections


def _image(name: str | None, image_dir: Path, alt: str) -> list[str]:
    return [f"![{alt}]({image_dir.name}/{name})"] if name else []


def goal_rows(run: Run) -> list[dict]:
    """The bench's own goal ratios (:func:`heatinv.bench.ratios`) of the run's timed records."""
    from heatinv.bench import ratios

    return ratios([r for r in run.records if "ms_median" in r])


def time_table(run: Run) -> str:
    """Median milliseconds per step (per heatmap, per gradient) of every variant, one row per case."""
    records = [r for r in run.records if r["variant"] in VARIANT_LABELS]
    variants = [v for v in VARIANT_LABELS if any(r["variant"] == v for r in records)]
    rows = []
    for case in _cases(records):
        cells = [_ms(records, case, variant) for variant in variants]
        rows.append([case[0], case[1], str(case[2])] + [MISSING if ms is None else format_ms(ms) for ms in cells])
    return markdown_table(["model", "composite", "batch"] + [VARIANT_LABELS[v] for v in variants], rows)


GOAL_HEADERS = {
    "default step speedup vs eager reference": "eager ref. / compiled",
    "best step speedup vs eager reference": "eager ref. / fastest step",
    "main_job steps/s at batch 1": "main job steps/s",
    "multi_step steps/s at batch 1": "multi-step steps/s",
    "multi_step_xla steps/s at batch 1": "multi-step XLA steps/s",
    "multi_step_xla_loop steps/s at batch 1": "multi-step XLA loop steps/s",
    "default step / keras_fit": "compiled / keras fit",
    "best step / best keras": "fastest step / fastest keras",
    "heatmap_only / forward_backward": "heatmap / forward+backward",
    "heatmap_only_xla / forward_backward_xla": "heatmap XLA / forward+backward XLA",
}
"""A goal ratio of :func:`heatinv.bench.ratios` -> its column's header (others keep the bench's name)."""


def goal_cell(row: dict) -> str:
    """``median (fastest blocks)``, in bold where the goal is missed."""
    text = f"{format_goal_value(row['ratio'], row['value'])} ({format_goal_value(row['ratio'], row['value_from_min'])})"
    return text if row["met"] else f"**{text}**"


def goal_table(rows: list[dict]) -> str:
    """One row per case, one column per goal ratio: ``median (fastest blocks)``, bold where missed."""
    names = list(dict.fromkeys(row["ratio"] for row in rows))
    cases = list(dict.fromkeys((row["model"], row["composite"], row["batch"]) for row in rows))
    table = []
    for case in cases:
        cells = {row["ratio"]: goal_cell(row) for row in rows if (row["model"], row["composite"], row["batch"]) == case}
        table.append([case[0], case[1], str(case[2])] + [cells.get(name, MISSING) for name in names])
    return markdown_table(["model", "composite", "batch"] + [GOAL_HEADERS.get(name, name) for name in names], table)


def goal_summary(rows: list[dict]) -> str:
    """One line per goal: its ratio, its goal, in how many cases it was met, and the range of its medians."""
    lines = []
    for name in dict.fromkeys(row["ratio"] for row in rows):
        of_goal = [row for row in rows if row["ratio"] == name]
        values = sorted(row["value"] for row in of_goal)
        spread = format_goal_value(name, values[0])
        if len(values) > 1:
            spread += " to " + format_goal_value(name, values[-1])
        goals = " or ".join(dict.fromkeys(row["goal"] for row in of_goal))
        met = sum(row["met"] for row in of_goal)
        header = GOAL_HEADERS.get(name, name)
        lines.append(f"- {header} (`{name}`), goal {goals}: {spread}, met in {met} of {len(of_goal)} cases.")
    return "\n".join(lines)


FASTEST_OF_ONE = {
    "best step speedup vs eager reference": "eager_reference / compiled",
    "best step / best keras": "compiled / keras_fit",
}
"""A "fastest variant" goal -> its ratio where the run timed one variant a side: then it repeats the default's."""


def bench_section(run: Run, image_dir: Path, goals_left_out: tuple[str, ...] = ()) -> list[str]:
    """A ``python -m heatinv.bench`` file: its measured-on line, the milliseconds, the goal ratios, two plots."""
    rows = [row for row in goal_rows(run) if not row["ratio"].startswith(goals_left_out)]
    repeated = {
        name
        for name, default in FASTEST_OF_ONE.items()
        if all(row["detail"] == default for row in rows if row["ratio"] == name)
    }
    rows = [row for row in rows if row["ratio"] not in repeated]
    parts = [measured_on(run), time_table(run)]
    parts += _image(plot_times(run, image_dir / f"{run.name}_times.png"), image_dir, f"{run.name}: milliseconds per call")
    if rows:
        parts += [
            "The goals in this run: the range of each ratio's medians and in how many cases it met its goal; "
            "below, each case's ratio of medians and, in brackets, of the fastest blocks (bold: missed).",
            goal_summary(rows),
            goal_table(rows),
        ]
    parts += _image(plot_ratios(rows, image_dir / f"{run.name}_ratios.png"), image_dir, f"{run.name}: ratios and goals")
    return parts


def main_job_table(run: Run) -> str | None:
    """The main job's rate against the bench's goal, and what its loop's bookkeeping took."""
    from heatinv.bench import GOAL_MULTI_STEP_PER_SECOND

    rows = [
        [
            f"`{r['command']}`",
            format_ms(r["ms_median"]),
            format_rate(r["steps_per_second"]),
            f">= {GOAL_MULTI_STEP_PER_SECOND:g}",
            format_met(r["steps_per_second"] >= GOAL_MULTI_STEP_PER_SECOND),
            f"{r['bookkeeping_share']:.1%}",
            r["jit"],
        ]
        for r in run.records
        if r["variant"] == "main_job"
    ]
    if not rows:
        return None
    return markdown_table(["the main job", "ms per step", "steps/s", "goal", "met", "summaries + checkpoints", "its step"], rows)


def auto_table(run: Run) -> str | None:
    rows = [row for row in goal_rows(run) if row["ratio"].startswith("auto")]
    if not rows:
        return None
    return markdown_table(
        ["model", "composite", "batch", "auto picks", "picked / the other", "fastest blocks", "goal", "met", "of"],
        [
            [
                row["model"],
                row["composite"],
                str(row["batch"]),
                row["ratio"].split("(")[1].split(")")[0],
                format_ratio(row["value"]),
                format_ratio(row["value_from_min"]),
                row["goal"],
                format_met(row["met"]),
                f"`{row['detail']}`",
            ]
            for row in rows
        ],
    )


ZENNIT_VARIANTS = ("heatmap_only", "heatmap_only_xla", "zennit_heatmap", "forward_backward", "torch_forward_backward")


def zennit_table(run: Run) -> str:
    records = run.records
    rows = []
    for case in _cases(records):
        ms = {variant: _ms(records, case, variant) for variant in ZENNIT_VARIANTS}
        error = next(r["relative_error"] for r in records if (r["model"], r["composite"], r["batch"]) == case)
        rows.append(
            [
                case[0],
                case[1],
                str(case[2]),
                format_ms(ms["heatmap_only"]),
                format_ms(ms["heatmap_only_xla"]),
                format_ms(ms["zennit_heatmap"]),
                format_ratio(ms["zennit_heatmap"] / ms["heatmap_only"]),
                format_met(ms["zennit_heatmap"] / ms["heatmap_only"] >= ZENNIT_GOAL),
                format_ms(ms["forward_backward"]),
                format_ms(ms["torch_forward_backward"]),
                format_error(error),
            ]
        )
    return markdown_table(
        [
            "model",
            "composite",
            "batch",
            "heatinv",
            "heatinv XLA",
            "Zennit",
            "Zennit / heatinv",
            "met",
            "forward+backward TF",
            "forward+backward PyTorch",
            "heatmaps' relative error",
        ],
        rows,
    )


def _memory_rows(records: list[dict]) -> list[dict]:
    """Each peak-memory record with its ratios to the same model's training step (None where that is 0)."""
    rows = []
    for r in records:
        if "peak_mib" not in r:
            continue
        same = [o for o in records if (o.get("model"), o.get("size"), o.get("batch")) == (r["model"], r["size"], r["batch"])]
        base = next((o for o in same if o["case"] == "training_step"), None)
        inverse = next((o for o in same if o["case"] == "inverse_step"), None)
        rows.append(
            {
                **r,
                "label": f"{r['model']}\n{r['size']}x{r['size']}, batch {r['batch']}",
                "peak_ratio": r["peak_mib"] / base["peak_mib"] if base and base["peak_mib"] > 0 else None,
                "time_ratio": r["seconds"] / base["seconds"] if base and base["seconds"] > 0 else None,
                "time_over_inverse": r["seconds"] / inverse["seconds"] if inverse and inverse["seconds"] > 0 else None,
            }
        )
    return rows


def memory_met(row: dict) -> bool | None:
    """Whether a case's peak memory (and for ``recompute`` its time) meets :data:`MEMORY_GOALS`; None: no goal."""
    goal = MEMORY_GOALS.get(row["case"])
    if goal is None or row["peak_ratio"] is None or row["size"] < MEMORY_GOAL_MIN_SIZE:
        return None
    met = row["peak_ratio"] <= goal
    if row["case"] == "inverse_step_recompute" and row["time_over_inverse"] is not None:
        met = met and row["time_over_inverse"] <= RECOMPUTE_TIME_GOAL
    return met


def memory_table(records: list[dict]) -> str:
    rows = []
    for row in _memory_rows(records):
        met = memory_met(row)
        rows.append(
            [
                row["model"],
                f"{row['size']}x{row['size']}",
                str(row["batch"]),
                row["composite"],
                MEMORY_CASE_LABELS.get(row["case"], row["case"]),
                format_mib(row["peak_mib"]),
                MISSING if row["peak_ratio"] is None else format_ratio(row["peak_ratio"]),
                format_mib(row["repeat_peak_mib"]),
                format_seconds(row["seconds"]),
                MISSING if row["time_ratio"] is None else format_ratio(row["time_ratio"]),
                "" if met is None else format_met(met),
            ]
        )
    return markdown_table(
        [
            "model", "input", "batch", "composite", "case", "peak MiB", "x training step", "second call's peak MiB", "seconds",
            "x training step", "goal met",
        ],
        rows,
    )


# --------------------------------------------------------------------------- the page's prose


INTRODUCTION = """\
# Benchmarks

How fast heatinv's heatmap and inverse step are, and how much memory they take, against what the
same model costs in plain Keras (a training step, one forward and backward pass) and against
Zennit. Every table and plot on this page is made from a JSON file in `docs/benchmarks/data/`,
written by the command shown with it on the machine named in its "measured on" line.

**Reading the numbers.** In one run, every variant of a case (model, composite, batch) runs in one
process on the same weights, batch and target; after a warm-up (the compile) each is timed in
blocks of calls of at least `--min-time` seconds, the variants' blocks interleaved `--repeats`
times. The tables give medians in milliseconds per step (per heatmap, per gradient); the JSON
files keep each variant's fastest and slowest block too. A machine's speed differs between runs
and within one, and other work on the machine slows whatever runs beside it: compare **ratios
within one run**, which is what the goals are stated in, not milliseconds across runs or
machines. Which of two modes is faster can depend on the CPU ([oneDNN's kernels](#onednns-kernels)).
A ratio's "fastest blocks" divides the two variants' fastest blocks, which a busy machine disturbs
less than the medians. Each "measured on" line also says how many processes were running or
waiting, on average over a minute, before and after the run: more than the machine's cores means
other work shared it.

<!-- not run: benchmarks take minutes; tests/test_bench.py runs --quick -->
```bash
python -m heatinv.bench            # the speed table (mlp, cnn; two composites; batches 1, 64, 256): outputs/bench/bench.json
python -m heatinv.bench --quick    # a smoke run (the CI's), no goals checked
python -m heatinv.bench --help     # --models, --composites, --batches, --variants, --repeats, --min-time, --memory
```

The bench prints its table and each goal's ratio with `ok` or `MISS`. To refresh one of this
page's files, run its command through the recorder, which adds the command, the machine and the
date to the file:

<!-- not run: the whole speed table, minutes long -->
```bash
python scripts/docs/benchmark_page.py record docs/benchmarks/data/bench.json -- \\
    python -m heatinv.bench --out docs/benchmarks/data/bench.json
```
"""

SPEED = """\
## Speed: the inverse step against Keras

The variants of `python -m heatinv.bench` (`heatinv/bench.py` describes each in full):

- `eager_reference`: what a user writes by hand, an eager `GradientTape` LRP step (for the mlp
  a loop over its Dense weights with heatinv's rules; for the cnn heatinv's step run eagerly).
- `compiled`, `compiled_xla`: heatinv's step, one update per call, without XLA (what
  `trainer.jit_compile=false` runs) and with it.
- `multi_step`, `multi_step_xla`, `multi_step_xla_loop`: the same with `--steps-per-execution`
  updates per call (`trainer.steps_per_execution`); `multi_step_xla` loops in the graph around
  the XLA-compiled update, `multi_step_xla_loop` compiles the loop into XLA (left out for the
  cnn, where XLA's CPU loop is slow).
- `keras_fit`, `keras_fit_multi`, `keras_fit_xla`: a plain supervised training step of the same
  model (sparse cross-entropy, Adam) through `model.fit`'s own train function, with Keras's
  choice of XLA and one update per call, with `steps_per_execution`, and with XLA forced.
- `heatmap_only`, `heatmap_only_xla`: the compiled heatmap alone (`LRP.__call__`).
- `forward_backward`, `forward_backward_xla`: one compiled forward and backward pass of the same
  model (the gradient of the explained logit), the heatmap's yardstick.

The goals, each checked per case by the bench (the columns of the goal tables):

- **eager ref. / compiled** and **eager ref. / fastest step**, at least {eager:g}: heatinv's
  step without XLA, and the fastest of its variants, against the eager reference. At batch 64 and
  256 the step is compute-bound and the eager reference does the same arithmetic, so the ratio
  shrinks with the batch.
- **steps/s** at batch 1, at least {rate:g} on the reference MLP: the multi-step loops, and the
  main job as a user runs it ([below](#the-main-job-and-trainerjit_compileauto)).
- **compiled / keras fit** and **fastest step / fastest keras**, at most {keras:g}, at batch 64
  and 256: an update of the inverse problem costs at most {keras:g} supervised training steps of the
  same model.
- **heatmap / forward+backward**, at most {heatmap:g} ({applications:g} for the `keras.applications`
  models): a heatmap costs at most {heatmap:g} gradients. The same with XLA on both sides beside it.
- **`auto`'s pick / the other mode**, at most 1: see
  [`trainer.jit_compile=auto`](#the-main-job-and-trainerjit_compileauto).
"""

AUTO = """\
## The main job and `trainer.jit_compile=auto`

`trainer.jit_compile=auto`, the default, runs the step with XLA at batch 1 for a chain of layers
(the mlp, a table's model; a convolutional chain only where TensorFlow runs oneDNN's kernels and
only up to {max_conv_weights:,} weights) in a run of {min_updates} updates or more, and without XLA
otherwise: shorter runs (the default 300 steps among them), models with merges, batches over 1
(`heatinv.step.auto_mode`). XLA's compiling is paid once and its gain every update, so a short run
is faster without it; a resumed run counts the whole run's length, so a resume picks as the run
did. Where XLA cannot compile the step the run goes on with the graph step after one warning
line. `metrics.json`'s `xla` and `xla_why` say which ran; `true`/`false` force it.

The main job, `python -m heatinv.train` with the defaults (mlp, `epsilon_gamma_box`, batch 1), is
timed as a user runs it: two runs of different lengths in fresh processes, each run's loop wall
time per step after its first (compiling) call, summaries, checkpoints and logging included,
start-up and compiling left out; the table gives the longer run's. Its goal is the steps/s goal
above; summaries and checkpoints should take at most 10 % of the loop.

The bench checks `auto`'s pick in every case against the other mode, each run as the trainer runs
it: at batch 1 (`task=single`) the multi-step loops, at larger batches (only `task=dataset` has
them) one update per call, `compiled` against `compiled_xla`. A ratio at most 1 means the pick
was the faster mode in this run.
"""

TIME_GOES = """\
## Where the time goes

What makes the step fast (`heatinv/step.py`, `heatinv/lrp/`): one dispatch per call, paid once
per `steps_per_execution` updates; Keras's Adam and SGD updates as one fused kernel per variable;
gradient statistics, and in the XLA loop the NaN/Inf check, once per call; Dense layers through
`matmul` (`tensordot`'s gradient copies the kernel); the rules skip the terms that are zero by
construction where a layer's input is known to be non-negative (from the graph, or for a first
layer by a check of the batch at run time) and run their positive and negative maps side by side
as one convolution; where oneDNN's kernels are off, the forward pass of a batch of 4 or more
computes `a W+` with `a W` as one convolution for the rules that split the kernel by sign
(alpha-beta, z+, gamma); a grayscale first layer's transposed map to one channel runs tap by tap
as matrix products (oneDNN off) or as a depthwise map and a sum (oneDNN on); max pooling's winners
are found once per layer.

The inverse step's work beyond a training step is largely element-wise (the rules' ratios and
their gradients, which oneDNN does not speed up) and a chain (each layer's relevance waits for
the layer above), so larger batches and oneDNN's kernels speed Keras's training step more than
heatinv's step: where oneDNN's kernels run, the ratio to `keras_fit` grows with the batch. The rules that split
the kernel by sign run more convolutions per layer than a training step's three: alpha-beta
runs four maps (`a W`, `a W+`, the transposed maps of `W+` and `W-`) and each map's two
gradients, twelve; `epsilon_gamma_box`'s gamma rule nine.
"""

CONVOLUTIONAL = """\
## Convolutional networks

The bench's cnn under the four composites at batch 64 and 256, and `keras.applications` graph
models (ResNet50, MobileNetV2: `weights=None` at 64x64, 10 classes, random inputs, batch 1) under
`epsilon_gamma_box`. The goals are the speed table's: the heatmap within {heatmap:g}
forward+backward passes ({applications:g} for the graph models), the inverse step within
{keras:g} `keras_fit` steps. The rules that split the kernel by sign cost the most: alpha-beta's
layers run twelve convolutions where a training step runs three.
"""

TRANSFORMERS = """\
## Transformers

The bench's `vit` (28x28x1 in 4x4 patches: 49 tokens) and `text` (64 token ids of a vocabulary
of 1000) models of `heatinv.transformers`: width 64, 4 blocks of 4 heads, random weights and
inputs, explained by `attnlrp` and `cp_lrp`. For the text model, forward+backward differentiates
the logit with respect to the embedding table. Goal: the heatmap within 2 forward+backward passes.
`python scripts/bench_lxt.py` times heatinv's heatmap against LXT's on the same twin models (it
needs `pip install --no-deps lxt==2.1`; no file of it on this page).
"""

ZENNIT = """\
## Zennit side by side

`scripts/bench_zennit.py` (needs `pip install -e ".[crosscheck]"`): the same architecture,
weights, batch, composite and 2 threads on each side (VGG16 at 32x32x3 and the bench's cnn),
heatmap only, ms per batch. Each case first checks that the two heatmaps agree (the last column,
float32 relative L2 error). Goal: heatinv's heatmap faster than Zennit's, Zennit / heatinv at
least 1, for every model and composite. The two forward+backward columns, a plain gradient in
each framework, tell the frameworks' own speed apart from the LRP engines'. The heatinv XLA column
is what `jit_compile=True` gives; `trainer.jit_compile=auto` never picks XLA at these batches.
"""

MEMORY = """\
## Memory

<!-- not run: each case in a fresh process, minutes long -->
```bash
python -m heatinv.peak_memory --models resnet50,vgg16,mobilenetv2 --batch 8 --size 224   # each case in a fresh process
python -m heatinv.peak_memory --models cnn,vit --batch 64 --size 28
python -m heatinv.bench ... --memory resnet50,vgg16                                      # the same, added to bench.json
```

The peak memory of one compiled call, as the growth of the process's resident set over the
resident set after building the model and tracing the function (`heatinv/peak_memory.py` says
how: the first call, large blocks mapped apart so that freed tensors leave the resident set), next
to the second call's time; ratios to a training step of the same model and batch (cross-entropy,
Adam). `weights=None`, `epsilon_gamma_box` (the ViT: `attnlrp`); the inverse step with
`lrp.recompute=true` (`LRP(model, recompute=True)`) as a case of its own. Goals, for
{size}x{size} inputs: the heatmap at most {heatmap:g}x the training step's peak, the inverse step
at most {inverse:g}x, with `recompute` at most {recompute:g}x and at most {recompute_time:g}x the
inverse step's time. The inverse step's peak moves
by up to a tenth between runs (how the graph's two threads happen to order its ops); below
~50 MiB the first call's peak is mostly the allocator's own pools, so read those rows as "small".
"""

MEMORY_GOES = """\
Where the memory goes, and what keeps it down:

- **The rules' maps wait for the relevance.** A rule's maps of its input, and what it makes of
  the forward pass's products, run as the relevance pass reaches the layer
  (`heatinv/lrp/propagate.py`, `_when_relevance_arrives`), instead of as soon as the forward pass
  has made their operands, which would hold all of them at once.
- **The gamma rule keeps one ratio per layer, not two, and no split copies of it.** Where the
  relevance is not known to be zero below `z <= 0` each output takes one of the rule's two sides,
  so one denominator and one quotient serve both; the two masked copies the transposed map needs
  are made again in its gradient (`heatinv/lrp/rules.py`, `sided_transpose`).
- **`lrp.recompute=true`** keeps only each conv layer's input and relevance for the gradient and
  runs its rule again in the backward pass (`tf.recompute_grad`): the same heatmap and gradients
  (`tests/test_graph.py`), less memory, more time. Dense layers are left out: their intermediates
  are vectors, and recomputing one copies its kernel for the gradient.
- **VGG16's inverse step is its first Dense layer.** `fc1`'s kernel (25,088 x 4,096, 392 MiB) is
  used twice in the inverse step (the forward product and the relevance pass's transposed
  product), so its gradient is two kernel-sized products and their sum, next to Adam's moments;
  recomputing the convolutions does not touch it.
"""

ONEDNN = """\
## oneDNN's kernels

TensorFlow turns oneDNN's CPU kernels on by default only on CPUs whose vector units have
neural-network instructions; elsewhere `TF_ENABLE_ONEDNN_OPTS=1`, set before TensorFlow is
imported, turns them on. Every "measured on" line says whether they were on. They speed up the batched convolutional
steps (Keras's training step more than heatinv's), so a `task=dataset` run of a convolutional net
on a CPU without them is faster with `TF_ENABLE_ONEDNN_OPTS=1 python -m heatinv.train
task=dataset ...`; at batch 1 they slow the cnn's graph step, which is why `auto` asks whether
they are on. heatinv leaves the setting to you; whether it is on:
`python -c "from heatinv.onednn import onednn_enabled; print(onednn_enabled())"`. oneDNN sums
float32 numbers in another order (heatinv's start-up keeps TensorFlow's notice of it quiet).
"""


# --------------------------------------------------------------------------- the page


DATA_FILES = {
    "bench": "the speed table",
    "cnn_composites": "the cnn under four composites",
    "applications": "keras.applications graph models",
    "transformers": "the transformer models",
    "zennit": "Zennit side by side",
    "memory_imagenet": "peak memory at 224x224",
    "memory_small": "peak memory of the small models",
}
"""The data files the page knows (``<name>.json`` in the data folder), each with what it holds."""


def _bench_goals() -> dict[str, float]:
    """The speed goals :mod:`heatinv.bench` checks, by the names the page's prose uses."""
    from heatinv import bench

    return {
        "eager": bench.GOAL_EAGER_SPEEDUP,
        "rate": bench.GOAL_MULTI_STEP_PER_SECOND,
        "keras": bench.GOAL_KERAS_RATIO,
        "heatmap": bench.GOAL_HEATMAP_RATIO,
        "applications": bench.GOAL_APPLICATION_HEATMAP_RATIO,
    }


def benchmark_page(data_dir: Path, image_dir: Path) -> str:
    """The benchmark page's Markdown, made from the JSON files in ``data_dir``; its plots written into ``image_dir``.

    Args:
        data_dir: the folder of the benchmarks' JSON files (:data:`DATA_FILES`; a section
            whose files are missing is left out).
        image_dir: where the PNG plots go (created if need be). The page links them as
            ``<image_dir's name>/<plot>.png``, so it belongs in ``image_dir``'s parent folder.

    Returns:
        The page, Markdown.

    Raises:
        ValueError: a JSON file in ``data_dir`` that the page does not know, so would not show.

    Example:
    >>> page = benchmark_page(DATA_DIR, Path("/tmp/site/benchmarks"))  # doctest: +SKIP
    """
    unknown = sorted(path.name for path in data_dir.glob("*.json") if path.stem not in DATA_FILES)
    if unknown:
        raise ValueError(f"{data_dir} holds {unknown}, which the benchmark page does not show; it shows {list(DATA_FILES)}.")
    image_dir.mkdir(parents=True, exist_ok=True)
    runs = {name: load_run(data_dir / f"{name}.json") for name in DATA_FILES if (data_dir / f"{name}.json").exists()}
    goals = _bench_goals()
    parts = [INTRODUCTION]
    if "bench" in runs:
        # auto's ratios and the main job get tables of their own in the next section, where they are explained
        parts += [SPEED.format(**goals), *bench_section(runs["bench"], image_dir, goals_left_out=("auto", "main_job"))]
        auto = AUTO.format(min_updates=_step_constant("XLA_MIN_UPDATES"), max_conv_weights=_step_constant("XLA_MAX_CONV_WEIGHTS"))
        parts += [auto]
        parts += [table for table in (main_job_table(runs["bench"]), auto_table(runs["bench"])) if table]
    if "cnn_composites" in runs or "applications" in runs:
        parts += [CONVOLUTIONAL.format(**goals)]
        for name, heading in (("cnn_composites", "### The cnn, four composites"), ("applications", "### Graph models")):
            if name in runs:
                parts += [heading, *bench_section(runs[name], image_dir)]
    parts += [TIME_GOES]
    if "transformers" in runs:
        parts += [TRANSFORMERS, *bench_section(runs["transformers"], image_dir)]
    if "zennit" in runs:
        zennit = runs["zennit"]
        parts += [ZENNIT, measured_on(zennit), zennit_table(zennit)]
        parts += _image(plot_zennit(zennit.records, image_dir / "zennit.png"), image_dir, "heatinv and Zennit: ms per heatmap")
    memory = [runs[name] for name in ("memory_imagenet", "memory_small") if name in runs]
    if memory:
        records = [r for run in memory for r in run.records]
        memory_prose = MEMORY.format(
            size=MEMORY_GOAL_MIN_SIZE,
            heatmap=MEMORY_GOALS["heatmap"],
            inverse=MEMORY_GOALS["inverse_step"],
            recompute=MEMORY_GOALS["inverse_step_recompute"],
            recompute_time=RECOMPUTE_TIME_GOAL,
        )
        parts += [memory_prose, *(measured_on(run) for run in memory), memory_table(records)]
        parts += _image(plot_memory(records, image_dir / "memory.png"), image_dir, "peak memory over the training step's")
        parts += [MEMORY_GOES]
    parts += [ONEDNN]
    return "\n\n".join(part.strip("\n") for part in parts) + "\n"


# --------------------------------------------------------------------------- recording a run


def _cpu_model() -> str:
    """The CPU's name as the kernel reports it (``/proc/cpuinfo``), else ``platform``'s guess."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _frameworks() -> dict:
    """Versions, and whether TensorFlow runs oneDNN's kernels, asked of a fresh interpreter:
    this process stays free of TensorFlow, and the answer is the benchmark's own."""
    code = (
        "import json, os, platform\n"
        "os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
        "import tensorflow as tf, keras\n"
        "from heatinv.onednn import onednn_enabled\n"
        "found = {'python': platform.python_version(), 'tensorflow': tf.__version__, 'keras': keras.__version__,\n"
        "         'onednn': onednn_enabled()}\n"
        "try:\n"
        "    import torch\n"
        "    found['torch'] = torch.__version__\n"
        "except ImportError:\n"
        "    pass\n"
        "print(json.dumps(found))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def describe_machine() -> dict:
    """What the benchmarks' numbers depend on: the CPU, its cores and vector units, memory, the frameworks.

    Returns:
        ``{cpu, cores, avx512, amx, memory_gib, os, python, tensorflow, keras, onednn[, torch]}``.
    """
    flags = _cpu_flags()
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "avx512": "avx512f" in flags,
        "amx": any(flag.startswith("amx") for flag in flags),
        "memory_gib": _memory_gib(),
        "os": platform.platform(terse=True),
        **_frameworks(),
    }


def record(data_file: Path, command: list[str]) -> dict:
    """Runs ``command`` (which must write ``data_file``) and wraps the records it wrote with its provenance.

    Args:
        data_file: the JSON file the command writes, a list of records; rewritten as
            ``{command, machine, measured_on, wall_seconds, load_average, records}``.
        command: the benchmark command, as a user types it (run from the repository's root).

    Returns:
        The wrapped file's content.
    """
    machine = describe_machine()
    load_before = os.getloadavg()[0]
    started_at = datetime.datetime.now().astimezone()
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT)
    wall = time.perf_counter() - started
    if not data_file.exists() or data_file.stat().st_mtime < started_at.timestamp():
        raise RuntimeError(f"{shlex.join(command)} did not write {data_file}: give it --out {data_file}")
    records = json.loads(data_file.read_text())
    wrapped = {
        "command": shlex.join(command),
        "machine": machine,
        "measured_on": started_at.date().isoformat(),
        "wall_seconds": round(wall, 1),
        "load_average": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        "records": records,
    }
    data_file.write_text(json.dumps(wrapped, indent=1) + "\n")
    return wrapped


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/docs/benchmark_page.py", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="what", required=True)
    recorder = commands.add_parser("record", help="run a benchmark command and record its provenance in its JSON file")
    recorder.add_argument("data_file", type=Path)
    recorder.add_argument("benchmark", nargs=argparse.REMAINDER, help="-- then the benchmark command")
    shower = commands.add_parser("show", help="print the page and write its plots into a folder")
    shower.add_argument("image_dir", type=Path)
    shower.add_argument("--data", type=Path, default=DATA_DIR)
    args = parser.parse_args(argv)
    if args.what == "record":
        benchmark = args.benchmark[1:] if args.benchmark[:1] == ["--"] else args.benchmark
        if not benchmark:
            parser.error("record: give the benchmark command after --")
        wrapped = record(args.data_file.resolve(), benchmark)
        print(f"recorded {args.data_file}: {wrapped['wall_seconds']:.0f} s, load average {wrapped['load_average']}")
    else:
        print(benchmark_page(args.data.resolve(), args.image_dir.resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
