"""Read connections for request threads."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager

from ragd.index import store


class ReadPool:
    """Read connections for request threads (WAL: readers never wait for the writer). At most
    `keep` idle connections are kept; a burst of requests opens more, closed when returned."""

    def __init__(self, path, keep: int = 8):
        self.path = path
        self.keep = keep
        self._free: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    @contextmanager
    def conn(self, snapshot: bool = False):
        """snapshot: every statement of the request reads one state of the index (a read
        transaction), so a commit between two of its queries (a chunk replaced between the
        ranking and the fetch of its text) is never half seen."""
        with self._lock:
            db = self._free.pop() if self._free else None
        if db is None:
            db = store.connect(self.path)
        try:
            if snapshot:
                db.execute("BEGIN")
            yield db
        finally:
            if db.in_transaction:  # a read interrupted mid-way
                db.rollback()
            with self._lock:
                if len(self._free) < self.keep:
                    self._free.append(db)
                    db = None
            if db is not None:
                db.close()

    def close(self) -> None:
        with self._lock:
            free, self._free = self._free, []
        for db in free:
            db.close()
