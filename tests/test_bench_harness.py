"""The bench harness imports, no bench leans on another bench or on the tests' conftest, and
bench/report.py renders a run's JSON into the docs (no benchmark runs here: they stay out of CI)."""

from __future__ import annotations

import ast
import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


@pytest.fixture(scope="module")
def harness():
    sys.path.insert(0, str(BENCH))
    try:
        yield {name: importlib.import_module(f"harness.{name}")
               for name in ("system", "inputs", "servers", "links", "mounts", "peers", "engines", "record")}
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def report(harness):
    return importlib.import_module("report")


def test_harness_imports(harness):
    assert harness["record"].SCHEMA == "refmount-bench/1"
    assert harness["links"].Link("x", 1).ns == "rmwanx"


def test_no_bench_imports_another_bench_or_the_tests_conftest():
    benches = {p.stem for p in BENCH.glob("*.py")}
    for script in sorted(BENCH.glob("*.py")) + sorted((BENCH / "harness").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert name.split(".")[0] not in benches, f"{script.name} imports {name}"
                assert name != "tests.conftest", f"{script.name} imports the tests' conftest"


def sample(harness, tmp_path: Path) -> Path:
    record = harness["record"].Record("sample", quick=True, tools={})
    path = tmp_path / "out" / "sample.json"
    record.write(path, {"MB/s": "| contender | MB/s |\n|---|---|\n| refmount | 512 |\n| curl | 1024 |"},
                 notes=["ratio 0.50"], rows=[{"refmount": 512}])
    return path


def test_report_renders_a_run(harness, report, tmp_path):
    data = json.loads(sample(harness, tmp_path).read_text())
    assert data["command"].startswith("python ") and data["load"]["end"] and data["machine"]["kernel"]
    text = report.render(report.load_record(tmp_path / "out" / "sample.json"))
    assert f"`{data['command']}`, a quick run" in text
    assert data["date"][:10] in text and data["machine"]["cpu"] in text and "at the start" in text
    assert "| refmount | 512 |" in text and "- ratio 0.50" in text


def test_report_updates_and_checks_a_page(harness, report, tmp_path, monkeypatch):
    sample(harness, tmp_path)
    monkeypatch.setattr(report, "ROOT", tmp_path)
    page = tmp_path / "page.md"
    page.write_text("# Figures\n\n<!-- report: out/sample.json -->\nold\n<!-- /report -->\n\nafter\n")
    assert report.main(["--check", str(page)]) == 1
    assert report.main(["--update", str(page)]) == 0
    assert report.main(["--check", str(page)]) == 0
    text = page.read_text()
    assert "old" not in text and "| curl | 1024 |" in text and text.endswith("<!-- /report -->\n\nafter\n")


def test_report_refuses_an_old_json(report, tmp_path, capsys):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"table": "| a |"}))
    assert report.main([str(old)]) == 1
    assert "not a bench record" in capsys.readouterr().err


def test_performance_page_shows_its_runs(report):
    """Each generated block of docs/performance.md is its JSON's rendering (python bench/report.py --update)."""
    assert report.update(ROOT / "docs" / "performance.md", write=False) == []


def test_a_bench_field_cannot_hide_the_record(harness, tmp_path):
    record = harness["record"].Record("sample", tools={})
    with pytest.raises(ValueError, match="seconds"):
        record.write(tmp_path / "x.json", "| a |", seconds={"mount": 1.0})
