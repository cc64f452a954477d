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
import logging
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ragd.engines.client import EngineError, EngineUnavailable
from ragd.engines.models import ResolvedModel, sha256_file
from ragd.engines.supervisor import Engine
from ragd.index import store
from ragd.index.vectors import VectorIndex, from_blob, to_blob
from ragd.ingest.chunker import embed_text

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
        # Orders matrix updates against the indexer's commits (Indexer.listener).
        self.sync = sync or threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._pending: tuple[float, int] | None = None
        self._changed = 0.0  # monotonic time of the last notify
        self._prefetch = ThreadPoolExecutor(1, thread_name_prefix="embedder-tokenize")
        self._thread = threading.Thread(target=self._run, name="embedder", daemon=True)

    # -- control -----------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(30)
        self._prefetch.shutdown(wait=False, cancel_futures=True)

    def notify(self) -> None:
        self._changed = time.monotonic()
        self._idle.clear()
        self._wake.set()

    @property
    def status(self) -> str:
        """The thread's state; "idle" only while it has nothing to do (between a notify and the
        thread's next look at the queue it is "embedding")."""
        state = self.state
        return "embedding" if state == "idle" and not self._idle.is_set() else state

    def wait_idle(self, timeout: float) -> bool:
        return self._idle.wait(timeout)

    @property
    def idle(self) -> bool:
        return self._idle.is_set()

    def pending(self, db: sqlite3.Connection, max_age: float = 1.0) -> int:
        """Distinct chunk texts still without a vector in the current space. Counting costs a
        lookup per chunk, so a count younger than max_age seconds is reused (status is polled);
        when the embedder has just found no work it is exactly 0."""
        if self._idle.is_set():
            return 0
        cached = self._pending
        if (cached is not None and time.monotonic() - cached[0] < max_age
                and cached[0] > self._changed):  # not older than the last change
            return cached[1]
        n = self._count_pending(db)
        self._pending = (time.monotonic(), n)
        return n

    def _count_pending(self, db: sqlite3.Connection) -> int:
        if self.space is None:
            return db.execute("SELECT COUNT(DISTINCT embed_hash) FROM chunks").fetchone()[0]
        return db.execute(
            "SELECT COUNT(DISTINCT c.embed_hash) FROM chunks c WHERE NOT EXISTS (SELECT 1 FROM "
            "embeddings e WHERE e.space = ? AND e.text_hash = c.embed_hash) AND NOT EXISTS "
            "(SELECT 1 FROM embed_failures f WHERE f.space = ? AND f.text_hash = c.embed_hash "
            "AND f.attempts >= ?)", (self.space, self.space, MAX_ATTEMPTS)).fetchone()[0]

    # -- called by the indexer after each commit (under self.sync) ------------------------------

    wants_changes = True

    def chunks_changed(self, db: sqlite3.Connection, removed: list[int],
                       added: list[tuple[int, str]]) -> None:
        vi = self.vectors
        if vi is None:
            return
        vi.remove(removed)
        missing = False
        if added:
            by_hash: dict[str, list[int]] = {}
            for cid, h in added:
                by_hash.setdefault(h, []).append(cid)
            hashes = list(by_hash)
            for i in range(0, len(hashes), 500):
                part = hashes[i:i + 500]
                rows = db.execute(f"SELECT text_hash, vector FROM embeddings WHERE space = ? AND "
                                  f"text_hash IN ({','.join('?' * len(part))})",
                                  [self.space, *part]).fetchall()
                ids, vecs = [], []
                for h, blob in rows:
                    v = from_blob(blob)
                    for cid in by_hash[h]:
                        ids.append(cid)
                        vecs.append(v)
                if ids:
                    vi.add(ids, np.vstack(vecs))
                missing = missing or len(rows) < len(part)
        if missing:  # texts without a vector: work for the thread (else it stays idle, and the
            self.notify()  # next edit can be embedded before its commit)

    # -- called by the indexer before a file's transaction ------------------------------------------

    def embed_now(self, db: sqlite3.Connection, chunks: list) -> tuple[int, list] | None:
        """Embed the texts of these chunks (store.ChunkRecord) that the cache lacks, for the
        caller to commit with the chunks: (space, rows for put_vectors). None when that is not
        for now (no space yet, engine not ready, a backlog, too many texts, an engine error):
        the embedder thread will do it after the commit, as for bulk work."""
        space = self.space
        if space is None or not self._idle.is_set() or not self.engine.ready:
            return None
        todo: dict[str, str] = {}
        for c in chunks:
            todo.setdefault(c.embed_hash, self.model.doc_prefix + embed_text(c.heading, c.body))
        hashes = list(todo)
        for i in range(0, len(hashes), 500):
            part = hashes[i:i + 500]
            for (h,) in db.execute(f"SELECT text_hash FROM embeddings WHERE space = ? AND "
                                   f"text_hash IN ({','.join('?' * len(part))})", [space, *part]):
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

    # -- the embedder thread -----------------------------------------------------------------------

    def _run(self) -> None:
        db = store.connect(self.db_path)
        try:
            while not self._stop.is_set():
                if not self.engine.wait_ready(0.5):
                    self.state = ("engine failed" if self.engine.state == "failed"
                                  else "waiting for engine")
                    continue
                try:
                    if self.space is None:
                        self.state = "loading vectors"
                        self._open_space(db)
                    work = self._next_work(db)
                    if not work:
                        self.state = "idle"
                        self._idle.set()
                        self._wake.wait(5.0)
                        self._wake.clear()
                        continue
                    self._idle.clear()
                    self.state = "embedding"
                    self._embed(db, work)
                except EngineUnavailable as e:
                    log.info("embedding paused: %s", e)
                    self._stop.wait(0.2)
        except Exception:
            log.exception("embedder thread died")
            self.state = "crashed (see the log)"
            raise
        finally:
            db.close()

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
        if chosen is None:
            chosen = db.execute(
                "INSERT INTO spaces (fingerprint, model, dims, probe, created_at, last_used) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (fp, self.model.name, len(probe), to_blob(probe), now, now)).lastrowid
            if drift is not None:
                log.warning("model %s now embeds the probe differently (cosine %.4f with the "
                            "stored probe): its old vectors are not used; re-embedding",
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
        # Held through the load: a commit of the indexer between this read and the assignment
        # would otherwise be missed by the matrix.
        with self.sync:
            cur = db.execute("SELECT c.id, e.vector FROM chunks c JOIN embeddings e ON "
                             "e.space = ? AND e.text_hash = c.embed_hash", (chosen,))
            while rows := cur.fetchmany(20000):
                vi.add([r[0] for r in rows], np.frombuffer(b"".join(r[1] for r in rows),
                                                           dtype="<f4").reshape(len(rows), -1))
            self.vectors, self.space = vi, chosen
        log.info("vector space %d (%s, %d dims): %d vectors loaded in %.2fs", chosen,
                 self.model.name, vi.dims, len(vi), time.monotonic() - t0)

    def _next_work(self, db: sqlite3.Connection) -> list[tuple[str, str]]:
        now = time.time()
        rows = db.execute(
            "SELECT c.embed_hash, c.heading, c.body FROM chunks c WHERE NOT EXISTS (SELECT 1 "
            "FROM embeddings e WHERE e.space = ? AND e.text_hash = c.embed_hash) AND NOT EXISTS "
            "(SELECT 1 FROM embed_failures f WHERE f.space = ? AND f.text_hash = c.embed_hash "
            "AND (f.attempts >= ? OR f.last_try > ? - (1 << f.attempts))) "
            "GROUP BY c.embed_hash ORDER BY MIN(c.id) LIMIT ?",
            (self.space, self.space, MAX_ATTEMPTS, now, WORK_BATCH)).fetchall()
        return [(r[0], self.model.doc_prefix + embed_text(r[1], r[2])) for r in rows]

    def _fit(self, text: str) -> tuple[str, int, bool]:
        """(text, tokens, truncated): cut to the model's context, counted by the engine."""
        limit = self.model.context - SPECIAL_TOKENS
        if self._stop.is_set():
            raise EngineUnavailable("stopping")
        tokens = self.engine.client.tokenize(text)
        if len(tokens) <= limit:
            return text, len(tokens), False
        return self.engine.client.detokenize(tokens[:limit]), limit, True

    def _embed(self, db: sqlite3.Connection, work: list[tuple[str, str]]) -> None:
        # Token counting runs ahead in a helper thread (its own engine connection), so the
        # engine is not idle between embedding requests while we tokenize the next texts.
        batch: list[tuple[str, str, int, bool]] = []
        size = 0
        fitted = self._prefetch.map(self._fit, [text for _, text in work])
        for (h, _), (text, n, truncated) in zip(work, fitted):
            if self._stop.is_set():
                return
            if batch and size + n > self.batch_tokens:
                self._embed_batch(db, batch)
                batch, size = [], 0
            batch.append((h, text, n, truncated))
            size += n
        if batch:
            self._embed_batch(db, batch)

    def _embed_batch(self, db: sqlite3.Connection, batch: list[tuple[str, str, int, bool]]) -> None:
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
        db.execute("BEGIN IMMEDIATE")
        try:
            _insert_embeddings(db, self.space, [(h, v, n, tr)
                                                for (h, _, n, tr), v in zip(batch, vecs)])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        by_hash = {h: v for (h, _, _, _), v in zip(batch, vecs)}
        with self.sync:
            rows = db.execute(f"SELECT id, embed_hash FROM chunks WHERE embed_hash IN "
                              f"({','.join('?' * len(by_hash))})", list(by_hash)).fetchall()
            if rows and self.vectors is not None:
                self.vectors.add([r[0] for r in rows], np.vstack([by_hash[r[1]] for r in rows]))
        self.stats.texts += len(batch)
        self.stats.tokens += sum(n for _, _, n, _ in batch)
        self.stats.truncated += sum(tr for _, _, _, tr in batch)

    def _record_failure(self, db: sqlite3.Connection, h: str, reason: str) -> None:
        row = db.execute("SELECT attempts FROM embed_failures WHERE space = ? AND text_hash = ?",
                         (self.space, h)).fetchone()
        attempts = (row[0] if row else 0) + 1
        db.execute("INSERT OR REPLACE INTO embed_failures (space, text_hash, reason, attempts, "
                   "last_try) VALUES (?, ?, ?, ?, ?)", (self.space, h, reason, attempts, time.time()))
        if attempts >= MAX_ATTEMPTS:
            self.stats.failed += 1
            log.warning("giving up embedding a text (%s) after %d attempts: %s", h, attempts,
                        reason)


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
