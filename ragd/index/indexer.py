"""The indexer: the one thread that writes the index.

Work arrives as scans (of a source, or all of them) and as single paths. A scan compares what
is on disk with the files table: a file whose size and mtime are unchanged is not read; a
changed one is read and hashed, and only a changed hash is re-chunked. Paths wait in an ordered,
de-duplicated queue, so a file named twice is indexed once.

Commits are batched (a transaction holds up to BATCH_FILES files or BATCH_SECONDS of work)
for speed during a bulk scan; each file's rows change inside that transaction together, so a
crash leaves every file either as it was or fully updated.

An edit (at most LIVE_FILES paths waiting, nothing else queued) goes a step further: its files
are read and chunked, and their new texts embedded, before the transaction opens, so chunks, FTS
rows, vectors and file row commit together. Bulk work does not wait for the engine: its chunks
are searchable by BM25 at once and the embedder thread adds their vectors after.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from ragd.config import Config, Source
from ragd.index import store
from ragd.ingest import chunker, documents, loader, sources

log = logging.getLogger("ragd.indexer")

BATCH_FILES = 500
BATCH_SECONDS = 0.5
LIVE_FILES = 8


@dataclass
class Prepared:
    """A file read, chunked and (when the embedder could) embedded before its transaction."""
    content: loader.Loaded
    records: list[store.ChunkRecord] | None  # None: unchanged, nothing to chunk
    vectors: tuple[int, list] | None  # (space, rows) for the listener's put_vectors


@dataclass
class SourceState:
    last_scan: float | None = None
    last_error: str | None = None
    scanning: bool = False


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


class Indexer:
    def __init__(self, cfg: Config, db_path: Path, listener=None, events=None):
        # listener: has .sync (a lock) and .chunks_changed(db, removed, added), called after
        # each commit with the lock held (the embedder, mirroring chunks into the vectors).
        self.listener = listener
        self.events = events  # an EventBus, or None
        self.cfg = cfg
        self.db_path = db_path
        self.stats = Stats(per_source={s.name: SourceState() for s in cfg.sources})
        self._cv = threading.Condition()
        self._scans: OrderedDict[str, bool] = OrderedDict()  # source name -> force
        self._paths: OrderedDict[tuple[str, str], bool] = OrderedDict()  # (source, rel) -> force
        self._moves: list[tuple[str, str, str]] = []  # (source, old rel, new rel)
        self._since: dict[tuple[str, str], float] = {}  # when a queued path was first asked for
        self._busy = False
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="indexer", daemon=True)
        self._db = None
        self._pending_events: list = []

    # -- control (any thread) -----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout)

    def request_scan(self, source: str | None = None, force: bool = False) -> list[str]:
        names = [source] if source else [s.name for s in self.cfg.sources]
        with self._cv:
            for name in names:
                self._scans[name] = self._scans.get(name, False) or force
                self.stats.per_source[name].scanning = True
            self._cv.notify_all()
        return names

    def request_path(self, source: str, relpath: str, force: bool = False,
                     since: float | None = None) -> None:
        with self._cv:
            key = (source, relpath)
            self._paths[key] = self._paths.get(key, False) or force
            self._since.setdefault(key, since or time.time())
            self._cv.notify_all()

    def oldest_pending(self) -> dict[str, float]:
        """Per source, when its oldest change still waiting to be indexed was first seen."""
        out: dict[str, float] = {}
        with self._cv:
            for (source, _), t in self._since.items():
                out[source] = min(out.get(source, t), t)
        return out

    def request_move(self, source: str, old: str, new: str) -> None:
        """A file was renamed or moved: keep its chunks and vectors if its content is the same."""
        with self._cv:
            self._moves.append((source, old, new))
            self._cv.notify_all()

    @property
    def pending(self) -> int:
        """Files waiting to be indexed (scans not yet listed are not counted; see `idle`)."""
        with self._cv:
            return len(self._paths) + len(self._moves)

    @property
    def idle(self) -> bool:
        with self._cv:
            return not (self._scans or self._paths or self._moves or self._busy)

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._scans or self._paths or self._moves or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    # -- the indexer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        self._db = store.connect(self.db_path)
        try:
            while True:
                with self._cv:
                    while not (self._stop or self._scans or self._paths or self._moves):
                        self._busy = False
                        self._cv.notify_all()
                        self._cv.wait()
                    if self._stop:
                        return
                    self._busy = True
                    scan = self._scans.popitem(last=False) if self._scans else None
                if scan:
                    self._scan(*scan)
                self._drain()
        except Exception:
            log.exception("indexer thread died")
            raise
        finally:
            with self._cv:
                self._busy = False
                self._cv.notify_all()
            self._db.close()

    def _source(self, name: str) -> Source:
        src = self.cfg.source(name)
        assert src is not None, name
        return src

    def _scan(self, name: str, force: bool) -> None:
        src = self._source(name)
        state = self.stats.per_source[name]
        t0 = time.monotonic()
        if not src.root.is_dir():
            # An unmounted disk or a renamed folder is not "every file deleted".
            state.last_error = f"source folder {src.root} is missing; its files are kept"
            log.warning("source %s: %s", name, state.last_error)
            if self.events is not None:
                self.events.publish("error", source=name, message=state.last_error)
            state.scanning = False
            return
        if state.last_error and "is missing" in state.last_error:
            state.last_error = None  # it is back
        known = store.file_rows(self._db, name)
        on_disk = {seen.relpath: seen for seen in sources.scan(src)}
        changed = [rel for rel, seen in on_disk.items()
                   if force or rel not in known or known[rel].size != seen.size
                   or known[rel].mtime_ns != seen.mtime_ns]
        gone_rels = known.keys() - on_disk.keys()
        new_rels = [rel for rel in changed if rel not in known]
        if gone_rels and new_rels:  # renamed or moved while we were not watching?
            by_hash = {known[rel].hash: rel for rel in gone_rels
                       if known[rel].hash and known[rel].status == "indexed"}
            for rel in new_rels:
                try:
                    h = sources.read_bytes(src.root / rel, self.cfg.max_file_bytes).hash
                except sources.Unreadable:
                    continue
                old = by_hash.pop(h, None)
                if old is not None:
                    gone_rels.discard(old)
                    changed.remove(rel)
                    with self._cv:
                        self._moves.append((name, old, rel))
        gone = [known[rel].id for rel in gone_rels]
        if gone:
            changes = store.Changes() if self._tracking else None
            self._db.execute("BEGIN IMMEDIATE")
            for rel in gone_rels:
                store.delete_file(self._db, known[rel].id, changes)
                self._emit("removed", name, rel)
            self._commit(changes)
            self.stats.files_removed += len(gone)
        with self._cv:
            for rel in changed:
                self._paths[(name, rel)] = self._paths.get((name, rel), False) or force
        state.last_scan = time.time()
        state.scanning = False
        log.info("scan %s: %d files, %d to index, %d removed (%.2fs)", name, len(on_disk),
                 len(changed), len(gone), time.monotonic() - t0)

    def _prepare_live(self) -> dict[tuple[str, str], Prepared]:
        """For an edit (a short queue of paths and nothing else), read, chunk and embed its
        files before the transaction. Anything odd is left to the transaction's own pass."""
        if self.listener is None or not self.listener.wants_changes:
            return {}
        with self._cv:
            if self._moves or self._scans or len(self._paths) > LIVE_FILES:
                return {}
            queued = list(self._paths.items())
        out: dict[tuple[str, str], Prepared] = {}
        for (name, rel), force in queued:
            src = self._source(name)
            try:
                content = loader.load(src, rel, self.cfg.max_file_bytes)
            except Exception:
                continue
            row = self._db.execute("SELECT hash, status FROM files WHERE source = ? AND "
                                   "relpath = ?", (name, rel)).fetchone()
            if _unchanged(row, content, force):  # read once: the transaction just notes it
                out[(name, rel)] = Prepared(content, None, None)
                continue
            records = self._records(content)
            out[(name, rel)] = Prepared(content, records,
                                        self.listener.embed_now(self._db, records))
        return out

    def _records(self, content) -> list[store.ChunkRecord]:
        pieces = chunker.chunk_doc(content.doc, self.cfg.chunk_tokens, self.cfg.chunk_overlap)
        return [store.ChunkRecord(i, c.heading, c.line_start, c.line_end, c.text, c.text_hash,
                                  c.embed_hash, c.body, c.keywords)
                for i, c in enumerate(pieces)]

    def _drain(self) -> None:
        """Index queued paths in batched transactions until the queue is empty or a scan waits."""
        while True:
            prepared = self._prepare_live()
            batch_start, n = time.monotonic(), 0
            done: list[tuple[str, str]] = []
            changes = store.Changes() if self._tracking else None
            self._db.execute("BEGIN IMMEDIATE")
            try:
                while n < BATCH_FILES and time.monotonic() - batch_start < BATCH_SECONDS:
                    with self._cv:
                        if self._stop or not (self._paths or self._moves):
                            break
                        move = self._moves.pop(0) if self._moves else None
                        if move is None:
                            (name, rel), force = self._paths.popitem(last=False)
                    if move is not None:
                        self._move_one(self._source(move[0]), move[1], move[2], changes)
                    else:
                        self._index_one(self._source(name), rel, force, changes,
                                        prepared.get((name, rel)))
                        done.append((name, rel))
                    n += 1
                self._commit(changes)
            except BaseException:
                self._pending_events.clear()  # nothing of a rolled-back batch is told
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            with self._cv:
                for key in done:  # committed: no longer waiting (unless asked for again)
                    if key not in self._paths:
                        self._since.pop(key, None)
                self._cv.notify_all()
                if self._stop or not (self._paths or self._moves) or self._scans:
                    return

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
                self.events.publish(kind, source=source, path=str(src.root / rel) if src else rel,
                                    **fields)

    def _commit(self, changes: store.Changes | None) -> None:
        try:
            self._commit_db(changes)
        finally:
            self._publish()

    def _commit_db(self, changes: store.Changes | None) -> None:
        if changes is None or self.listener is None:
            self._db.execute("COMMIT")
            return
        with self.listener.sync:
            self._db.execute("COMMIT")
            if changes.removed or changes.added:
                self.listener.chunks_changed(self._db, changes.removed, changes.added)

    def _move_one(self, src: Source, old: str, new: str, batch: store.Changes | None) -> None:
        """old was renamed or moved to new. If the content is the same, the file row and its
        chunks move with it (ids, embed hashes and so vectors unchanged: nothing is embedded);
        only the heading path and keywords are refreshed. Otherwise: index new, forget old."""
        db = self._db
        row = db.execute("SELECT id, hash, status FROM files WHERE source = ? AND relpath = ?",
                         (src.name, old)).fetchone()
        moved = False
        if row is not None and row["status"] == "indexed":
            try:
                content = loader.load(src, new, self.cfg.max_file_bytes)
            except (sources.Unreadable, documents.NeedsTool):
                content = None
            if content is not None and content.hash == row["hash"]:
                pieces = chunker.chunk_doc(content.doc, self.cfg.chunk_tokens,
                                           self.cfg.chunk_overlap)
                olds = db.execute("SELECT id, body, line_start, line_end FROM chunks WHERE "
                                  "file_id = ? ORDER BY ordinal", (row["id"],)).fetchall()
                if _same_chunks(olds, pieces):
                    db.execute("SAVEPOINT move")
                    target = db.execute("SELECT id FROM files WHERE source = ? AND relpath = ?",
                                        (src.name, new)).fetchone()
                    if target is not None:  # moved over an existing file
                        store.delete_file(db, target["id"], batch)
                    db.execute("UPDATE files SET relpath = ?, size = ?, mtime_ns = ?, meta = ?, "
                               "indexed_at = ? WHERE id = ?",
                               (new, content.size, content.mtime_ns,
                                json.dumps(content.doc.meta(), ensure_ascii=False), time.time(),
                                row["id"]))
                    db.executemany("UPDATE chunks SET heading = ?, keywords = ? WHERE id = ?",
                                   [(p.heading, p.keywords, o["id"]) for o, p in zip(olds, pieces)])
                    db.execute("RELEASE move")
                    moved = True
                    self.stats.files_moved += 1
                    self._emit("moved", src.name, new, from_path=str(src.root / old))
        if not moved:
            self._index_one(src, new, False, batch)
            self._index_one(src, old, False, batch)  # gone: removes its row

    def _index_one(self, src: Source, rel: str, force: bool,
                   batch: store.Changes | None, prepared: Prepared | None = None) -> None:
        path = src.root / rel
        db = self._db
        if prepared is not None and _stat(path) != (prepared.content.size,
                                                    prepared.content.mtime_ns):
            prepared = None  # changed again since it was read: read it again
        changes = store.Changes() if batch is not None else None
        row = db.execute("SELECT id, hash, status FROM files WHERE source = ? AND relpath = ?",
                         (src.name, rel)).fetchone()
        db.execute("SAVEPOINT file")
        try:
            try:
                content = (prepared.content if prepared is not None
                           else loader.load(src, rel, self.cfg.max_file_bytes))
            except (sources.Unreadable, documents.NeedsTool) as e:
                if str(e) == "file vanished":
                    if row is not None:
                        store.delete_file(db, row["id"], changes)
                        self.stats.files_removed += 1
                        self._emit("removed", src.name, rel)
                else:
                    size, mtime_ns = _stat(path)
                    store.put_file(db, src.name, rel, size, mtime_ns, None, "skipped", str(e), [],
                                   changes)
                    self.stats.files_skipped += 1
                    log.info("skipped %s/%s: %s", src.name, rel, e)
                    self._emit("skipped", src.name, rel, reason=str(e))
                db.execute("RELEASE file")
                if batch is not None:
                    batch.extend(changes)
                return
            if _unchanged(row, content, force):
                store.touch_file(db, row["id"], content.size, content.mtime_ns)
                self.stats.files_unchanged += 1
                db.execute("RELEASE file")
                return
            doc = content.doc
            records = (prepared.records if prepared is not None and prepared.records is not None
                       else self._records(content))
            embedded = None
            if prepared is not None and prepared.vectors is not None:
                self.listener.put_vectors(db, *prepared.vectors)  # in this transaction
                embedded = len(prepared.vectors[1])
            store.put_file(db, src.name, rel, content.size, content.mtime_ns, content.hash,
                           "indexed", "; ".join(doc.warnings) or None, records, changes,
                           meta=json.dumps(doc.meta(), ensure_ascii=False))
            db.execute("RELEASE file")
            if batch is not None:
                batch.extend(changes)
            self.stats.files_indexed += 1
            self.stats.chunks_written += len(records)
            if embedded is None:
                self._emit("indexed", src.name, rel, chunks=len(records))
            else:  # its vectors committed with it
                self._emit("indexed", src.name, rel, chunks=len(records), embedded=embedded)
        except Exception as e:
            # A bug or an unexpected error on one file: record it, keep the daemon going.
            db.execute("ROLLBACK TO file")
            db.execute("RELEASE file")
            log.exception("failed to index %s/%s", src.name, rel)
            size, mtime_ns = _stat(path)
            changes = store.Changes() if batch is not None else None
            store.put_file(db, src.name, rel, size, mtime_ns, None, "failed",
                           f"{type(e).__name__}: {e}", [], changes)
            if batch is not None:
                batch.extend(changes)
            self.stats.files_failed += 1
            self.stats.per_source[src.name].last_error = f"{rel}: {type(e).__name__}: {e}"
            self._emit("failed", src.name, rel, reason=f"{type(e).__name__}: {e}")


def _unchanged(row, content: loader.Loaded, force: bool) -> bool:
    """Is the file's content what the index already holds (so there is nothing to re-chunk)?"""
    return (not force and row is not None and row["hash"] == content.hash
            and row["status"] == "indexed")


def _same_chunks(old: list, new: list) -> bool:
    return len(old) == len(new) and all(
        (o["body"], o["line_start"], o["line_end"]) == (n.body, n.line_start, n.line_end)
        for o, n in zip(old, new))


def _stat(path: Path) -> tuple[int, int]:
    """(size, mtime_ns) as the scan sees them; (-1, 0) for what cannot be stat'ed (as scan)."""
    try:
        st = path.stat()
    except OSError:
        return -1, 0
    return st.st_size, st.st_mtime_ns
