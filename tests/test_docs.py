"""The docs keep up with the tool: every flag is in docs/cli.md, every relative link resolves,
and the README's test command is the one CI runs."""

import re
from pathlib import Path

import pytest

from autotune.cli.main import build_parser

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _flags() -> list[tuple[str, str]]:
    parser = build_parser()
    out = [("", a) for action in parser._actions for a in action.option_strings]
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        out += [(name, a) for action in p._actions for a in action.option_strings]
    return [(cmd, flag) for cmd, flag in out if flag not in ("-h", "--help")]


def test_every_flag_of_every_command_is_in_the_cli_page() -> None:
    page = (ROOT / "docs" / "cli.md").read_text()
    sections = dict(re.findall(r"^## `autotune (\w+)`\n(.*?)(?=^## |\Z)", page, re.S | re.M))
    flags = _flags()
    assert len(flags) > 40
    for cmd, flag in flags:
        section = sections[cmd] if cmd else page
        inherited = "as for `simulate`" in section and f"`{flag}" in sections["simulate"]
        assert f"`{flag}" in section or inherited, f"autotune {cmd} {flag} is not in docs/cli.md"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    for link in links:
        if "://" in link:
            continue
        assert (page.parent / link).exists(), f"{page.name} links to {link}, which is missing"


def test_the_readme_test_command_is_what_ci_runs() -> None:
    readme, ci = (ROOT / "README.md").read_text(), (ROOT / ".ci" / "run").read_text()
    command = re.search(r"pip install -e '\.\[cpu,test\]' && (.+)", readme)
    assert command is not None
    for part in command.group(1).split(" && "):
        assert part.strip() in ci, part


def test_the_cli_page_has_the_plan_flags_table_generated_from_the_parameters() -> None:
    from autotune.cli.options import plan_flags_table

    page = (ROOT / "docs" / "cli.md").read_text()
    assert plan_flags_table() in page, "regenerate: python -m autotune.cli.options"
