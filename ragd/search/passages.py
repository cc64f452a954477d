"""Which passage stands for a note: a result shows the chunk that carries the match, and a
chunk too short to say anything ("Currently, no.", a tag line) never stands alone for its note.
"""

from __future__ import annotations

import re
import sqlite3

from ragd.index import store
from ragd.search import boilerplate, bm25

MIN_PASSAGE = 60  # characters: a chunk shorter than this never stands alone for a note
SECOND_SHARE = 0.5  # a note's other chunk scored at least this share of its best stands in
_FIELD = re.compile(r"[A-Za-z][\w -]{0,30}:(\s|$)")  # "Post-History: ...", "Status: Final"


def fields(text: str) -> bool:
    """Is the text a block of "Key: value" lines (a PEP's or an RFC's header), its
    continuation lines indented?"""
    lines = [line for line in text.splitlines() if line.strip()]
    return len(lines) >= 2 and bool(_FIELD.match(lines[0])) and all(
        _FIELD.match(line) or line[:1].isspace() for line in lines)


def says_little(text: str) -> bool:
    """Too short to say anything, or a header of fields: not where a note asked for whole
    (names.opening) is shown. (A header stays the passage of a search that matched it: it
    holds the author asked for; a title's words matched there point to no better chunk.)"""
    return len(text.strip()) < MIN_PASSAGE or fields(text)


def choose(db: sqlite3.Connection, top: list, query: str) -> None:
    """Each note (notes.Note) shown by a passage that says something: when its best chunk is
    shorter than MIN_PASSAGE, another of its matching chunks stands for the note (its score is
    the note's still) if it is neither short nor boilerplate, scored nearly as well
    (SECOND_SHARE) and carries the match as well: it holds a word of the query when the short
    one does. Else the short one stays, and `widen` shows the section around it."""
    texts = store.chunk_texts(db, [n.best.chunk_id for n in top])
    short = [n for n in top if len(texts.get(n.best.chunk_id, "x" * MIN_PASSAGE)) < MIN_PASSAGE]
    if not short:  # (the usual case: only the notes with a short best chunk read the others)
        return
    texts.update(store.chunk_texts(db, [c.chunk_id for n in short for c in n.chunks[1:10]]))
    matcher = bm25.LineMatcher(query)
    common = boilerplate.shared(db, [c.chunk_id for n in short for c in n.chunks[1:10]])
    for n in short:
        worded = bool(matcher.lines(texts[n.best.chunk_id], 1))
        at = next((i for i, c in enumerate(n.chunks[:10]) if i and len(
            texts.get(c.chunk_id, "")) >= MIN_PASSAGE and c.score >= SECOND_SHARE * n.best.score
            and c.chunk_id not in common
            and (not worded or matcher.lines(texts[c.chunk_id], 1))), None)
        if at is not None:
            n.chunks.insert(0, n.chunks.pop(at))


def widen(db: sqlite3.Connection, results: list[dict]) -> None:
    """A result whose passage is still shorter than MIN_PASSAGE (its note's only match) is
    shown with the chunks after it in its file (before it, at the file's end) until it is
    not: the section around a short answer, not the answer alone. Not with boilerplate, a
    text many notes share: a stub of a note (a placeholder line) was shown by the footer every
    note ends with, the line of it that holds the note's own address."""
    for r in results:
        cid = r.get("chunk_id")
        if cid is None or store.unsaved(cid) or len(r["text"]) >= MIN_PASSAGE \
                or r["path"].lower().endswith(".pdf"):  # (a PDF's ranges are pages)
            continue
        after, before = store.chunk_neighbours(db, cid)
        common = boilerplate.shared(db, [row[0] for row in after + before])
        for rows, forward in ((after, True), (before, False)):
            for nid, start, end, text in rows:
                if len(r["text"]) >= MIN_PASSAGE or nid in common:
                    break
                # the lines between stay lines (blank), so that a line of the text is still
                # line_start + its index in the file
                if forward and start > r["line_end"]:
                    gap = "\n" * (start - r["line_end"])
                    r["text"], r["line_end"] = r["text"] + gap + text, end
                elif not forward and end < r["line_start"]:
                    gap = "\n" * (r["line_start"] - end)
                    r["text"], r["line_start"] = text + gap + r["text"], start


def second(db: sqlite3.Connection, note) -> dict | None:
    """A note's second passage (for ask): its next matching chunk that says something
    (MIN_PASSAGE, not boilerplate) and scored at least SECOND_SHARE of its best; None when it
    has none."""
    best = note.best.score
    common = boilerplate.shared(db, [c.chunk_id for c in note.chunks[1:10]])
    for c in note.chunks[1:10]:
        if store.unsaved(c.chunk_id) or (best > 0 and c.score < SECOND_SHARE * best) \
                or c.chunk_id in common:
            continue
        row = store.chunk_row(db, c.chunk_id)
        if row is not None and len(row["text"]) >= MIN_PASSAGE:
            return {"heading": row["heading"], "line_start": row["line_start"],
                    "line_end": row["line_end"], "text": row["text"]}
    return None
