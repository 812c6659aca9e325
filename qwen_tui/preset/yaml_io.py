"""Hostile-input guards between a preset's text and PyYAML's safe loader.

`safe_load` alone turns some files into tracebacks or surprises: deep nesting
recurses past Python's limit, a 5,000-digit integer exceeds int()'s digit limit,
a duplicate key silently replaces the first one, and an alias "bomb" expands into
billions of nodes for the validator to walk. `load_yaml` checks each before it
builds any Python object and raises PresetError with one `file:line field:
problem` line.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_DEPTH = 64  # a preset is four levels deep; anything past this is not a preset
MAX_NODES = 100_000  # nodes after aliases are expanded
MAX_INT_DIGITS = 100

_OPEN = (yaml.BlockMappingStartToken, yaml.BlockSequenceStartToken, yaml.FlowMappingStartToken,
         yaml.FlowSequenceStartToken)
_CLOSE = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)
_INT = "tag:yaml.org,2002:int"


class PresetError(ValueError):
    """A preset could not be loaded or saved. `problems` holds one line per problem.
    (It lives here, below schema.py, so the guards raise it without a circular import;
    qwen_tui.preset.schema re-exports it.)"""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def _err(source: str, line: int, path: list, problem: str):
    if len(path) > 8:
        path = [*path[:4], "...", *path[-2:]]
    where = ".".join(str(p) for p in path) or "(top level)"
    return PresetError([f"{source}:{line} {where}: {problem}"])


def _check_depth(text: str, source: str) -> None:
    """Nesting depth from the token stream (PyYAML's scanner does not recurse)."""
    stack: list[str | None] = []
    want_key = False
    for tok in yaml.scan(text, Loader=yaml.SafeLoader):
        if isinstance(tok, _OPEN):
            stack.append(None)
            if len(stack) > MAX_DEPTH:
                raise _err(source, tok.start_mark.line + 1, [k for k in stack if k is not None],
                           f"nested more than {MAX_DEPTH} levels deep")
        elif isinstance(tok, _CLOSE):
            if stack:
                stack.pop()
        elif isinstance(tok, yaml.KeyToken):
            want_key = True
            continue
        elif isinstance(tok, yaml.ScalarToken) and want_key and stack:
            stack[-1] = tok.value[:60]
        want_key = False


def _check_graph(root: yaml.Node, source: str) -> None:
    """Duplicate keys, over-long integers and alias expansion, over the composed nodes."""
    sizes: dict[int, int] = {}

    def walk(node: yaml.Node, path: list) -> int:
        if id(node) in sizes:  # an alias: the same node again; count its expansion, check it once
            return sizes[id(node)]
        line = node.start_mark.line + 1
        size = 1
        if isinstance(node, yaml.ScalarNode):
            try:
                node.value.encode("utf-8")
            except UnicodeEncodeError:  # "\ud800" in a double-quoted string
                raise _err(source, line, path, "holds a lone surrogate (an unpaired \\ud800-\\udfff escape)") from None
            digits = sum(c.isdigit() for c in node.value) if node.tag == _INT else 0
            if digits > MAX_INT_DIGITS:
                raise _err(source, line, path, f"a number of {digits} digits is not a setting")
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                size += walk(item, path + [i])
        elif isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for k, v in node.value:
                key = k.value if isinstance(k, yaml.ScalarNode) else None
                kline = k.start_mark.line + 1
                if key is not None and key in first:
                    raise _err(source, kline, path + [key],
                               f"duplicate key (first on line {first[key]}, again on line {kline})")
                if key is not None:
                    first[key] = kline
                size += walk(k, path) + walk(v, path + [key if key is not None else "?"])
        if size > MAX_NODES:
            raise _err(source, line, path, f"expands to more than {MAX_NODES:,} values (aliases?)")
        sizes[id(node)] = size
        return size

    walk(root, [])


def load_yaml(text: str, source: str) -> tuple[yaml.Node | None, Any]:
    """(composed root node, Python data) of one YAML document, guarded as above.
    Raises PresetError, or yaml.YAMLError for plain syntax errors."""
    _check_depth(text, source)
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None, None
        _check_graph(root, source)
        try:
            return root, loader.construct_document(root)
        except (ValueError, TypeError, OverflowError) as e:  # a value YAML resolves but Python refuses
            mark = getattr(e, "problem_mark", None)
            raise _err(source, mark.line + 1 if mark else 1, [], f"cannot read a value: {e}") from None
    finally:
        loader.dispose()
