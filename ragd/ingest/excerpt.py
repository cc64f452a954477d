"""The ``get`` op: the text of a file (or a line range of it) that lies inside a source.

Only files a source would index are served: the path is resolved first (symlinks, ``..``), so a
link or a ``../`` cannot lead outside the configured folders, and then the source's own rules
(dot-folders, globs, ``.ragignore``, Obsidian's excluded files) apply to what it points at.
Lines are counted the way the chunker counts them (``text.split("\\n")``), so a search result's
``line_start``/``line_end`` read back exactly; for a PDF they are page numbers, as in search.
"""

from __future__ import annotations

import errno
import os
import unicodedata
from pathlib import Path

from ragd import protocol as P
from ragd.config import Source
from ragd.ingest import documents, sources

# A reply carries at most this much text (UTF-8 bytes); a longer range is cut at a line end and
# says so ("truncated": true, "line_end" the last line sent), so the client can ask for the rest.
MAX_TEXT_BYTES = 256 * 1024


class Refused(Exception):
    """The file cannot be served; ``code`` is a protocol error code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def as_on_disk(path: str, all_sources: list[Source] = ()) -> str:
    """`path`, or its other Unicode form when only that one exists: a name typed composed
    (NFC, "café") finds the file a Mac or its sync tool wrote decomposed (NFD), and the
    other way round. The file system compares bytes, so without this neither is found. And
    a path as search results print a name that is not UTF-8 (each such byte a U+FFFD) finds
    the one file of a source it can stand for."""
    if os.path.lexists(path):
        return path
    for form in ("NFC", "NFD"):
        other = unicodedata.normalize(form, path)
        if other != path and os.path.lexists(other):
            return other
    if "\ufffd" in path:
        return _undecodable(path, all_sources) or path
    return path


def _undecodable(path: str, all_sources: list[Source]) -> str | None:
    """The path of the one file whose printable name (sources.printable) is `path`, looked for
    name by name below the source folder that holds `path` (never elsewhere), or None."""
    p = Path(os.path.normpath(os.path.expanduser(path)))  # (no '..' climbs out of a source)
    source = next((s for s in sorted(all_sources, key=lambda s: -len(s.root.parts))
                   if s.root in p.parents), None)
    if source is None:
        return None
    here = source.root
    for part in p.relative_to(source.root).parts:
        if os.path.lexists(here / part) or "\ufffd" not in part:
            here = here / part
            continue
        try:
            names = [n for n in os.listdir(here) if sources.printable(n) == part]
        except OSError:
            return None
        if len(names) != 1:  # none, or two names that print alike: which is not said
            return None
        here = here / names[0]
    return str(here)


def locate(path: str, all_sources: list[Source]) -> tuple[Source, Path]:
    """The source holding `path` and the file's real path; refuses paths outside every source
    (checked before anything about the file itself is looked at, so nothing leaks about files
    elsewhere) and files the source does not index. `path` is absolute and holds no NUL: the
    op checked it (ops._absolute, the one check of every op that takes a path)."""
    try:
        real = Path(os.path.realpath(os.path.expanduser(as_on_disk(path, all_sources))))
    except OSError as e:  # a link on the path removed while it was being resolved
        raise Refused(P.NOT_FOUND, f"get: {path}: {e.strerror}") from None
    holders = [s for s in all_sources if real == s.root or s.root in real.parents]
    if not holders:
        raise Refused(P.FORBIDDEN, f"get: {path} is not inside a configured source (sources: "
                      f"{', '.join(str(s.root) for s in all_sources) or 'none'})")
    source = max(holders, key=lambda s: len(s.root.parts))  # the innermost of nested sources
    try:
        folder = real == source.root or real.is_dir()
        is_file = not folder and real.is_file()
    except OSError as e:  # a name too long for the file system, a folder we may not enter
        code = P.BAD_ARGS if e.errno == errno.ENAMETOOLONG else P.NOT_FOUND
        raise Refused(code, f"get: {path}: {e.strerror}") from None
    if folder:
        raise Refused(P.NOT_FOUND, f"get: {path} is a folder, not a file")
    if not is_file:  # (before the rules: 'note.md:abc', a bad range, is no file)
        raise Refused(P.NOT_FOUND, f"get: no file {path}")
    rel = real.relative_to(source.root).as_posix()
    if not sources.Rules(source).wanted(rel):
        raise Refused(P.FORBIDDEN, f"get: {path} is excluded from source {source.name!r} by "
                      f"its rules (dot-folders, include/exclude globs, .ragignore)")
    return source, real


SWAP_TRIES = 3  # get looks this many times at a path that keeps changing, then says so


def get_text(path: str, all_sources: list[Source], line_start: int | None,
             line_end: int | None, max_file_bytes: int) -> dict:
    """locate, then read_range; looked for again when the path changed in between (a folder
    on it swapped for a link and back: what is read is what lies inside the source)."""
    for _ in range(SWAP_TRIES):
        source, real = locate(path, all_sources)
        try:
            return read_range(source, real, line_start, line_end, max_file_bytes)
        except sources.Swapped:
            continue
    raise Refused(P.NOT_FOUND, f"get: {path} keeps changing as it is read (a folder on it is "
                               f"being replaced by a link); ask again")


def read_range(source: Source, real: Path, line_start: int | None, line_end: int | None,
               max_file_bytes: int) -> dict:
    """{path, source, line_start, line_end, lines_total, text, truncated, unit, final_newline}:
    lines line_start..line_end (1-based, inclusive; line_end past the end means the end);
    final_newline: the file has a newline after the text sent (so `ragctl get` writes the
    file back as it is, with or without its last newline)."""
    if line_start is not None and line_start < 1:
        raise Refused(P.BAD_ARGS, f"get: line_start must be >= 1, got {line_start}")
    if line_end is not None and line_end < (line_start or 1):
        raise Refused(P.BAD_ARGS, f"get: line_end ({line_end}) is before line_start "
                      f"({line_start or 1})")
    unit = "page" if real.suffix.lower() == ".pdf" else "line"
    shown = sources.printable(str(real))  # a name that is not UTF-8 still goes on the wire
    try:
        # Opened once, inside the source, and read from that descriptor: the path was
        # resolved and checked a moment ago, and a folder on it swapped for a link since
        # must not lead the read out of the source.
        if unit == "page":
            with sources.opened(real, max_file_bytes, source.root) as (fd, _):
                parts, sep = documents.pdf_text(real, fd=fd), "\f"
            ends_newline = True
        else:
            text = sources.read(real, max_file_bytes, source.root).text
            parts, sep = text.split("\n"), "\n"
            ends_newline = parts[-1] == ""
            if ends_newline:  # the file's final newline ends a line; it starts none
                parts.pop()
    except sources.Outside:  # it was inside when located: a link swapped in since
        raise Refused(P.FORBIDDEN, f"get: {shown} is not inside a configured source") from None
    except sources.Swapped:
        raise  # (the op looks again: get_text)
    except sources.Vanished:
        raise Refused(P.NOT_FOUND, f"get: no file {shown}") from None
    except sources.Unreadable as e:
        raise Refused(P.BAD_ARGS, f"get: cannot read {shown}: {e}") from None
    except documents.NeedsTool as e:
        raise Refused(P.UNAVAILABLE, f"get: {e}") from None
    except ValueError as e:  # pdftotext failed
        raise Refused(P.BAD_ARGS, f"get: cannot read {shown}: {e}") from None
    total = len(parts)
    start = line_start or 1
    if start > max(total, 1):
        raise Refused(P.BAD_ARGS, f"get: line_start {start} is past the end of {shown} "
                      f"({total} {unit}s)")
    end = min(line_end if line_end is not None else total, total)
    out: list[str] = []
    size, truncated, line_cut = 0, False, False
    for i in range(start, end + 1):
        piece = parts[i - 1]
        cost = len(piece.encode("utf-8")) + (len(sep) if out else 0)
        if size + cost > MAX_TEXT_BYTES:
            truncated = True
            if not out:  # one line over the bound: send its start rather than nothing
                out.append(piece.encode("utf-8")[:MAX_TEXT_BYTES].decode("utf-8", "ignore"))
                end, line_cut = i, True
            else:
                end = i - 1
            break
        out.append(piece)
        size += cost
    return {**sources.wire_path(str(real)), "source": source.name, "line_start": start,
            "line_end": end,
            "lines_total": total, "text": sep.join(out), "truncated": truncated, "unit": unit,
            "final_newline": bool(out) and (end < total or ends_newline), "line_cut": line_cut}
