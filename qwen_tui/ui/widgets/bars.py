"""Horizontal bars drawn with block characters (bandwidth, GPU utilisation, memory)."""

from __future__ import annotations

from rich.text import Text

from ..styles import BAR_EMPTY, GOOD, tone

_EIGHTHS = " ▏▎▍▌▋▊▉█"


def bar(frac: float | None, width: int, colour: str = GOOD, mark: float | None = None) -> Text:
    """A bar `width` cells wide filled to `frac` (0..1) in `colour` (a theme variable: styles.GOOD, ...); `mark`
    draws a │ at that fraction."""
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
            t.append("│" if c == " " else c,
                     style=tone(f"bold $foreground on {colour}" if c != " " else "bold $foreground"))
        else:
            t.append(c, style=tone(f"{colour} on {BAR_EMPTY}"))
    return t
