"""`qwen-tui COMMAND --help` tells a new user enough: every command has a description, every argument its help
text, every command ends with examples that parse as written and name presets that are shipped, and the whole
help is wrapped to the terminal. Old option spellings keep working, hidden from the help."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest

from qwen_tui.cli.main import EXAMPLES, build_parser
from support.paths import ROOT


def commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_argument_has_help_text_and_every_command_a_description():
    missing = [f"{name} {a.option_strings or a.dest}" for name, sp in commands().items() for a in sp._actions
               if not isinstance(a, argparse._HelpAction) and not (a.help and a.help.strip())]
    assert missing == []
    short = [name for name, sp in commands().items() if len((sp.description or "").split()) < 12]
    assert short == [], "commands whose --help has no description of a sentence or more"


def test_every_command_ends_with_examples_that_parse():
    p = build_parser()
    for name, sp in commands().items():
        assert EXAMPLES.get(name), f"{name}: no example"
        help_text = sp.format_help()
        assert help_text.rstrip().endswith(EXAMPLES[name][-1]), name  # the last line of its --help, whole
        for line in EXAMPLES[name]:
            assert f"\n  {line}\n" in help_text + "\n", (name, line)
            cmd = re.search(r"qwen-tui [^\")]*", line).group(0).split(">")[0]  # the command alone
            argv = shlex.split(cmd.replace("RUN_ID", "20261201-000000-demo-0001"))
            assert argv[:2] == ["qwen-tui", name], cmd
            args = p.parse_args(argv[1:])  # argparse exits on a flag or choice that does not exist
            assert args.command == name
            for preset in (a for a in argv if a.startswith("presets/")):
                assert (ROOT / preset).is_file(), (name, preset)  # an example names a preset that is shipped


@pytest.mark.parametrize("columns", [80, 120])
def test_the_help_is_wrapped_to_the_terminal(monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    texts = {"qwen-tui": build_parser().format_help(), **{n: sp.format_help() for n, sp in commands().items()}}
    for name, text in texts.items():
        wide = [ln for ln in text.splitlines() if len(ln) > columns]
        assert wide == [], (name, wide)
    # the description fills the width rather than one long line: a wrapped paragraph of several lines
    desc = texts["check"].split("\n\n")[1]
    assert len(desc.splitlines()) >= 3 and max(map(len, desc.splitlines())) > columns - 20, desc


def test_old_spellings_work_say_the_new_one_and_hide(capsys):
    p = build_parser()
    for argv, dest, new in ((["estimate", "x.yaml", "--bandwidth-gbps", "400"], "bus_gbps", "--bus-gbps"),
                            (["data", "x.yaml", "--bandwidth-gbps", "25"], "link_gbps", "--link-gbps")):
        args = p.parse_args(argv)
        assert getattr(args, dest) == float(argv[-1])
        err = capsys.readouterr().err
        assert "--bandwidth-gbps is deprecated" in err and new in err, err
        assert "--bandwidth-gbps" not in commands()[argv[0]].format_help() and new in commands()[argv[0]].format_help()
