"""Tab completion of a typed path, as a shell completes it: what the wizard's path fields (Open, Save as) add to
the text when Tab is pressed. Pure apart from listing a directory; no Textual."""

from __future__ import annotations

import os
from dataclasses import dataclass

PRESET_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class Completion:
    text: str  # the path as completed (the typed text where there is nothing to add)
    options: tuple[str, ...]  # the names that matched, directories ending in "/"


def complete_path(text: str, base_dir: str, suffixes: tuple[str, ...] = PRESET_SUFFIXES) -> Completion:
    """Complete the last part of `text` (relative to `base_dir`, `~` expanded) from the entries there: directories
    and files ending in one of `suffixes`; hidden ones only when the part starts with a dot. One match completes
    whole (a directory with its "/"); several complete to what they share."""
    head, part = os.path.split(text)
    where = os.path.join(base_dir, os.path.expanduser(head)) if head else base_dir
    try:
        names = sorted(os.listdir(where))
    except OSError:
        return Completion(text, ())
    found = []
    for name in names:
        if not name.startswith(part) or (name.startswith(".") and not part.startswith(".")):
            continue
        if os.path.isdir(os.path.join(where, name)):
            found.append(name + "/")
        elif name.endswith(suffixes):
            found.append(name)
    if not found:
        return Completion(text, ())
    done = found[0] if len(found) == 1 else os.path.commonprefix(found)
    return Completion(text[:len(text) - len(part)] + done, tuple(found))
