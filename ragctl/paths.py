"""``PATH:START-END``: a file and a line range in one argument, as ``ragctl search`` prints it."""

from __future__ import annotations

import re

_RANGE = re.compile(r"(?s)(.+):(\d+)(?:-(\d+))?")


def split_range(text: str) -> tuple[str, int | None, int | None]:
    """(path, line_start, line_end) from ``PATH``, ``PATH:START`` (from START to the end) or
    ``PATH:START-END``. A file whose name itself ends in ``:<digits>`` takes a range after it
    (``log:2024:1`` is the file ``log:2024`` from line 1)."""
    m = _RANGE.fullmatch(text)
    if m is None:
        return text, None, None
    return m.group(1), int(m.group(2)), int(m.group(3)) if m.group(3) else None
