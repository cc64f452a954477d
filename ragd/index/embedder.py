"""The embedder: gives every chunk a vector in the current model's space.

Two ways in. An edit (a few files, the embedder caught up, the engine ready): the indexer asks
``embed_now`` for the file's new texts before it opens the file's transaction, and the vectors
commit with the chunks, FTS rows and file row. Bulk work (the first index, a storm, the engine
down or busy): the indexer makes text searchable at once (BM25) and leaves new chunk texts
without vectors; the embedder thread finds them, embeds them through the engine, stores the
vectors in the content-addressed cache (``embeddings``: space + text hash) and adds them to the
in-memory matrix. Either way a text already in the cache is never embedded again, wherever it
appears.

Vector spaces. A space is one model as configured: its fingerprint (file hash + pooling +
prefixes) plus a probe vector (a fixed sentence embedded when the space was made). At start the
probe is embedded again; a space is reused only if both agree, so vectors of two models (or of a
model whose output changed) are never mixed. Switching back to an earlier model finds its space,
and its cache, again.

Failures: an engine that is down makes the embedder wait (nothing is counted against the text);
an input the engine refuses is retried with backoff, then recorded with its reason in
``embed_failures`` and left alone.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ragd.engines.client import EngineError, EngineUnavailable
from ragd.engines.models import ResolvedModel, sha256_file
from ragd.engines.supervisor import Engine
from ragd.index import store
from ragd.index.vectors import VectorIndex, from_blob, to_blob
from ragd.ingest.chunker import embed_text
from ragd.workers import Worker

log = logging.getLogger("ragd.embedder")

PROBE_TEXT = "ragd probe: a quiet harbour at dawn, gulls circling over the fishing boats."
PROBE_MATCH = 0.999  # cosine between probe vectors for two runs to count as the same space
MAX_ATTEMPTS = 3
WORK_BATCH = 64  # distinct texts fetched per round
LIVE_TEXTS = 32  # at most this many new texts are embedded before an edit's commit
# What a chunk's vector is made of (chunker.embed_text: header + body). A change to it makes a
# new vector space, so old and new vectors are never mixed. v2: the body (Obsidian syntax made
# readable), as embed_hash always said; v1 embedded the raw text.
EMBED_TEXT_VERSION = 2
SPECIAL_TOKENS = 4  # room left for [CLS]/[SEP] or BOS/EOS when truncating
PAUSE_START, PAUSE_MAX = 1.0, 60.0  # backoff when the database cannot be written


@dataclass
class EmbedStats:
    texts: int = 0
    tokens: int = 0
    truncated: int = 0
    failed: int = 0
    requests: int = 0
    seconds: float = 0.0  # time spent waiting for the engine on embedding requests


def fingerprint(db: sqlite3.Connection, model: ResolvedModel) -> str:
    """Model file hash + pooling + prefixes; the file hash is cached by path, size and mtime."""
    st = model.path.stat()
    key = f"sha256:{model.path}:{st.st_size}:{st.st_mtime_ns}"
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    if row is None:
        digest = sha256_file(model.path)
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, digest))
    else:
        digest = row[0]
    parts = (f"{digest}|{model.pooling}|{model.query_prefix}|{model.doc_prefix}|"
             f"text v{EMBED_TEXT_VERSION}")
    return hashlib.blake2b(parts.encode(), digest_size=12).hexdigest()


class Embedder:
    """The embedding queue and its thread.

    Work is found by being told, never by scanning: when the space opens, one pass over the
    chunks loads their vectors and lists the texts without one; after that each commit of the
    indexer hands over the texts it added (chunks_changed). The queue (`_todo`, distinct text
    hashes in order) is the count status shows, so status costs nothing, and an empty queue
    leaves the thread asleep until a commit brings work or a retry falls due.
    """

    def __init__(self, db_path, engine: Engine, model: ResolvedModel, *, dtype: str = "float32",
                 batch_tokens: int = 1024, sync: threading.Lock | None = None):
        self.db_path = db_path
        self.engine = engine
        self.model = model
        self.dtype = dtype
        self.batch_tokens = batch_tokens
        self.vectors: VectorIndex | None = None
        self.space: int | None = None
        self.space_note: str | None = None  # e.g. "model changed: re-embedding"
        self.stats = EmbedStats()
        self.state = "waiting for engine"
        self.problem: str | None = None  # why embedding is paused (the database failed)
        # Orders matrix updates against the indexer's commits (Indexer.listener).
        self.sync = sync or threading.Lock()
        self._cv = threading.Condition()
        self._todo: OrderedDict[str, None] = OrderedDict()  # text hashes without a vector
        self._retry: list[tuple[float, str]] = []  # (when, text hash): refused once, try again
        self._inflight = 0  # hashes taken off the queue, not yet stored
        self._pause = PAUSE_START
        self._stop = threading.Event()
        self._prefetch = ThreadPoolExecutor(1, thread_name_prefix="embedder-tokenize")
        self.worker = Worker("embedder", self._run)

    # -- control -----------------------------------------------------------------------------------

    def start(self) -> None:
        self.worker.start()

    def stop(self) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        self.worker.stop(30)
        self._prefetch.shutdown(wait=False, cancel_futures=True)

    def _busy(self) -> bool:  # with self._cv held
        return bool(self._todo or self._retry or self._inflight) or self.space is None

    @property
    def idle(self) -> bool:
        """Every chunk text has a vector (or was given up on): nothing queued, in flight or
        waiting for a retry."""
        with self._cv:
            return not self._busy()

    @property
    def status(self) -> str:
        if self.problem:
            return f"paused: {self.problem}"
        if self.worker.state not in ("running", "new"):
            return self.worker.state
        return self.state

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._busy():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def pending(self, db: sqlite3.Connection | None = None) -> int | None:
        """Distinct chunk texts still without a vector in the current space (None until the
        space is open and they have been listed). O(1): the length of the queue."""
        with self._cv:
            if self.space is None:
                return None
            return len(self._todo) + len(self._retry) + self._inflight

    # -- called by the indexer after each commit (under self.sync) ------------------------------

    wants_changes = True

    def chunks_changed(self, db: sqlite3.Connection, removed: list[int],
                       added: list[tuple[int, str]]) -> None:
        vi = self.vectors
        if vi is None:  # the space is not open yet: its opening pass will see these chunks
            return
        vi.remove(removed)
        if not added:
            return
        by_hash: dict[str, list[tuple[int, int]]] = {}
        for cid, h, fid in added:
            by_hash.setdefault(h, []).append((cid, fid))
        found = self._add_cached(db, by_hash)
        missing = [h for h in by_hash if h not in found]
        if missing:
            with self._cv:
                for h in missing:
                    self._todo[h] = None
                self._cv.notify_all()

    def _add_cached(self, db: sqlite3.Connection,
                    by_hash: dict[str, list[tuple[int, int]]]) -> set[str]:
        """Put the cached vectors of these texts into the matrix for these chunks; return the
        hashes that had one. Caller holds self.sync."""
        found: set[str] = set()
        hashes = list(by_hash)
        for i in range(0, len(hashes), 500):
            part = hashes[i:i + 500]
            rows = db.execute(f"SELECT text_hash, vector FROM embeddings WHERE space = ? AND "
                              f"text_hash IN ({','.join('?' * len(part))})",
                              [self.space, *part]).fetchall()
            ids, vecs, files = [], [], []
            for h, blob in rows:
                found.add(h)
                v = from_blob(blob)
                for cid, fid in by_hash[h]:
                    ids.append(cid)
                    vecs.append(v)
                    files.append(fid)
            if ids:
                self.vectors.add(ids, np.vstack(vecs), files)
        return found

    # -- called by the indexer before a file's transaction ------------------------------------------

    def embed_now(self, db: sqlite3.Connection, chunks: list) -> tuple[int, list] | None:
        """Embed the texts of these chunks (store.ChunkRecord) that the cache lacks, for the
        caller to commit with the chunks: (space, rows for put_vectors). None when that is not
        for now (no space yet, engine not ready, a backlog, too many texts, an engine error):
        the embedder thread will do it after the commit, as for bulk work."""
        space = self.space
        if space is None or not self.idle or not self.engine.ready:
            return None
        todo: dict[str, str] = {}
        for c in chunks:
            todo.setdefault(c.embed_hash, self.model.doc_prefix + embed_text(c.heading, c.body))
        for h in self._cached(db, space, list(todo)):
            del todo[h]
        if len(todo) > LIVE_TEXTS:
            return None
        if not todo:
            return space, []
        try:
            fitted = [(h, *self._fit(t)) for h, t in todo.items()]
            rows = []
            for start in range(0, len(fitted), 16):
                part = fitted[start:start + 16]
                log.debug("embedding %d texts (%d tokens) before their commit", len(part),
                          sum(p[2] for p in part))
                t0 = time.perf_counter()
                vecs = self.engine.client.embed([t for _, t, _, _ in part])
                self.stats.seconds += time.perf_counter() - t0
                self.stats.requests += 1
                rows += [(h, v, n, tr) for (h, _, n, tr), v in zip(part, vecs)]
        except (EngineError, EngineUnavailable) as e:
            log.debug("embedding before commit failed (%s); left to the embedder thread", e)
            return None
        return space, rows

    def put_vectors(self, db: sqlite3.Connection, space: int, rows: list) -> None:
        """Store embed_now's vectors in the caller's transaction (counted as embedded)."""
        if not rows:
            return
        _insert_embeddings(db, space, rows)
        self.stats.texts += len(rows)
        self.stats.tokens += sum(n for _, _, n, _ in rows)
        self.stats.truncated += sum(tr for _, _, _, tr in rows)

    @staticmethod
    def _cached(db: sqlite3.Connection, space: int, hashes: list[str]) -> set[str]:
        out: set[str] = set()
        for i in range(0, len(hashes), 500):
            part = hashes[i:i + 500]
            out.update(h for (h,) in db.execute(
                f"SELECT text_hash FROM embeddings WHERE space = ? AND text_hash IN "
                f"({','.join('?' * len(part))})", [space, *part]))
        return out

    # -- the embedder thread -----------------------------------------------------------------------

    def _run(self) -> None:
        db = store.connect(self.db_path)
        try:
            while not self._stop.is_set():
                if not self.engine.wait_ready(0.5 if self.engine.state != "failed" else 5.0):
                    self.state = ("engine failed" if self.engine.state == "failed"
                                  else "waiting for engine")
                    continue
                try:
                    if self.space is None:
                        self.state = "loading vectors"
                        self._open_space(db)
                    work = self._take()
                    if work:
                        self.state = "embedding"
                        self._embed(db, work)
                    self._resumed()
                except EngineUnavailable as e:
                    log.info("embedding paused: %s", e)
                    self._stop.wait(0.2)
                except sqlite3.OperationalError as e:
                    if not store.transient(e):
                        raise
                    self._paused(e)
        finally:
            db.close()

    def _paused(self, e: BaseException) -> None:
        self.problem = f"the index cannot be written ({e}); retrying in {self._pause:.0f} s"
        log.warning("embedder: %s", self.problem)
        self._stop.wait(self._pause)
        self._pause = min(self._pause * 2, PAUSE_MAX)

    def _resumed(self) -> None:
        if self.problem is not None:
            log.info("embedder: the index can be written again")
            self.problem = None
        self._pause = PAUSE_START

    def _take(self) -> list[str]:
        """The next hashes to embed; sleeps (no polling) while there are none."""
        with self._cv:
            while not self._stop.is_set():
                now = time.time()
                while self._retry and self._retry[0][0] <= now:
                    self._todo[heapq.heappop(self._retry)[1]] = None
                if self._todo:
                    break
                self.state = "idle" if not self._retry else "waiting to retry"
                self._cv.notify_all()  # wait_idle
                self._cv.wait(self._retry[0][0] - now if self._retry else None)
            out = []
            while self._todo and len(out) < WORK_BATCH:
                out.append(self._todo.popitem(last=False)[0])
            self._inflight += len(out)
            return out

    def _give_back(self, hashes: list[str]) -> None:
        """Hashes taken but not stored (the engine went away): to the front of the queue."""
        with self._cv:
            for h in reversed(hashes):
                self._todo[h] = None
                self._todo.move_to_end(h, last=False)
            self._cv.notify_all()

    def _done(self, n: int) -> None:
        with self._cv:
            self._inflight -= n
            self._cv.notify_all()

    def _open_space(self, db: sqlite3.Connection) -> None:
        fp = fingerprint(db, self.model)
        probe = self.engine.client.embed([PROBE_TEXT])[0]
        chosen, drift = None, None
        for sid, blob in db.execute("SELECT id, probe FROM spaces WHERE fingerprint = ? ORDER BY "
                                    "last_used DESC", (fp,)):
            cos = float(np.dot(from_blob(blob), probe))
            if cos >= PROBE_MATCH:
                chosen = sid
                break
            drift = cos
        now = time.time()
        previous = db.execute("SELECT value FROM meta WHERE key = 'active_space'").fetchone()
        with store.transaction(db, self._stop):
            if chosen is None:
                chosen = db.execute(
                    "INSERT INTO spaces (fingerprint, model, dims, probe, created_at, "
                    "last_used) VALUES (?, ?, ?, ?, ?, ?)",
                    (fp, self.model.name, len(probe), to_blob(probe), now, now)).lastrowid
                if drift is not None:
                    log.warning("model %s now embeds the probe differently (cosine %.4f with "
                                "the stored probe): its old vectors are not used; re-embedding",
                                self.model.name, drift)
            db.execute("UPDATE spaces SET last_used = ? WHERE id = ?", (now, chosen))
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('active_space', ?)",
                       (str(chosen),))
        if previous is not None and int(previous[0]) != chosen:
            self.space_note = (f"the embedding model changed (vector space {previous[0]} -> "
                               f"{chosen}); old vectors are not used, re-embedding in the "
                               f"background")
            log.warning("%s", self.space_note)
        t0 = time.monotonic()
        vi = VectorIndex(len(probe), self.dtype, chosen)
        given_up = {h for (h,) in db.execute(
            "SELECT text_hash FROM embed_failures WHERE space = ? AND attempts >= ?",
            (chosen, MAX_ATTEMPTS))}
        retry = [(last + (1 << attempts), h) for h, attempts, last in db.execute(
            "SELECT text_hash, attempts, last_try FROM embed_failures WHERE space = ? AND "
            "attempts < ?", (chosen, MAX_ATTEMPTS))]
        later = {h for _, h in retry}
        # One pass: the vectors of the chunks that have one, and the texts of those that do
        # not. Held through the pass: a commit of the indexer between this read and the
        # assignment would otherwise be missed by both.
        todo: OrderedDict[str, None] = OrderedDict()
        with self.sync:
            cur = db.execute("SELECT c.id, c.embed_hash, e.vector, c.file_id FROM chunks c "
                             "LEFT JOIN embeddings e ON e.space = ? AND e.text_hash = "
                             "c.embed_hash ORDER BY c.id", (chosen,))
            while rows := cur.fetchmany(20000):
                have = [r for r in rows if r[2] is not None]
                if have:
                    vi.add([r[0] for r in have], np.frombuffer(
                        b"".join(r[2] for r in have), dtype="<f4").reshape(len(have), -1),
                        [r[3] for r in have])
                for r in rows:
                    if r[2] is None and r[1] not in given_up and r[1] not in later:
                        todo[r[1]] = None
            with self._cv:
                self._todo = todo
                self._retry = sorted(retry)
                self.vectors, self.space = vi, chosen
                self._cv.notify_all()
        log.info("vector space %d (%s, %d dims): %d vectors loaded, %d texts to embed, in "
                 "%.2fs", chosen, self.model.name, vi.dims, len(vi), len(todo),
                 time.monotonic() - t0)

    def _fit(self, text: str) -> tuple[str, int, bool]:
        """(text, tokens, truncated): cut to the model's context, counted by the engine."""
        limit = self.model.context - SPECIAL_TOKENS
        if self._stop.is_set():
            raise EngineUnavailable("stopping")
        tokens = self.engine.client.tokenize(text)
        if len(tokens) <= limit:
            return text, len(tokens), False
        return self.engine.client.detokenize(tokens[:limit]), limit, True

    def _embed(self, db: sqlite3.Connection, hashes: list[str]) -> None:
        """Embed these texts (the queue's hashes): those whose chunks are gone are dropped,
        those already cached (an edit embedded them) only reach the matrix."""
        done: set[str] = set()
        try:
            texts: dict[str, str] = {}
            for i in range(0, len(hashes), 500):
                part = hashes[i:i + 500]
                for h, heading, body in db.execute(
                        f"SELECT embed_hash, heading, body FROM chunks WHERE embed_hash IN "
                        f"({','.join('?' * len(part))}) GROUP BY embed_hash", part):
                    texts[h] = self.model.doc_prefix + embed_text(heading, body)
            cached = self._cached(db, self.space, list(texts))
            if cached:
                self._to_matrix(db, {h: None for h in cached})
            work = [(h, t) for h, t in texts.items() if h not in cached]
            # Token counting runs ahead in a helper thread (its own engine connection), so the
            # engine is not idle between embedding requests while we tokenize the next texts.
            batch: list[tuple[str, str, int, bool]] = []
            size = 0
            fitted = self._prefetch.map(self._fit, [text for _, text in work])
            done.update(set(hashes) - {h for h, _ in work})
            for (h, _), (text, n, truncated) in zip(work, fitted):
                if self._stop.is_set():
                    break
                if batch and size + n > self.batch_tokens:
                    self._embed_batch(db, batch)
                    done.update(b[0] for b in batch)
                    batch, size = [], 0
                batch.append((h, text, n, truncated))
                size += n
            if batch and not self._stop.is_set():
                self._embed_batch(db, batch)
                done.update(b[0] for b in batch)
        finally:
            left = [h for h in hashes if h not in done]
            if left:
                self._give_back(left)
            self._done(len(hashes))

    def _embed_batch(self, db: sqlite3.Connection, batch: list[tuple[str, str, int, bool]]) -> None:
        log.debug("embedding %d texts (%d tokens)", len(batch), sum(b[2] for b in batch))
        t0 = time.perf_counter()
        try:
            vecs = self.engine.client.embed([t for _, t, _, _ in batch])
        except EngineError as e:
            if len(batch) > 1:  # find the input at fault: one at a time
                for item in batch:
                    self._embed_batch(db, [item])
                return
            self._record_failure(db, batch[0][0], str(e))
            return
        self.stats.seconds += time.perf_counter() - t0
        self.stats.requests += 1
        with store.transaction(db, self._stop):
            _insert_embeddings(db, self.space, [(h, v, n, tr)
                                                for (h, _, n, tr), v in zip(batch, vecs)])
        self._to_matrix(db, {h: v for (h, _, _, _), v in zip(batch, vecs)})
        self.stats.texts += len(batch)
        self.stats.tokens += sum(n for _, _, n, _ in batch)
        self.stats.truncated += sum(tr for _, _, _, tr in batch)

    def _to_matrix(self, db: sqlite3.Connection, by_hash: dict) -> None:
        """Put these texts' vectors (given, or None: read from the cache) into the matrix for
        every chunk that has the text."""
        with self.sync:
            rows = db.execute(f"SELECT id, embed_hash, file_id FROM chunks WHERE embed_hash IN "
                              f"({','.join('?' * len(by_hash))})", list(by_hash)).fetchall()
            missing = [h for h, v in by_hash.items() if v is None]
            if missing:
                for h, blob in db.execute(
                        f"SELECT text_hash, vector FROM embeddings WHERE space = ? AND "
                        f"text_hash IN ({','.join('?' * len(missing))})", [self.space, *missing]):
                    by_hash[h] = from_blob(blob)
            rows = [r for r in rows if by_hash.get(r[1]) is not None]
            if rows and self.vectors is not None:
                self.vectors.add([r[0] for r in rows], np.vstack([by_hash[r[1]] for r in rows]),
                                 [r[2] for r in rows])

    def _record_failure(self, db: sqlite3.Connection, h: str, reason: str) -> None:
        row = db.execute("SELECT attempts FROM embed_failures WHERE space = ? AND text_hash = ?",
                         (self.space, h)).fetchone()
        attempts = (row[0] if row else 0) + 1
        now = time.time()
        with store.transaction(db, self._stop):
            db.execute("INSERT OR REPLACE INTO embed_failures (space, text_hash, reason, "
                       "attempts, last_try) VALUES (?, ?, ?, ?, ?)",
                       (self.space, h, reason, attempts, now))
        if attempts >= MAX_ATTEMPTS:
            self.stats.failed += 1
            log.warning("giving up embedding a text (%s) after %d attempts: %s", h, attempts,
                        reason)
        else:
            with self._cv:
                heapq.heappush(self._retry, (now + (1 << attempts), h))


def _insert_embeddings(db: sqlite3.Connection, space: int, rows: list) -> None:
    """rows: (text hash, vector, tokens, truncated). The caller holds the transaction."""
    now = time.time()
    db.executemany(
        "INSERT OR REPLACE INTO embeddings (space, text_hash, vector, tokens, truncated, "
        "created_at) VALUES (?, ?, ?, ?, ?, ?)",
        [(space, h, to_blob(v), n, int(tr), now) for h, v, n, tr in rows])
    hashes = [r[0] for r in rows]
    for i in range(0, len(hashes), 500):
        part = hashes[i:i + 500]
        db.execute(f"DELETE FROM embed_failures WHERE space = ? AND text_hash IN "
                   f"({','.join('?' * len(part))})", [space, *part])
