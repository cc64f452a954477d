"""A search that is a note's name: the query, word for word, is a note's title or one of its
aliases (the frontmatter's; a document's file name, or its number: "PEP 8"). That note is the
one asked for, and it comes first, whatever the rankings make of the words: a short name of
common words or numbers ("PEP 8": "pep" is in every PEP, "8" in every "3.8" and "UTF-8") ranks
the notes that repeat them, not the one they name. Names are compared as text.name_key gives
them (casefolded words, numbers without zero padding), from the note_names table.
"""

from __future__ import annotations

import sqlite3

from ragd.search import boilerplate
from ragd.search.fusion import Candidate, lift
from ragd.search.passages import says_little
from ragd.text import name_key

MAX_WORDS = 12  # a longer query is a question or a passage, not a name
# A name more notes share than this names none of them ("Index", "README" in every folder)
MAX_NAMED = 3
# A named note is shown by its opening, sought among its first chunks
OPENING_CHUNKS = 6


def named(db: sqlite3.Connection, query: str, files=None, exclude=()) -> tuple[str, list[int]]:
    """The query's name key and the ids of the notes it names (among `files` when given, none
    of `exclude`), in file id order; [] when it names none, or more than MAX_NAMED."""
    key = name_key(query)
    if not key or key.count(" ") >= MAX_WORDS:
        return key, []
    ids = [r[0] for r in db.execute("SELECT file_id FROM note_names WHERE key = ? "
                                    "ORDER BY file_id LIMIT ?", (key, MAX_NAMED + 1))]
    ids = [f for f in ids if (files is None or f in files) and f not in exclude]
    return key, ids if len(ids) <= MAX_NAMED else []


def opening(db: sqlite3.Connection, file_id: int) -> int | None:
    """The chunk a named note is shown by: its opening, the first of its chunks that says
    something of it (not passages.says_little: long enough, not a header of fields; nor
    boilerplate, a text many notes share); its first chunk when none of the first
    OPENING_CHUNKS does. Asked for by its name, a note is asked for whole: where it begins
    says what it is, where the name's words happen to fall ("Type Hints": a tip on `None` in
    a type hint; "The Zen of Python": its header) does not, nor does a footer every note
    ends with (an empty stub of a note is shown by its placeholder line, not by that)."""
    rows = db.execute("SELECT id, text FROM chunks WHERE file_id = ? ORDER BY ordinal LIMIT ?",
                      (file_id, OPENING_CHUNKS)).fetchall()
    common = boilerplate.shared(db, [cid for cid, _ in rows])
    said = next((cid for cid, text in rows if not says_little(text) and cid not in common),
                None)
    return said if said is not None else (rows[0][0] if rows else None)


def show_opening(db: sqlite3.Connection, note) -> None:
    """A named note (notes.Note) shown by its opening: that chunk first among its chunks,
    with its own scores when the rankings found it; else put before them, with the note's
    best score and no signal's (nothing ranked it: the name did)."""
    cid = opening(db, note.file_id)
    if cid is None or note.best.chunk_id == cid:
        return
    at = next((i for i, c in enumerate(note.chunks) if c.chunk_id == cid), None)
    if at is not None:
        note.chunks.insert(0, note.chunks.pop(at))
    else:
        note.chunks.insert(0, Candidate(cid, note.best.score, {}))


def put_first(db: sqlite3.Connection, items: list, ids: list[int], file_of, make,
              mark) -> list[int]:
    """The items (notes, or chunks) of the named notes `ids` moved to the top, in the order
    they ranked; a named note with none among them joins by its first chunk (make(file id,
    chunk id, score) builds its item); mark(item) says so in its scores. Returns the rank
    each had (0: not among them)."""
    had = []
    for fid in ids:
        at = next((i for i, x in enumerate(items) if file_of(x) == fid), None)
        had.append(0 if at is None else at + 1)
    order = sorted(range(len(ids)), key=lambda i: had[i] or len(items) + 1 + i)
    place = 0
    for i in order:
        fid = ids[i]
        if had[i]:
            lift(items, lambda x, fid=fid: file_of(x) == fid, place + 1)
        else:
            cid = opening(db, fid)
            if cid is None:  # (deleted meanwhile)
                continue
            items.insert(place, make(fid, cid, items[place].score if place < len(items)
                                     else 1.0))
        mark(items[place])
        place += 1
    return had
