"""`qwen-tui COMMAND --help` tells a new user enough: every argument has help text, and
every command ends with an example that parses as written."""

from __future__ import annotations

import argparse
import re
import shlex

from qwen_tui.cli.main import EXAMPLES, build_parser


def commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_argument_has_help_text():
    missing = [f"{name} {a.option_strings or a.dest}" for name, sp in commands().items() for a in sp._actions
               if not isinstance(a, argparse._HelpAction) and not (a.help and a.help.strip())]
    assert missing == []


def test_every_command_ends_with_an_example_that_parses():
    p = build_parser()
    for name, sp in commands().items():
        assert name in EXAMPLES, f"{name}: no example"
        assert sp.format_help().rstrip().endswith(EXAMPLES[name].split()[-1]), name
        cmd = re.search(r"qwen-tui [^()\"]*", EXAMPLES[name]).group(0)  # the command, without a note in (...)
        argv = shlex.split(cmd.replace("<id>", "20261201-000000-demo"))
        assert argv[:2] == ["qwen-tui", name], cmd
        args = p.parse_args(argv[1:])  # argparse exits on a flag or choice that does not exist
        assert args.command == name
