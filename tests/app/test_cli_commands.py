"""The command table the CLI lists without importing the commands (issue #28's cold start)."""

from __future__ import annotations

import argparse

import pytest

from icefloe_app.cli import build_parser
from icefloe_app.cli.commands import COMMANDS


def _listed(parser: argparse.ArgumentParser) -> list[tuple[str, str | None, str]]:
    """(command, one-line help, shown name with aliases) as ``icefloe --help`` lists them."""
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [(a.dest, a.help, a.metavar) for a in sub._choices_actions]


def test_the_table_says_what_the_command_modules_register():
    """Every module's own ``register`` (the full parser) agrees with the light table."""
    full = _listed(build_parser())
    assert [(name, help_) for name, help_, _ in full] == [(c.name, c.help) for c in COMMANDS]
    (sub,) = [a for a in build_parser()._actions
              if isinstance(a, argparse._SubParsersAction)]
    aliases = {c.name: c.aliases for c in COMMANDS}
    for name, parser in sub.choices.items():
        assert name in aliases or name in sum(aliases.values(), ())
        assert parser.prog.split()[-1] in aliases


@pytest.mark.parametrize("command", [c.name for c in COMMANDS] + ["sql"])
def test_each_command_gets_its_full_parser(command, capsys):
    """The named command's module registers its options; the rest stay stubs."""
    with pytest.raises(SystemExit):
        build_parser([command, "--help"]).parse_args([command, "--help"])
    full = capsys.readouterr().out
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    assert full == capsys.readouterr().out


def test_a_named_command_lists_the_others_from_the_table_alone():
    """``icefloe query ...`` imports query_cmd only; the rest are stubs listed as before."""
    lazy = build_parser(["query", "SELECT 1"])
    assert _listed(lazy) == _listed(build_parser())
    (sub,) = [a for a in lazy._actions if isinstance(a, argparse._SubParsersAction)]
    assert sub.choices["query"] is sub.choices["sql"]
    assert any(a.dest == "engine" for a in sub.choices["query"]._actions)
    assert [a.dest for a in sub.choices["admin"]._actions] == ["help"]  # a stub
