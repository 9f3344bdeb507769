"""MkDocs hook: the option reference, rendered from refmount's own argument parser.

docs/options.md holds a placeholder between `<!-- refmount-options -->` and `<!-- /refmount-options -->`
(what a reader of the Markdown file on GitHub sees); at build time it becomes one section per
command (`refmount`, `refmount mount`, ...), with a table per option group: every option's names and
value, its default and its help text, taken from `refmount.cli.build_parser()`, the parser that
prints `--help`. The page therefore cannot drift from `--help` (tests/test_docs.py checks it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MARKER, END = "<!-- refmount-options -->", "<!-- /refmount-options -->"
WIDTH = 80  # usage lines wrap here, whatever the terminal of the build
_REPO = Path(__file__).resolve().parents[2]


def on_page_markdown(markdown: str, page=None, config=None, files=None, **_) -> str:
    if MARKER not in markdown:
        return markdown
    before, _, rest = markdown.partition(MARKER)
    _, _, after = rest.partition(END)
    return before + options_markdown() + after


def commands() -> list[tuple[str, argparse.ArgumentParser]]:
    """('', the top parser), then ('mount', its parser), ... in the order `refmount --help` lists them."""
    if str(_REPO) not in sys.path:  # build from a checkout: document this checkout's parser
        sys.path.insert(0, str(_REPO))
    from refmount.cli import build_parser

    top = build_parser()
    found = [("", top)]
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            found += list(action.choices.items())
    return found


def groups(parser: argparse.ArgumentParser) -> list[tuple[str, list[argparse.Action]]]:
    """The parser's argument groups as `--help` shows them, without subcommand choosers."""
    shown = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction)]
        if actions:
            shown.append((group.title or "options", actions))
    return shown


def anchor(command: str, action: argparse.Action) -> str:
    """A stable id per option: #mount-cache-size, #umount-lazy, #refmount-version, #mount-REFS."""
    name = action.option_strings[-1].lstrip("-") if action.option_strings else action.metavar or action.dest
    return f"{command or 'refmount'}-{name}"


def invocation(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The option as `--help` spells it: '-f, --foreground', '--view {decoded,raw}', '--cache-size SIZE'."""
    return parser._get_formatter()._format_action_invocation(action)


def help_text(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    return parser._get_formatter()._expand_help(action) if action.help else ""


def default_text(action: argparse.Action) -> str:
    if action.option_strings == [] or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
        return "—"
    if action.nargs == 0:  # a flag: given or not
        return "off"
    value = action.default
    if value is None or value is argparse.SUPPRESS:
        return "—"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict):
        return "{}" if not value else repr(value)
    return str(value)


def escape(text: str) -> str:
    """Plain help text inside a Markdown table cell: no emphasis, no HTML, no column breaks."""
    for char in "\\`*_[]|":
        text = text.replace(char, "\\" + char)
    return text.replace("<", "&lt;").replace(">", "&gt;")


def code(text: str) -> str:
    return "`" + text.replace("|", "\\|") + "`"


def options_markdown() -> str:
    out = []
    for command, parser in commands():
        parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=WIDTH)
        title = f"refmount {command}".strip()
        out.append(f"## `{title}` {{#{command or 'refmount'}}}\n")
        out.append("```text\n" + parser.format_usage().strip() + "\n```\n")
        if parser.description:
            out.append(escape(parser.description) + "\n")
        for group_title, actions in groups(parser):
            out.append(f"**{escape(group_title)}**\n")
            kind = "option" if any(a.option_strings for a in actions) else "argument"
            out.append(f"| {kind} | default | meaning |\n|---|---|---|")
            for action in actions:
                names = ", ".join(code(part) for part in invocation(parser, action).split(", "))
                out.append(f'| <a id="{anchor(command, action)}"></a>{names} | {code(default_text(action))} '
                           f"| {escape(help_text(parser, action))} |")
            out.append("")
    return "\n".join(out)
