"""Boilerplate: a chunk whose text is in several notes of its source — a template's
fixed section ("Output Goal: write what the output goal for this adoption is…"), a tag line,
a licence footer, a footer linking each note's own page (one text as read: its addresses
aside, chunker.read_hash) — says nothing of what any one of them is about, yet it matches
every query its words match, once per copy. Search and related notes weigh such a chunk
down the more notes share it, so the note that answers is not buried under copies of a
template.

A text in two notes may be a note and its copy (both real); from SHARED_MIN notes on it is
taken for boilerplate.
"""

from __future__ import annotations

import math
import sqlite3
import threading

from ragd.index import store

SHARED_MIN = 3


def weight(shared: int) -> float:
    """What a chunk's score is multiplied by when `shared` notes of its source hold its text:
    1 below SHARED_MIN, then 1 / (1 + ln(shared - 1)): 0.59 for 3 notes, 0.38 for 6, 0.23
    for 30, 0.15 from 256 on (the count stops there: store.shared_text_counts)."""
    return 1.0 if shared < SHARED_MIN else 1.0 / (1.0 + math.log(shared - 1))


def shared(db: sqlite3.Connection, chunk_ids, known: Known | None = None) -> dict[int, int]:
    """chunk id -> how many notes share its text, for the chunks that are boilerplate; the
    counts `known` holds for the index as db reads it are not counted again."""
    if known is None:
        return store.shared_text_counts(db, chunk_ids, SHARED_MIN)
    return known.shared(db, chunk_ids)


class Known:
    """The counts of chunks already looked at, for as long as no chunk changes (the chunks'
    generation, store.chunks_gen: a file's text in a note, added or removed, bumps it; a
    file's source never changes in place). A search weighs its ~150 candidates, and the
    notes that answer a vault's questions come back from search to search. Counted again
    each time (one probe of the text's index per candidate, then up to 256 rows per repeated
    text), they were most of the fusion's time in a large corpus where templates repeat.
    Shared by the searches of every request thread; a search reading an older snapshot
    than the counts are of counts for itself."""

    LIMIT = 200_000  # chunks remembered (~25 MB); past it, counted again from scratch

    def __init__(self):
        self._lock = threading.Lock()
        self._gen = -1
        self._counts: dict[int, int] = {}  # chunk id -> notes sharing its text (0: < SHARED_MIN)

    def shared(self, db: sqlite3.Connection, chunk_ids) -> dict[int, int]:
        ids = list(dict.fromkeys(chunk_ids))
        gen = store.chunks_gen(db)
        with self._lock:
            if gen > self._gen or len(self._counts) > self.LIMIT:
                self._gen, self._counts = gen, {}
            counts = self._counts if gen == self._gen else {}
            have = {c: counts[c] for c in ids if c in counts}
        missing = [c for c in ids if c not in have]
        found = store.shared_text_counts(db, missing, SHARED_MIN) if missing else {}
        with self._lock:
            if gen == self._gen:
                # (a negative id is an editor's buffer, no row: never counted, never kept)
                self._counts.update((c, found.get(c, 0)) for c in missing if c >= 0)
        have.update(found)
        return {c: n for c, n in have.items() if n >= SHARED_MIN}
