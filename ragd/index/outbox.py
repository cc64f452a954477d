"""What the index's two mirrors share: the tantivy BM25 index (textindex.py) and the Milvus
store (milvus.py).

A transactional outbox: triggers on the index's tables write the ids of what changed to an
outbox table inside the writer's own transaction, so nothing committed can be missed and nothing
rolled back is marked. One supervised thread per mirror drains it; it is woken after commits
(``wake``), and ``wait_synced`` (search --wait) returns once an empty outbox was seen after the
call. The mirror's own work — its handle, what to push and where — is the subclass's
``_ready``, ``_step`` and ``_drop``; the loop around them, ``_run``, is here.
"""

from __future__ import annotations

import sqlite3
import threading
import time

from ragd.index import store
from ragd.workers import Worker


def apply(db: sqlite3.Connection, script: str) -> None:
    """Run a mirror's script in one transaction: its outbox and triggers made (idempotent
    CREATE ... IF NOT EXISTS) or dropped."""
    with store.transaction(db):
        for stmt in store.script_statements(script):
            db.execute(stmt)


class OutboxSync:
    """The drain thread's life, its wakes, and how far it is (pending, synced)."""

    def __init__(self, thread: str, backoff_max: float, db_path):
        self.db_path = db_path  # the index's SQLite file
        self.state = "starting"
        self.error: str | None = None
        self.pushed = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Condition()
        self._pending = 1  # unknown until the first look
        self._asked = 1  # wakes so far (each after a commit)
        self._looked = 0  # the wakes the last empty look at the outbox had seen
        self.worker = Worker(thread, self._run, backoff_start=2.0, backoff_max=backoff_max)

    # what a mirror does: make its handle (a tantivy writer, a Milvus client) when it has none,
    # look at the outbox once (push a batch, or sleep until woken), and drop the handle after
    # an error, so that the next try makes it afresh
    def _ready(self, db: sqlite3.Connection) -> None:
        raise NotImplementedError

    def _step(self, db: sqlite3.Connection) -> None:
        raise NotImplementedError

    def _drop(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        db = store.connect(self.db_path)
        try:
            while not self._stop.is_set():
                try:
                    self._ready(db)
                    self._step(db)
                    self.error = None
                except Exception as e:  # the worker logs it and runs this again after a backoff
                    self.state = "retrying"
                    self.error = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:300]
                    self._drop()
                    raise
        finally:
            db.close()

    def start(self) -> None:
        self.worker.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.worker.stop()

    def wake(self) -> None:
        """Something was committed that may have marked rows (called after commits)."""
        with self._idle:
            self._asked += 1
        self._wake.set()

    def wait_synced(self, timeout: float) -> bool:
        """Wait until the outbox is empty (search --wait: what is committed is searchable)."""
        with self._idle:
            self._asked += 1
            want = self._asked
        self._wake.set()
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._looked < want:
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return False
                self._idle.wait(min(left, 0.5))
        return True

    def _sleep(self, timeout: float) -> None:
        """Until woken (a commit, wait_synced, stop) or the timeout. A stop that came while
        the step ran is not slept through: _begin_step cleared its wake, but stop sets _stop
        before it wakes, so one of the two is seen here."""
        if not self._stop.is_set():
            self._wake.wait(timeout)

    def _begin_step(self) -> int:
        """At the start of a look at the outbox: the wakes an empty outbox now proves synced
        (a wake from now on is seen by the next sleep)."""
        self._wake.clear()
        with self._idle:
            return self._asked

    def _set_pending(self, n: int, seen: int | None = None) -> None:
        with self._idle:
            self._pending = n
            if seen is not None:
                self._looked = max(self._looked, seen)
                self._idle.notify_all()
