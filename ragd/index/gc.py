"""Garbage collection of the embedding cache.

An entry (vector space, text hash) is in use while some chunk's text has that hash — in any
space, so that switching back to an earlier model costs nothing. An entry nothing uses is not
deleted at once: a sweep marks it orphaned, and a later sweep deletes it once it has been
orphaned for the grace period ([gc] grace_hours, 24 h by default), so that an undo or a branch
switch re-uses it instead of embedding again. An entry used again is unmarked.

The same grace period applies to the sources removed from the config: their files and chunks
are set aside (store.set_aside), and a sweep deletes those set aside for longer than it.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass

from ragd.index import store

UNUSED = ("NOT EXISTS (SELECT 1 FROM chunks c WHERE c.embed_hash = embeddings.text_hash)")


@dataclass
class GCResult:
    marked: int  # newly found unused, kept for the grace period
    deleted: int
    bytes_freed: int
    waiting: int  # unused, still within the grace period
    purged_files: int = 0  # of sources removed longer ago than the grace period

    def as_dict(self) -> dict:
        return self.__dict__.copy()


def sweep(db: sqlite3.Connection, grace_s: float, now: float | None = None) -> GCResult:
    """One pass on the caller's connection (the indexer runs it): the entries nothing uses
    are looked for first, outside the write transaction, and checked again in it."""
    now = time.time() if now is None else now
    # Over the cache's key index alone, and before the write lock is taken: a scan of the
    # table reads every vector with its key, for seconds in a large index, and in the
    # transaction no edit was indexed and the other writers waited; the keys are a few
    # percent of it. An entry used again before the transaction below is not marked; one
    # unused since is marked by the next sweep.
    unused = db.execute(f"SELECT space, text_hash FROM embeddings WHERE {UNUSED}").fetchall()
    with store.transaction(db):
        db.execute(f"UPDATE embeddings SET orphaned_at = NULL WHERE orphaned_at IS NOT NULL "
                   f"AND NOT {UNUSED}")
        marked = 0
        for space, text_hash in unused:
            marked += db.execute(f"UPDATE embeddings SET orphaned_at = ? WHERE space = ? AND "
                                 f"text_hash = ? AND orphaned_at IS NULL AND {UNUSED}",
                                 (now, space, text_hash)).rowcount
        cutoff = now - grace_s
        freed = db.execute("SELECT COUNT(*), COALESCE(SUM(LENGTH(vector) + LENGTH(text_hash)), 0) "
                           "FROM embeddings WHERE orphaned_at IS NOT NULL AND orphaned_at <= ?",
                           (cutoff,)).fetchone()
        db.execute("DELETE FROM embeddings WHERE orphaned_at IS NOT NULL AND orphaned_at <= ?",
                   (cutoff,))
        db.execute("DELETE FROM embed_failures WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE "
                   "c.embed_hash = embed_failures.text_hash)")
        waiting = db.execute("SELECT COUNT(*) FROM embeddings WHERE orphaned_at IS NOT NULL"
                             ).fetchone()[0]
        expired = [r[0] for r in db.execute("SELECT source FROM removed_sources WHERE "
                                            "removed_at <= ?", (cutoff,))]
        purged = 0
        for name in expired:
            purged += db.execute("DELETE FROM removed_files WHERE source = ?",
                                 (name,)).rowcount
            db.execute("DELETE FROM removed_sources WHERE source = ?", (name,))
    return GCResult(marked, freed[0], freed[1], waiting, purged)
