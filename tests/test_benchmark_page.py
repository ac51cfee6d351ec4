"""The documentation's benchmark page, made from the committed data (docs/benchmarks/data/); no benchmark runs."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from heatinv.bench import ratios
from test_docs import forbidden, parse

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT / "docs" / "benchmarks" / "data"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _load_generator():
    spec = importlib.util.spec_from_file_location("benchmark_page", ROOT / "scripts" / "docs" / "benchmark_page.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


generator = _load_generator()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The page's Markdown and its plots' folder."""
    image_dir = tmp_path_factory.mktemp("site") / "benchmarks"
    return generator.benchmark_page(DATA_DIR, image_dir), image_dir


def _data_files() -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(DATA_DIR.glob("*.json"))}


def _segments(page: str) -> dict[str, str]:
    """The page's text after each data file's "measured on" line, up to the next one, by the file's name."""
    commands = {name: data["command"] for name, data in _data_files().items()}
    pieces = page.split("**Measured on**")[1:]
    segments = {}
    for piece in pieces:
        command = re.search(r"```bash\n(.*?)\n```", piece, re.S).group(1)
        (name,) = [name for name, known in commands.items() if known == command]
        segments[name] = piece
    return segments


def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every Markdown table of ``text``: its header and its rows of cells."""
    tables = []
    for block in re.findall(r"(?:^\|.*\|\n?)+", text, re.M):
        lines = [line.strip() for line in block.strip().splitlines()]
        cells = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]
        tables.append((cells[0], cells[2:]))
    return tables


def _record(records, model, composite, batch, variant):
    key = (model, composite, batch, variant)
    found = [r for r in records if (r["model"], r["composite"], str(r["batch"]), r["variant"]) == key]
    assert len(found) <= 1
    return found[0] if found else None


def _ms(records, model, composite, batch, variant):
    found = _record(records, model, composite, batch, variant)
    return found["ms_median"] if found else None


def test_the_data_files_are_known_and_recorded():
    files = _data_files()
    assert "bench" in files, "the page's main table needs docs/benchmarks/data/bench.json"
    for name, data in files.items():
        assert name in generator.DATA_FILES
        assert data["command"] and data["records"], name
        assert {"cpu", "cores", "onednn", "tensorflow"} <= set(data["machine"]), name


def test_every_data_file_s_command_and_machine_are_on_the_page(built):
    page, _ = built
    for name, data in _data_files().items():
        assert f"```bash\n{data['command']}\n```" in page, name
        line = next(line for line in page.splitlines() if line.startswith("**Measured on** " + data["measured_on"]))
        assert f"{data['machine']['cores']}-core {data['machine']['cpu']}" in line, name
        assert f"TensorFlow {data['machine']['tensorflow']}" in line, name
    assert set(_segments(page)) == set(_data_files())


def test_every_plot_is_a_png_the_page_links(built):
    page, image_dir = built
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page)
    assert linked and all(link.startswith(image_dir.name + "/") for link in linked)
    written = sorted(path.name for path in image_dir.glob("*.png"))
    assert sorted(link.split("/", 1)[1] for link in linked) == written
    for name in written:
        content = (image_dir / name).read_bytes()
        assert content.startswith(PNG_SIGNATURE) and len(content) > 5000, name
    expected = {"bench_times.png", "bench_ratios.png"}
    expected |= {"zennit.png"} if "zennit" in _data_files() else set()
    expected |= {"memory.png"} if any(name.startswith("memory") for name in _data_files()) else set()
    assert expected <= set(written)


def _check_time_table(header, rows, records):
    variants = {label: variant for variant, label in generator.VARIANT_LABELS.items()}
    for row in rows:
        model, composite, batch = row[:3]
        for label, cell in zip(header[3:], row[3:]):
            ms = _ms(records, model, composite, batch, variants[label])
            assert cell == (generator.MISSING if ms is None else generator.format_ms(ms)), (model, composite, batch, label)


# the goal columns whose value the test computes from the records itself: numerator and denominator
# variants (None: steps per second of the numerator)
SIMPLE_GOALS = {
    "eager ref. / compiled": ("eager_reference", "compiled"),
    "multi-step steps/s": ("multi_step", None),
    "multi-step XLA steps/s": ("multi_step_xla", None),
    "multi-step XLA loop steps/s": ("multi_step_xla_loop", None),
    "compiled / keras fit": ("compiled", "keras_fit"),
    "heatmap / forward+backward": ("heatmap_only", "forward_backward"),
    "heatmap XLA / forward+backward XLA": ("heatmap_only_xla", "forward_backward_xla"),
}


def _check_goal_table(header, rows, records):
    names = {label: name for name, label in generator.GOAL_HEADERS.items()}
    goals = ratios([r for r in records if "ms_median" in r])
    for row in rows:
        model, composite, batch = row[:3]
        for label, cell in zip(header[3:], row[3:]):
            key = (names[label], model, composite, batch)
            found = [g for g in goals if (g["ratio"], g["model"], g["composite"], str(g["batch"])) == key]
            if not found:
                assert cell == generator.MISSING
                continue
            (goal,) = found
            value, fastest = goal["value"], goal["value_from_min"]
            if label in SIMPLE_GOALS:
                numerator, denominator = SIMPLE_GOALS[label]
                top = _record(records, model, composite, batch, numerator)
                if denominator is None:
                    value, fastest = 1e3 / top["ms_median"], 1e3 / top["ms_min"]
                else:
                    bottom = _record(records, model, composite, batch, denominator)
                    value, fastest = top["ms_median"] / bottom["ms_median"], top["ms_min"] / bottom["ms_min"]
            text = f"{generator.format_goal_value(goal['ratio'], value)} ({generator.format_goal_value(goal['ratio'], fastest)})"
            assert cell == (text if goal["met"] else f"**{text}**"), (model, composite, batch, label)


def _check_main_job_table(header, rows, records):
    (job,) = [r for r in records if r["variant"] == "main_job"]
    (row,) = rows
    assert row[0] == f"`{job['command']}`"
    assert row[1:3] == [generator.format_ms(job["ms_median"]), generator.format_rate(job["steps_per_second"])]
    assert row[4] == generator.format_met(job["steps_per_second"] >= float(row[3].split()[1]))
    assert row[5] == f"{job['bookkeeping_share']:.1%}"


def _check_auto_table(header, rows, records):
    for model, composite, batch, pick, value, fastest, goal, met, of in rows:
        picked, other = of.strip("`").split(" / ")
        top, bottom = (_record(records, model, composite, batch, variant) for variant in (picked, other))
        assert top["auto_pick"] == pick
        assert value == generator.format_ratio(top["ms_median"] / bottom["ms_median"])
        assert fastest == generator.format_ratio(top["ms_min"] / bottom["ms_min"])
        assert met == generator.format_met(top["ms_median"] / bottom["ms_median"] <= 1)


def _check_zennit_table(header, rows, records):
    assert header[3:6] == ["heatinv", "heatinv XLA", "Zennit"]
    for row in rows:
        model, composite, batch = row[:3]
        ms = {v: _ms(records, model, composite, batch, v) for v in generator.ZENNIT_VARIANTS}
        error = _record(records, model, composite, batch, "zennit_heatmap")["relative_error"]
        ratio = ms["zennit_heatmap"] / ms["heatmap_only"]
        assert row[3:] == [
            generator.format_ms(ms["heatmap_only"]),
            generator.format_ms(ms["heatmap_only_xla"]),
            generator.format_ms(ms["zennit_heatmap"]),
            generator.format_ratio(ratio),
            generator.format_met(ratio >= 1),
            generator.format_ms(ms["forward_backward"]),
            generator.format_ms(ms["torch_forward_backward"]),
            generator.format_error(error),
        ]


def _check_memory_table(header, rows, records):
    cases = {label: case for case, label in generator.MEMORY_CASE_LABELS.items()}
    for model, size, batch, composite, case, peak, peak_ratio, repeat, seconds, time_ratio, met in rows:
        same = [r for r in records if (r["model"], f"{r['size']}x{r['size']}", str(r["batch"])) == (model, size, batch)]
        (record,) = [r for r in same if r["case"] == cases[case]]
        (base,) = [r for r in same if r["case"] == "training_step"]
        assert record["composite"] == composite
        assert peak == generator.format_mib(record["peak_mib"])
        assert repeat == generator.format_mib(record["repeat_peak_mib"])
        assert seconds == generator.format_seconds(record["seconds"])
        assert peak_ratio == generator.format_ratio(record["peak_mib"] / base["peak_mib"])
        assert time_ratio == generator.format_ratio(record["seconds"] / base["seconds"])
        if cases[case] == "training_step" or record["size"] < generator.MEMORY_GOAL_MIN_SIZE:
            assert met == ""
        else:
            within = record["peak_mib"] / base["peak_mib"] <= generator.MEMORY_GOALS[cases[case]]
            if cases[case] == "inverse_step_recompute":
                (inverse,) = [r for r in same if r["case"] == "inverse_step"]
                within = within and record["seconds"] / inverse["seconds"] <= generator.RECOMPUTE_TIME_GOAL
            assert met == generator.format_met(within)


def _table_kind(header: list[str]) -> str:
    if header[:3] != ["model", "composite", "batch"]:
        if header[0] == "the main job":
            return "main_job"
        if header[:3] == ["model", "input", "batch"]:
            return "memory"
        raise AssertionError(f"a table the test does not know: {header}")
    if header[3] == "auto picks":
        return "auto"
    if "Zennit" in header:
        return "zennit"
    if all(label in generator.VARIANT_LABELS.values() for label in header[3:]):
        return "time"
    if all(label in generator.GOAL_HEADERS.values() for label in header[3:]):
        return "goal"
    raise AssertionError(f"a table the test does not know: {header}")


CHECKS = {
    "time": _check_time_table,
    "goal": _check_goal_table,
    "main_job": _check_main_job_table,
    "auto": _check_auto_table,
    "zennit": _check_zennit_table,
    "memory": _check_memory_table,
}


def test_every_number_in_a_table_is_the_data_s(built):
    """Each table's cells against the records of the data file whose "measured on" line precedes it
    (the memory table against all memory files' records, which it joins)."""
    page, _ = built
    files = _data_files()
    memory_records = [r for name, data in files.items() if name.startswith("memory") for r in data["records"]]
    checked = []
    for name, segment in _segments(page).items():
        for header, rows in _tables(segment):
            kind = _table_kind(header)
            records = memory_records if kind == "memory" else files[name]["records"]
            assert rows, (name, kind)
            CHECKS[kind](header, rows, records)
            checked.append((name, kind))
    assert {("bench", "time"), ("bench", "goal"), ("bench", "main_job"), ("bench", "auto")} <= set(checked)
    assert len(checked) == len(_tables(page)), "a table before the first measured-on line"


def test_the_page_keeps_the_user_pages_conventions(built):
    """As tests/test_docs.py checks the pages on disk: no date, commit, issue or machine outside the
    "measured on" lines, and every shell block marked as run or not run, with its reason."""
    page, _ = built
    assert not forbidden(page, re.compile(r"(?i)measured on"))
    blocks, problems = parse(page, "benchmarks.md")
    assert not problems
    assert blocks and all(block.kind == "not run" for block in blocks)


def test_a_file_the_page_does_not_know_is_refused(tmp_path):
    (tmp_path / "bench.json").write_text((DATA_DIR / "bench.json").read_text())
    (tmp_path / "lxt.json").write_text("[]")
    with pytest.raises(ValueError, match="lxt.json"):
        generator.benchmark_page(tmp_path, tmp_path / "plots")


def test_a_file_as_the_bench_writes_it_says_its_machine_is_not_recorded(tmp_path):
    records = json.loads((DATA_DIR / "bench.json").read_text())["records"]
    (tmp_path / "bench.json").write_text(json.dumps(records))
    page = generator.benchmark_page(tmp_path, tmp_path / "plots")
    assert "**Measured on** a machine `bench.json` does not name" in page
