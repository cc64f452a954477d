"""Boilerplate: a chunk whose exact text is in several notes of its source — a template's
fixed section ("Output Goal: write what the output goal for this adoption is…"), a tag line,
a licence footer — says nothing of what any one of them is about, yet it matches every query
its words match, once per copy. Search and related notes weigh such a chunk down the more
notes share it, so the note that answers is not buried under copies of a template.

A text in two notes may be a note and its copy (both real); from SHARED_MIN notes on it is
taken for boilerplate.
"""

from __future__ import annotations

import math
import sqlite3

from ragd.index import store

SHARED_MIN = 3


def weight(shared: int) -> float:
    """What a chunk's score is multiplied by when `shared` notes of its source hold its text:
    1 below SHARED_MIN, then 1 / (1 + ln(shared - 1)): 0.59 for 3 notes, 0.38 for 6, 0.23
    for 30, 0.15 from 256 on (the count stops there: store.shared_text_counts)."""
    return 1.0 if shared < SHARED_MIN else 1.0 / (1.0 + math.log(shared - 1))


def shared(db: sqlite3.Connection, chunk_ids) -> dict[int, int]:
    """chunk id -> how many notes share its text, for the chunks that are boilerplate."""
    return store.shared_text_counts(db, chunk_ids, SHARED_MIN)
