"""The indexer: the one thread that writes files and chunks to the index.

Work arrives as scans (of a source, or all of them), single paths, moves and jobs (a GC sweep:
anything that must write runs here, so the index has one writer of its own and the embedder
besides). A scan compares what is on disk with the files table: a file whose size and mtime are
unchanged is not read; a changed one is read and hashed, and only a changed hash is re-chunked.
Paths wait in an ordered, de-duplicated queue, so a file named twice is indexed once.

Each batch is done in two steps, so that no write transaction ever waits on I/O:

1. *prepare*, outside any transaction: read, parse and chunk each file (and, for an edit, embed
   its new texts). A file that needs a helper program (a PDF: pdftotext, seconds) is prepared on
   a lane of its own and joins a later batch, so it never holds the others up.
2. *write*, in one transaction: each file's rows change inside a savepoint of their own. A file
   whose write fails for a reason of its own is recorded as failed with the reason and the batch
   goes on; a failure of the database itself (busy, disk full, I/O) rolls the batch back, puts
   its work back in the queue and pauses the indexer with a backoff — nothing is lost, and
   ``ragctl status`` says why it waits.

Nothing is deleted on an error: a file leaves the index when a listing that succeeded shows it
gone (or its name no longer exists). A folder that cannot be listed keeps its files; the source
is flagged and scanned again with a backoff.

An edit (at most LIVE_FILES paths waiting, nothing else queued) commits its chunks, FTS rows,
vectors and file row together. Bulk work does not wait for the engine: its chunks are searchable
by BM25 at once and the embedder thread adds their vectors after.

This module holds the queues, the thread's loop and the prepare step; the Indexer is made of
three more parts, each in a module of its own, that run on its thread and keep their state on
it: scan.py (a source's scan, and what a listing shows gone), writes.py (one file's or move's
write in its savepoint) and removed.py (a dropped source's rows set aside and restored).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ragd.config import Config, Source
from ragd.index import store
from ragd.index.removed import RemovedSources
from ragd.index.scan import SourceState, Scans
from ragd.index.writes import Item, Prepared, Writes
from ragd.ingest import chunker, documents, loader, sources
from ragd.workers import Worker

log = logging.getLogger("ragd.indexer")

BATCH_FILES = 500
BATCH_SECONDS = 0.5
LIVE_FILES = 8
PAUSE_START, PAUSE_MAX = 1.0, 60.0  # backoff when the database itself fails (disk full, ...)


@dataclass
class Stats:
    files_indexed: int = 0
    files_unchanged: int = 0
    files_skipped: int = 0
    files_failed: int = 0
    files_removed: int = 0
    files_moved: int = 0
    chunks_written: int = 0
    per_source: dict[str, SourceState] = field(default_factory=dict)


class Indexer(RemovedSources, Scans, Writes):
    # The parts add methods only: every attribute is set here, and all run on one thread.
    def __init__(self, cfg: Config, db_path: Path, listener=None, events=None):
        # listener: has .sync (a lock) and .chunks_changed(db, removed, added, gone, live),
        # called after each commit with the lock held (the embedder, mirroring chunks into the
        # vectors).
        self.listener = listener
        self.events = events  # an EventBus, or None
        # told after each commit, with nothing held (the tantivy index's sync wakes on it)
        self.committed: list[Callable[[], None]] = []
        self.cfg = cfg
        self.db_path = db_path
        self.stats = Stats(per_source={s.name: SourceState() for s in cfg.sources})
        self.problem: str | None = None  # why the indexer is paused (the database failed)
        self._cv = threading.Condition()
        self._scans: OrderedDict[str, bool] = OrderedDict()  # source name -> force
        self._paths: OrderedDict[tuple[str, str], bool] = OrderedDict()  # (source, rel) -> force
        self._moves: list[tuple[str, str, str]] = []  # (source, old rel, new rel)
        self._jobs: list[tuple[Callable[[Any], Any], Future]] = []
        self._ready: list[Item] = []  # prepared on the slow lane, to be written
        self._slow: dict[tuple[str, str], bool] = {}  # on the slow lane now -> asked again?
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._when_idle: list[Callable[[Any], None]] = []  # run once nothing is queued
        self._seq = itertools.count()
        self._since: dict[tuple[str, str], float] = {}  # when a queued path was first asked for
        self._paused_until = 0.0
        self._pause = PAUSE_START
        self._busy = False
        self._stop = threading.Event()
        self._db = None
        self._ident: int | None = None  # the indexer thread's
        self._lane_db = None
        self.hints: set[str] = set()  # what the user could do (install pdftotext)
        # Sources the index holds rows of but the config no longer names: never searched or
        # listed, and purged (see purge) — set when the indexer starts and at each reload.
        self.unconfigured: set[str] = set()
        self._pending_events: list = []
        self._slow_lane = ThreadPoolExecutor(1, thread_name_prefix="indexer-slow")
        self.worker = Worker("indexer", self._run, on_restart=self._after_crash)

    # -- control (any thread) -----------------------------------------------------------------

    def start(self) -> None:
        self.worker.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cv:
            self._stop.set()
            self._cv.notify_all()
        self.worker.stop(timeout)
        self._slow_lane.shutdown(wait=False, cancel_futures=True)

    def request_scan(self, source: str | None = None, force: bool = False) -> list[str]:
        names = [source] if source else [s.name for s in self.cfg.sources]
        with self._cv:
            for name in names:
                self._scans[name] = self._scans.get(name, False) or force
                self.source_state(name).scanning = True
            self._cv.notify_all()
        return names

    def request_path(self, source: str, relpath: str, force: bool = False,
                     since: float | None = None) -> None:
        with self._cv:
            key = (source, relpath)
            self._paths[key] = self._paths.get(key, False) or force
            self._since.setdefault(key, since or time.time())
            self._cv.notify_all()

    def request_move(self, source: str, old: str, new: str) -> None:
        """A file was renamed or moved: keep its chunks and vectors if its content is the same."""
        with self._cv:
            self._moves.append((source, old, new))
            self._cv.notify_all()

    def run_job(self, fn: Callable[[Any], Any]) -> Future:
        """Run fn(db) on the indexer's own connection, between batches (a GC sweep: every
        write but the embedder's happens on this thread). The future holds its result."""
        fut: Future = Future()
        with self._cv:
            self._jobs.append((fn, fut))
            self._cv.notify_all()
        return fut

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        """Run fn on the indexer thread in delay seconds (scheduled, not polled)."""
        with self._cv:
            heapq.heappush(self._timers, (time.monotonic() + delay, next(self._seq), fn))
            self._cv.notify_all()

    def oldest_pending(self) -> dict[str, float]:
        """Per source, when its oldest change still waiting to be indexed was first seen."""
        out: dict[str, float] = {}
        with self._cv:
            for (source, _), t in self._since.items():
                out[source] = min(out.get(source, t), t)
        return out

    @property
    def pending(self) -> int:
        """Files waiting to be indexed (scans not yet listed are not counted; see `idle`)."""
        with self._cv:
            return len(self._paths) + len(self._moves) + len(self._slow) + len(self._ready)

    def _has_work(self) -> bool:  # with self._cv held
        return bool(self._scans or self._paths or self._moves or self._jobs or self._ready)

    @property
    def idle(self) -> bool:
        with self._cv:
            return not (self._has_work() or self._slow or self._busy)

    @property
    def state(self) -> str:
        if self.problem:
            return f"paused: {self.problem}"
        if self.worker.state != "running":
            return self.worker.state
        return "idle" if self.idle else "indexing"

    def when_idle(self, fn: Callable[[Any], None]) -> None:
        """Call fn(db) on the indexer's thread, once, when nothing is queued or being read:
        after every scan and file asked for before it. A crash before then never calls it (what
        it records is recorded only once the work it depends on is committed)."""
        with self._cv:
            self._when_idle.append(fn)
            self._cv.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._has_work() or self._slow or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def source_state(self, name: str) -> SourceState:
        return self.stats.per_source.setdefault(name, SourceState())

    # -- the indexer thread ---------------------------------------------------------------------

    def _after_crash(self) -> None:
        """Restarted after an unexpected error: what was in hand may be lost; a scan finds it."""
        self.request_scan()

    def _run(self) -> None:
        self._db = store.connect(self.db_path)
        self._ident = threading.get_ident()
        try:
            self.hints |= store.skipped_reasons(self._db, documents.NEEDS_PDFTOTEXT)
            while True:
                with self._cv:
                    self._busy = False
                    on_idle: list[Callable[[Any], None]] = []
                    while True:
                        if self._stop.is_set():
                            return
                        now = time.monotonic()
                        due = self._timers and self._timers[0][0] <= now
                        paused = now < self._paused_until
                        if due or (self._jobs and not paused) or (
                                not paused and self._has_work()):
                            break
                        if self._when_idle and not (self._has_work() or self._slow):
                            on_idle, self._when_idle = self._when_idle, []
                            break
                        self._cv.notify_all()
                        waits = [t for t in (self._timers[0][0] if self._timers else None,
                                             self._paused_until if paused else None) if t]
                        self._cv.wait(max(0.0, min(waits) - now) if waits else None)
                    self._busy = True
                    timers = []
                    while self._timers and self._timers[0][0] <= now:
                        timers.append(heapq.heappop(self._timers)[2])
                    job = self._jobs.pop(0) if self._jobs and not paused else None
                    scan = (self._scans.popitem(last=False)
                            if self._scans and not paused and job is None else None)
                for fn in timers:
                    self._guarded("a scheduled task", fn)
                for fn in on_idle:
                    self._guarded("a task waiting for the queue to empty",
                                  functools.partial(fn, self._db))
                if job is not None:
                    self._run_job(*job)
                    continue
                if scan is not None:
                    self._scan(*scan)
                if time.monotonic() >= self._paused_until:
                    self._drain()
        finally:
            with self._cv:
                self._busy = False
                self._cv.notify_all()
            self._db.close()
            self._db = None

    def _guarded(self, what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            log.exception("%s failed", what)

    def _run_job(self, fn, fut: Future) -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            result = fn(self._db)
        except BaseException as e:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            fut.set_exception(e)
            if store.transient(e):
                self._paused(e)
            elif not isinstance(e, Exception):
                raise
        else:
            fut.set_result(result)

    def _paused(self, e: BaseException) -> None:
        """The database itself failed (disk full, I/O, locked for too long): back off."""
        self.problem = f"the index cannot be written ({e}); retrying in {self._pause:.0f} s"
        log.warning("%s", self.problem)
        if self.events is not None:
            self.events.publish("error", source=None, message=self.problem)
        with self._cv:
            self._paused_until = time.monotonic() + self._pause
        self._pause = min(self._pause * 2, PAUSE_MAX)

    def _resumed(self) -> None:
        if self.problem is not None:
            log.info("the index can be written again")
            self.problem = None
        self._pause = PAUSE_START

    def _source(self, name: str) -> Source | None:
        return self.cfg.source(name)

    # -- paths: prepare, then write ---------------------------------------------------------------

    def _records(self, content) -> list[store.ChunkRecord]:
        pieces = chunker.chunk_doc(content.doc, self.cfg.chunk_tokens, self.cfg.chunk_overlap)
        return [store.ChunkRecord(i, c.heading, c.line_start, c.line_end, c.text, c.text_hash,
                                  c.embed_hash, c.body, c.keywords)
                for i, c in enumerate(pieces)]

    def _prepare(self, src: Source, rel: str, force: bool) -> Prepared:
        """Read and chunk one file, outside any transaction. Never raises."""
        path = src.root / rel
        try:
            try:
                content = loader.load(src, rel, self.cfg.max_file_bytes)
            except sources.Vanished:
                return Prepared("vanished")
            except (sources.Unreadable, documents.NeedsTool) as e:
                if isinstance(e, documents.NeedsTool):
                    self.hints.add(str(e))
                retry = getattr(e, "retry", True)
                # An error of access (not of the content) is tried again at every scan.
                return Prepared("skipped", reason=str(e),
                                stat=(-1, 0) if retry else sources.stat_of(path), retry=retry)
            row = store.file_row(self._db_for_reads(), src.name, rel)
            if _unchanged(row, content, force):
                return Prepared("unchanged", content)
            return Prepared("index", content, self._records(content))
        except Exception as e:
            # A bug or an unexpected error on one file: recorded, the daemon goes on.
            log.exception("failed to read %s/%s", src.name, sources.printable(rel))
            return Prepared("failed", reason=f"{type(e).__name__}: {e}", stat=sources.stat_of(path))

    def _db_for_reads(self):
        """The connection for the prepare step's reads: the indexer's own on its thread, else
        (the slow lane) one of the lane's own."""
        if threading.get_ident() == self._ident:
            return self._db
        if self._lane_db is None:
            self._lane_db = store.connect(self.db_path)
        return self._lane_db

    def _take(self, live: bool) -> Item | None:
        """The next path or move of the queue (None when empty, stopping or a scan waits)."""
        with self._cv:
            while True:
                if self._stop.is_set() or self._scans or self._jobs:
                    return None
                if self._ready:
                    return self._ready.pop(0)
                if self._moves:
                    name, old, new = self._moves.pop(0)
                    return Item(name, new, old=old)
                if not self._paths:
                    return None
                (name, rel), force = self._paths.popitem(last=False)
                key = (name, rel)
                if key in self._slow:  # being read on the slow lane: again after it
                    self._slow[key] = True
                    continue
                src = self._source(name)
                if src is not None and loader.is_slow(rel):
                    self._to_slow_lane(src, rel, force)
                    continue
                return Item(name, rel, force)

    def _large(self, item: Item) -> bool:
        """A file past loader.SLOW_BYTES goes to the slow lane, as a PDF does (True), so the
        files after it are not held up while it is read and chunked. Its size is asked here,
        on the indexer's thread and outside the lock (a stat may hang on a mount)."""
        src = self._source(item.source)
        if src is None or item.old is not None or item.prepared is not None:
            return False
        try:
            size = os.stat(src.root / item.rel).st_size
        except OSError:  # (gone, or unreadable: the main lane says which)
            return False
        if not loader.is_slow(item.rel, size):
            return False
        with self._cv:
            self._to_slow_lane(src, item.rel, item.force)
        return True

    def _to_slow_lane(self, src: Source, rel: str, force: bool) -> None:
        """Hand the file to the slow lane; the queue waits for it there (self._cv held)."""
        self._slow[(src.name, rel)] = False
        self._slow_lane.submit(self._prepare_slow, src, rel, force)

    def _prepare_slow(self, src: Source, rel: str, force: bool) -> None:
        prepared = self._prepare(src, rel, force)
        with self._cv:
            self._ready.append(Item(src.name, rel, force, prepared=prepared))
            self._cv.notify_all()

    def _drain(self) -> None:
        """Index queued paths in batches until the queue is empty or a scan or job waits."""
        while True:
            with self._cv:
                live = (self.listener is not None and self.listener.wants_changes
                        and not (self._moves or self._scans or self._ready)
                        and len(self._paths) <= LIVE_FILES)
            batch: list[Item] = []
            started = time.monotonic()
            while len(batch) < BATCH_FILES and time.monotonic() - started < BATCH_SECONDS:
                item = self._take(live)
                if item is None:
                    break
                if self._large(item):
                    continue
                self._prepare_item(item, live)
                batch.append(item)
            if not batch:
                return
            try:
                self._write(batch, live)
            except Exception as e:
                self._requeue(batch)
                if store.transient(e):
                    self._paused(e)
                    return
                raise
            self._resumed()
            with self._cv:
                for item in batch:  # committed: no longer waiting (unless asked for again)
                    key = (item.source, item.rel)
                    if key not in self._paths:
                        self._since.pop(key, None)
                    if self._slow.pop(key, False):  # asked for again while on the slow lane
                        self._paths[key] = self._paths.get(key, False)
                self._cv.notify_all()

    def _prepare_item(self, item: Item, live: bool) -> None:
        src = self._source(item.source)
        if src is None:
            item.prepared = Prepared("dropped")
            return
        if item.prepared is None:
            item.prepared = self._prepare(src, item.rel, item.force)
        if item.old is not None:
            item.old_prepared = self._prepare(src, item.old, False)
        p = item.prepared
        if live and p.kind == "index" and item.old is None:
            try:
                p.vectors = self.listener.embed_now(self._db, p.records)
            except Exception:
                log.exception("embedding an edit before its commit failed; left to the "
                              "embedder thread")

    def _requeue(self, batch: list[Item]) -> None:
        """The batch was rolled back: its work goes back to the front of the queue."""
        with self._cv:
            paths = OrderedDict()
            for item in batch:
                if item.old is not None:
                    self._moves.insert(0, (item.source, item.old, item.rel))
                elif (item.source, item.rel) in self._slow:
                    self._slow.pop((item.source, item.rel))
                    paths[(item.source, item.rel)] = item.force
                else:
                    paths[(item.source, item.rel)] = item.force
            for key, force in self._paths.items():
                paths[key] = paths.get(key, False) or force
            self._paths = paths
            self._cv.notify_all()

    def _write(self, batch: list[Item], live: bool = False) -> None:
        changes = store.Changes(live) if self._tracking else None
        store.begin(self._db, self._stop)
        try:
            for item in batch:
                self._apply(item, changes)
            self._commit(changes)
        except BaseException:
            self._abort()
            raise

    def _abort(self) -> None:
        self._pending_events.clear()  # nothing of a rolled-back batch is told
        store.rollback(self._db)

    @property
    def _tracking(self) -> bool:
        """Is anyone mirroring chunk changes (the embedder)? If not, don't collect them."""
        return self.listener is not None and self.listener.wants_changes

    def _emit(self, kind: str, source: str, rel: str, **fields) -> None:
        if self.events is not None:
            self._pending_events.append((kind, source, rel, fields))

    def _publish(self) -> None:
        """Events are told after their commit: a listener never sees what could roll back."""
        events, self._pending_events = self._pending_events, []
        if self.events is not None:
            for kind, source, rel, fields in events:
                src = self.cfg.source(source)
                path = str(src.root / rel) if src else rel
                self.events.publish(kind, source=source, **sources.wire_path(path), **fields)

    def _commit(self, changes: store.Changes | None) -> None:
        store.refresh_notes(self._db)  # the notes' own rows, in the same transaction
        if changes is None or self.listener is None:
            self._db.execute("COMMIT")
        else:
            with self.listener.sync:
                self._db.execute("COMMIT")
                if changes.removed or changes.added:
                    try:
                        self.listener.chunks_changed(self._db, changes.removed, changes.added,
                                                     changes.gone, changes.live)
                    except Exception:  # committed; the vectors catch up at the next start
                        log.exception("updating the vectors after a commit failed")
        self._publish()
        for hook in self.committed:
            try:
                hook()
            except Exception:  # committed all the same
                log.exception("a commit hook failed")


def _unchanged(row, content: loader.Loaded, force: bool) -> bool:
    """Is the file's content what the index already holds (so there is nothing to re-chunk)?"""
    return (not force and row is not None and row["hash"] == content.hash
            and row["status"] == "indexed")
