"""Every ``mado`` command's help reads as help: no ids of outside documents, issue numbers or module names
(docs/design/house.md#comments)."""

import re

import click
from click.testing import CliRunner

from mado_tracking.cli import main


def _commands(group: click.Group, path=()):
    yield path
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name)


def test_no_help_text_shows_spec_ids_or_issue_numbers():
    shown = {}
    for path in _commands(main):
        result = CliRunner().invoke(main, [*path, "--help"])
        assert result.exit_code == 0, path
        shown[" ".join(path)] = re.findall(r"SPEC|\bF\d+\b|issue \d+", result.output)
    assert {name: found for name, found in shown.items() if found} == {}
    assert len(shown) > 10
