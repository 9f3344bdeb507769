"""The documentation: the option reference lists exactly what the parser (and so `--help`) has, and
the README's links lead to files that exist.

The option page is rendered by docs/hooks/options_reference.py when the site is built; here the
rendered Markdown is read back cell by cell and compared with the parser's own actions and with the
text `--help` prints, so that neither a missing option nor a stale help text can pass.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from refmount.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _hook():
    spec = importlib.util.spec_from_file_location("options_reference", DOCS / "hooks" / "options_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    top = build_parser()
    found = {"": top}
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def _cells(row: str) -> list[str]:
    """A Markdown table row split on its unescaped pipes."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text.replace("&lt;", "<").replace("&gt;", ">"))


def _rendered_sections() -> dict[str, list[list[str]]]:
    """command -> the rows (cells) of its option tables, from the page as the build renders it."""
    page = (DOCS / "options.md").read_text()
    rendered = _hook().on_page_markdown(page, page=None, config=None, files=None)
    sections: dict[str, list[list[str]]] = {}
    current = None
    for line in rendered.splitlines():
        heading = re.match(r"## `refmount ?(\w*)`", line)
        if heading:
            current = sections.setdefault(heading.group(1), [])
        elif current is not None and line.startswith("| <a id="):
            current.append(_cells(line))
    return sections


def _documented_options(rows: list[list[str]]) -> dict[str, str]:
    """option string (or positional metavar) -> its help text as the page shows it."""
    documented = {}
    for names, _default, meaning in rows:
        for name in re.findall(r"`([^`]+)`", names):
            documented[name.split(" ")[0]] = _unescape(meaning)
    return documented


def _parser_options(parser: argparse.ArgumentParser) -> dict[str, str]:
    formatter = parser._get_formatter()
    options = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        text = formatter._expand_help(action) if action.help else ""
        for name in action.option_strings or [action.metavar or action.dest]:
            options[name] = text
    return options


def _help_lists(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings `--help` prints at the start of its option lines."""
    names = set()
    for line in parser.format_help().splitlines():
        entry = re.match(r"^  (-[^ ].*?)(?:  |$)", line)
        if entry:
            names |= {part.split(" ")[0] for part in entry.group(1).split(", ")}
    return names


def test_the_option_page_lists_every_option_of_every_command_with_its_help():
    sections = _rendered_sections()
    parsers = _subparsers()
    assert set(sections) == set(parsers), "one section per command"
    for command, parser in parsers.items():
        documented = _documented_options(sections[command])
        assert documented == _parser_options(parser), f"refmount {command}".strip()


def test_the_option_page_agrees_with_what_help_prints():
    sections = _rendered_sections()
    for command, parser in _subparsers().items():
        documented = {name for name in _documented_options(sections[command]) if name.startswith("-")}
        assert documented == _help_lists(parser), f"refmount {command} --help".strip()


def test_the_option_page_is_generated_not_written_by_hand():
    page = (DOCS / "options.md").read_text()
    hook = _hook()
    assert page.count(hook.MARKER) == 1 and page.count(hook.END) == 1
    by_hand = page.split(hook.MARKER)[0] + page.split(hook.END)[1]
    assert not re.search(r"^\|.*`--[a-z]", by_hand, re.M), "option tables belong to the generated part"


def test_readme_links_lead_to_files_that_exist():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    relative = [link for link in links if not re.match(r"[a-z]+:", link) and not link.startswith("#")]
    assert any(link.startswith("docs/") for link in relative)
    missing = [link for link in relative if not (ROOT / link.split("#")[0]).exists()]
    assert missing == []


def test_every_docs_page_is_in_the_site_navigation():
    config = (ROOT / "mkdocs.yml").read_text()
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    in_nav = set(re.findall(r":\s*([\w/-]+\.md)\s*$", config, re.M))
    assert pages == in_nav


def _ci_docs_build(tree: Path) -> subprocess.CompletedProcess:
    """Run .ci/setup's own documentation command (its flags, read from the script) on `tree`."""
    line = next(l for l in (ROOT / ".ci" / "setup").read_text().splitlines() if "mkdocs build" in l and "say" not in l)
    flags = shlex.split(line.split("mkdocs", 1)[1])
    flags[flags.index("--site-dir") + 1] = str(tree / "site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run([sys.executable, "-m", "mkdocs", *flags], cwd=tree, env=env, capture_output=True, text=True)


def test_ci_docs_build_passes_on_the_docs_and_fails_on_a_broken_link(tmp_path):
    pytest.importorskip("mkdocs")  # the docs extra: .ci/setup installs it with the tests
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path)
    (tmp_path / "refmount").symlink_to(ROOT / "refmount")  # mkdocstrings reads the API from the package
    clean = _ci_docs_build(tmp_path)
    assert clean.returncode == 0, clean.stderr[-2000:]
    page = tmp_path / "docs" / "troubleshooting.md"
    page.write_text(page.read_text() + "\nSee [nowhere](security-and-failures.md#no-such-heading).\n")
    broken = _ci_docs_build(tmp_path)
    assert broken.returncode != 0
    assert "no-such-heading" in broken.stderr
