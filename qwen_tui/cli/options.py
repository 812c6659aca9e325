"""What every command's --help and options share: the help's layout, and old option spellings kept working."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from typing import Any


class HelpFormatter(argparse.HelpFormatter):
    """--help wrapped to the terminal: the description's paragraphs are filled to its width, while a paragraph of
    indented lines (the examples) is kept as written, since a wrapped command cannot be copied."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for para in text.split("\n\n"):
            lines = para.splitlines()
            if any(ln.startswith("  ") for ln in lines[1:]) or (lines and lines[0].startswith("  ")):
                out.append("\n".join(indent + ln for ln in lines))
            else:
                out.append(textwrap.fill(" ".join(para.split()), width, initial_indent=indent,
                                         subsequent_indent=indent))
        return "\n\n".join(out)


def examples(*lines: str) -> str:
    """An epilog of commands a user can copy, one a line."""
    return "examples:\n" + "\n".join(f"  {ln}" for ln in lines)


class DeprecatedAlias(argparse.Action):
    """An option's old spelling: it still works, stores into the new option's place and says, once, what to type
    from now on (on stderr, so a --json output stays clean). Hidden from --help."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str = "", **kwargs: Any) -> None:
        self.new = new
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"qwen-tui: {option_string} is deprecated and will go: it is {self.new} now "
              f"({self.new} {values} does the same)", file=sys.stderr)
        setattr(namespace, self.dest, values)
