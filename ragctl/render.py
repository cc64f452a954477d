"""ragctl's text for people: a name on one terminal line, a result's path:line to jump to, the
query's words marked in its lines, a search's --explain, and ask's progress line."""

from __future__ import annotations

import base64
import os
import re
import shutil
import sys
import unicodedata

from ragd import protocol as P


def _ago(seconds: float) -> str:
    """A duration as a person reads it: "0.3 s", "45 s", "12 min", "5 h 20 min", "3 d 4 h"
    (a daemon up for a month was "43200 min")."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 120:
        return f"{minutes} min"
    hours = minutes // 60
    if hours < 48:
        return f"{hours} h {minutes % 60} min"
    return f"{hours // 24} d {hours % 24} h"


class _Progress:
    """One line of progress on stderr while the model thinks: rewritten in place on a
    terminal and cleared once the answer shows; elsewhere (a log) only its first line."""

    def __init__(self, out):
        self.out = out
        self.tty = out.isatty()
        self.shown = False

    def show(self, text: str, first: bool = False) -> None:
        if not self.tty and not first:
            return
        if self.tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.out.write("\r\033[K" + text[:width])
        else:
            self.out.write(text + "\n")
        self.out.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown and self.tty:
            self.out.write("\r\033[K")
            self.out.flush()
        self.shown = False


def _explain(scores: dict, weights: dict | None) -> str:
    """Each signal's rank and score for one result (search --explain)."""
    out = []
    if "named" in scores:
        out.append(f"the query is this note's name ({scores['named']!r}): first")
    for name in ("bm25", "vector"):
        if f"{name}_rank" in scores:
            w = f", weight {weights[name]}" if weights and name in weights else ""
            out.append(f"{name} rank {scores[name + '_rank']} (score {scores[name]}{w})")
        elif name in scores:  # its cosine read for a BM25 candidate (vectors still coming)
            out.append(f"{name}: not in its top candidates; cosine {scores[name]}")
        elif weights and name in weights:
            out.append(f"{name}: not in its top candidates")
    if "place_of_bm25_rank" in scores:
        out.append(f"in bm25 rank {scores['place_of_bm25_rank']}'s place: while vectors are "
                   f"coming the candidates that have theirs are ordered by both in the places "
                   f"they hold")
    for name, label in (("fused", "fused (convex: the scores scaled over their lists)"),
                        ("rrf", "fused (RRF)")):
        if name in scores:
            out.append(f"{label} {scores[name]}")
    if "note_bm25_rank" in scores:
        out.append(f"whole note bm25 rank {scores['note_bm25_rank']} (score "
                   f"{scores['note_bm25']}, adds {scores['note_bm25_added']})")
    for name, label in (("note", "note score (best chunk, length-damped"
                         + (", + whole note)" if "note_bm25_rank" in scores else ")")),
                        ("rerank", "reranker")):
        if name in scores:
            out.append(f"{label} {scores[name]}")
    return "; ".join(out)


_STOP = frozenset("a an and are as at be by can do does for from has have how i if in is it "
                  "its my of on or so that the this to was what when where which who why will "
                  "with you your".split())


def _terms(query: str) -> list[str]:
    """The query's words to mark in results, cut to a stem-ish prefix (FTS5 stems with
    porter: 'repeating' matched 'repeat'), and its signs (emoji, ':=': words to the index too)."""
    out = []
    for w in re.findall(r"\w+", P.fold(query.lower())):
        if w in _STOP or len(w) < 2:
            continue
        for suffix in ("ing", "ed", "es", "s"):
            if len(w) > len(suffix) + 3 and w.endswith(suffix):
                w = w[: -len(suffix)]
                break
        out.append(w)
    out += P.signs(query)
    return sorted(set(out), key=len, reverse=True)


def _pattern(terms: list[str]) -> re.Pattern:
    """Where terms match: a word at a word's start (and the rest of that word), one of two
    letters only whole (as the daemon's lines: 'go' is not in 'good'), a symbol anywhere."""
    return re.compile("|".join((rf"\b{re.escape(t)}\b" if len(t) < 3 else
                                rf"\b{re.escape(t)}\w*") if re.match(r"\w", t) else re.escape(t)
                               for t in terms), re.I)


def _mark(text: str, terms: list[str], color: bool) -> str:
    """The matches of the terms in the text marked: found in the text as the index compares
    words (P.fold: 'cafe' marks 'café'), marked in the text as it is."""
    if not terms or not color:
        return text
    out, at = [], 0
    for m in _pattern(terms).finditer(P.fold(text)):
        out += [text[at:m.start()], f"\033[1;31m{text[m.start():m.end()]}\033[0m"]
        at = m.end()
    return "".join(out) + text[at:]


def _excerpt(line: str, terms: list[str], width: int = 160) -> str:
    """At most `width` characters of a line, around its first match when it is longer: cuts
    are shown with "…"."""
    if len(line) <= width:
        return line
    m = _pattern(terms).search(P.fold(line)) if terms else None
    start = max(0, min((m.start() if m else 0) - width // 3, len(line) - width))
    cut = line[start:start + width]
    return ("…" if start else "") + cut + ("…" if start + width < len(line) else "")


def _bold(text: str, color: bool) -> str:
    return f"\033[1m{text}\033[0m" if color else text


def _jump(r: dict, name: str | None = None) -> str:
    """A result's path:line, its best matching line (a terminal or editor jumps there); `name`:
    its path as shown, when not the printable one."""
    at = r.get("match_lines") or []
    return f"{_one_line(r['path']) if name is None else name}:{at[0] if at else r['line_start']}"


def print_jumps(results: list[dict]) -> None:
    """The results' path:line, one a line, as -l prints them. A file gone from disk since it
    was indexed is left out, as grep -l lists no file that is not there (`| xargs` would fail
    on it); stderr says how many."""
    gone = 0
    for r in results:
        if r.get("stale") and not os.path.lexists(_exact(r)):
            gone += 1
            continue
        print_jump(r)
    if gone:
        sys.stdout.flush()
        print(f"({_count(gone, 'result')} gone from disk since indexed: not listed)",
              file=sys.stderr)


def _exact(r: dict) -> str:
    """A result's path as the file system names it (a name that is not UTF-8: its bytes as
    surrogates)."""
    return os.fsdecode(base64.b64decode(r["path_bytes"])) if "path_bytes" in r else r["path"]


def print_jump(r: dict) -> None:
    """A result's path:line as -l prints it: a name that is not UTF-8 as its exact bytes (its
    printable form has U+FFFD where they were, which no file is named: `| xargs` needs the
    bytes, as grep -l prints them)."""
    if "path_bytes" not in r:
        print(_jump(r))
        return
    line = _jump(r, "".join(ch if "\udc80" <= ch <= "\udcff" else _one_line(ch)
                            for ch in _exact(r)))
    sys.stdout.flush()
    sys.stdout.buffer.write(os.fsencode(line) + b"\n")


def _count(n: int, word: str) -> str:
    """'1 file', '3 files', '24,780 chunks'."""
    return f"{n:,} {word}{'s' if n != 1 else ''}"


def _lines(start: int, end: int) -> str:
    """'line 5' or 'lines 5-9'."""
    return f"line {start}" if start == end else f"lines {start}-{end}"


def _head(heading: str, title: str) -> str:
    """What a result shows after its title: its heading path past the note's title, and past
    a first heading that only says the title again ("2021-08-14: Highlights" under the note
    "2021-08-14 Highlights" was shown as both)."""
    parts = heading.split(" > ")[1:]
    if parts and _loose(parts[0]) == _loose(title):
        parts = parts[1:]
    return _one_line(" > ".join(parts))


def _loose(text: str) -> list[str]:
    return re.findall(r"\w+", text.casefold())


def _one_line(text: str) -> str:
    """A name or reason on one terminal line: control characters (a newline in a file name)
    and invisible format ones shown escaped. Spaces of every kind stay as they are (a no-break
    space or an ideographic one is ordinary text, and a printed path must open the file)."""
    return "".join(ch if ch.isprintable() or unicodedata.category(ch) == "Zs"
                   else repr(ch)[1:-1] for ch in text)
