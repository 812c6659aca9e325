"""Where the shipped presets are: inside the installed package (a wheel), or the checkout's presets/ (a source
tree or an editable install)."""

from __future__ import annotations

from pathlib import Path

PACKAGED = Path(__file__).resolve().parents[1] / "presets"  # qwen_tui/presets
CHECKOUT = Path(__file__).resolve().parents[2] / "presets"


def presets_dir() -> Path:
    return PACKAGED if PACKAGED.is_dir() else CHECKOUT


def shipped_preset(name: str) -> Path:
    return presets_dir() / name
