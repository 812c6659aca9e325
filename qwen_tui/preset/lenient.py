"""Opening a preset that has keys qwen-tui does not know (a typo, a setting from a newer version) without
throwing the rest away: the unknown keys are named with their lines, left out of the preset in memory,
and the file itself is never written over without the person saying so (the wizard asks)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .files import load_preset
from .schema import Preset, PresetError


def _drop(data: Any, loc: tuple) -> bool:
    """Remove the key at `loc` from the nested data; True when it was there."""
    cur = data
    for part in loc[:-1]:
        try:
            cur = cur[part]
        except (KeyError, IndexError, TypeError):
            return False
    if isinstance(cur, dict) and loc[-1] in cur:
        del cur[loc[-1]]
        return True
    return False


def load_preset_keeping_known(path: str | os.PathLike[str]) -> tuple[Preset, list[str]]:
    """(preset, problems). A valid file: (its preset, []). A file whose only problems are unknown keys:
    the preset without them, and the loader's `file:line key: unknown key (did you mean ...?)` lines.
    Anything else (a bad value, broken YAML) raises PresetError as load_preset does."""
    try:
        return load_preset(path), []
    except PresetError as e:
        first = e  # Python unbinds `e` when the except block ends; the refusal below raises this one
        problems = first.problems
        if not problems or not all("unknown key" in ln for ln in problems):
            raise
    from .yaml_io import load_yaml

    _, data = load_yaml(Path(path).read_text(encoding="utf-8"), str(path))  # read fine the first time
    try:
        Preset.model_validate(data)
    except ValidationError as e:
        extra = [tuple(err["loc"]) for err in e.errors() if err["type"] == "extra_forbidden"]
        if len(extra) != len(e.errors()) or not all(_drop(data, loc) for loc in extra):
            raise first from None
    try:
        return Preset.model_validate(data), problems
    except ValidationError:
        raise first from None
