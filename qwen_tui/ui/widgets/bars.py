"""Horizontal bars drawn with block characters (bandwidth, GPU utilisation, memory)."""

from __future__ import annotations

from typing import Optional

from rich.text import Text

_EIGHTHS = " ▏▎▍▌▋▊▉█"


def bar(frac: Optional[float], width: int, style: str = "green", mark: Optional[float] = None) -> Text:
    """A bar `width` cells wide filled to `frac` (0..1); `mark` draws a │ at that fraction."""
    t = Text()
    if frac is None:
        return Text("?".center(width, "·"), style="dim")
    frac = max(0.0, min(1.0, frac))
    eighths = round(frac * width * 8)
    full, part = divmod(eighths, 8)
    cells = ["█"] * full + ([_EIGHTHS[part]] if part and full < width else [])
    cells += [" "] * (width - len(cells))
    mark_at = None if mark is None else min(width - 1, int(mark * width))
    for i, c in enumerate(cells):
        if i == mark_at:
            t.append("│" if c == " " else c, style=f"bold white on {style}" if c != " " else "bold white")
        else:
            t.append(c, style=f"{style} on grey15")
    return t
