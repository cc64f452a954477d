"""The embedder: gives every chunk a vector in one space (index/vectorstore.py), through one
engine.

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

import logging
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections import deque
from dataclasses import dataclass, field

from ragd.engines.client import EngineError, EngineUnavailable
from ragd.engines.models import ResolvedModel
from ragd.engines.supervisor import Engine
from ragd.index import store
from ragd.index.space import Space
from ragd.index.vectorstore import MAX_ATTEMPTS, PROBE_TEXT, VectorStore, insert
from ragd.ingest.chunker import embed_text
from ragd.workers import Worker

log = logging.getLogger("ragd.embedder")

WORK_BATCH = 64  # distinct texts fetched per round
SNAPSHOT_LOOK = 15.0  # seconds between an idle active embedder's looks at snapshot_if_due
LIVE_TEXTS = 32  # at most this many new texts are embedded before an edit's commit
# How long an edit's commit waits on the engine for them (each request: counting, embedding): an engine that stops answering must
# not hold the indexer (and every file after this one) until the health checks replace it;
# past this the embedder thread embeds them after the commit, as for bulk work.
LIVE_TIMEOUT = 10.0
SPECIAL_TOKENS = 4  # room left for [CLS]/[SEP] or BOS/EOS when truncating
PAUSE_START, PAUSE_MAX = 1.0, 60.0  # backoff when the database cannot be written
CAUGHT_UP_LOG = 100  # texts embedded in one go from which the end is logged (_caught_up)
RECENT_REQUESTS = 16  # of the embedder's, whose pace estimates the time left (EmbedStats)
SAMPLES = 8  # long notes' first texts embedded before their length estimates the rest's


@dataclass
class EmbedStats:
    texts: int = 0
    tokens: int = 0
    truncated: int = 0
    failed: int = 0
    requests: int = 0
    seconds: float = 0.0  # time spent waiting for the engine on embedding requests
    # (engine seconds, texts, tokens) of the last requests: the pace an estimate of the time left
    # goes by. The first ones of a first index share the cores with the indexer (reading,
    # chunking, the keyword index), so the pace since start overstates what is left
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_REQUESTS))
    # seconds per text of this model at the end of the last run (meta 'embed_pace:<model>'):
    # the estimate until this run has its own, or a restart in the middle of a first index
    # says "no estimate yet" until the first 32 texts are in
    before: float | None = None
    # texts and tokens embedded of the first texts of notes that have a rest (Space.samples)
    sample_texts: int = 0
    sample_tokens: int = 0

    def took(self, seconds: float, texts: int, tokens: int = 0) -> None:
        """A request of the embedder thread's: `texts` (`tokens` in all) embedded in `seconds`
        of the engine's."""
        self.seconds += seconds
        self.requests += 1
        self.recent.append((seconds, texts, tokens))

    def seconds_per_text(self) -> float | None:
        """At the pace of the last requests (of every one so far when the thread has sent
        none: an edit's texts, embedded before their commit); before 32 texts, the last
        run's pace (None without one)."""
        if self.texts < 32:
            return self.before
        n = sum(t for _, t, _ in self.recent)
        return sum(s for s, _, _ in self.recent) / n if n else self.seconds / self.texts

    def time_left(self, head: int, rest: int) -> float | None:
        """Seconds to embed `head` texts of the queue and `rest` texts of long notes past their
        first ones (Space.rest, embedded last): the queue's at the last requests' pace per
        text, the rest's per token, each as long as the first texts of those notes were
        (Space.samples). Paced per text alone, the estimate ran short at the end where the
        short notes went first and long notes' full chunks were left. With nothing but the
        rest left, the last requests are of those texts: their pace per text."""
        per = self.seconds_per_text()
        if per is None:
            return None
        n = sum(t for _, t, _ in self.recent)
        tokens = sum(k for _, _, k in self.recent)
        if not head or not rest or self.texts < 32 or not n or not tokens or \
                self.sample_texts < SAMPLES:
            return per * (head + rest)
        return per * head + per * n / tokens * self.sample_tokens / self.sample_texts * rest


class Embedder:
    """Fills one space's vectors through one engine: a worker that takes the space's queue of
    texts without a vector (fed by the indexer's commits, see VectorStore.chunks_changed),
    embeds them and stores them. Sleeps when the queue is empty."""

    def __init__(self, db_path, engine: Engine, model: ResolvedModel, store_: VectorStore, *,
                 batch_tokens: int = 1024, activate: bool = True, on_complete=None,
                 record: str | None = None):
        self.db_path = db_path
        self.engine = engine
        self.model = model
        self.store = store_
        self.batch_tokens = batch_tokens
        self.activate = activate  # its space becomes the active one (else: a switch builds it)
        self.on_complete = on_complete  # a space being built covers every chunk: (embedder)
        self.record = record  # the model as recorded in the index when its space is active
        self.space: Space | None = None
        self.stats = EmbedStats()
        self.state = "waiting for engine"
        self.problem: str | None = None  # why embedding is paused (the database failed)
        self._pause = PAUSE_START
        self._engine_lost = False  # "embedding paused" said, "resumed" not yet
        self._stop = threading.Event()
        self._prefetch = ThreadPoolExecutor(1, thread_name_prefix="embedder-tokenize")
        self._requests = ThreadPoolExecutor(1, thread_name_prefix="embedder-request")
        self.worker = Worker("embedder", self._run)

    # -- control -----------------------------------------------------------------------------------

    def start(self) -> None:
        self.worker.start()

    def tell_stop(self) -> None:
        """Ask the thread to stop, without waiting for it."""
        self._stop.set()
        if self.space is not None:
            self.space.wake()

    def stop(self) -> None:
        self.tell_stop()
        self.worker.stop(30)
        self._prefetch.shutdown(wait=False, cancel_futures=True)
        self._requests.shutdown(wait=False, cancel_futures=True)

    @property
    def vectors(self):
        return self.space.vectors if self.space is not None else None

    @property
    def space_id(self) -> int | None:
        return self.space.id if self.space is not None else None

    @property
    def idle(self) -> bool:
        """Every chunk text has a vector (or was given up on)."""
        return self.space is not None and self.space.idle()

    @property
    def status(self) -> str:
        if self.problem:
            return f"paused: {self.problem}"
        if self.worker.state not in ("running", "new"):
            return self.worker.state
        return self.state

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.space is None:  # not open yet
            if time.monotonic() >= deadline or self._stop.wait(0.05):
                return False
        return self.space.wait_idle(max(0.0, deadline - time.monotonic()))

    def pending(self, db: sqlite3.Connection | None = None) -> int | None:
        """Distinct chunk texts still without a vector in the space (None until the space is
        open and they have been listed). O(1): the length of its queue."""
        return self.space.pending() if self.space is not None else None

    # -- called by the indexer before a file's transaction (the active space's embedder) ----------

    def embed_now(self, db: sqlite3.Connection, chunks: list) -> tuple[int, list] | None:
        """Embed the texts of these chunks (store.ChunkRecord) that the cache lacks, for the
        caller to commit with the chunks: (space, rows for put_vectors). None when that is not
        for now (no space yet, engine not ready, a backlog, too many texts, an engine error):
        the embedder thread will do it after the commit, as for bulk work."""
        space = self.space
        if space is None or not space.idle() or not self.engine.ready:
            return None
        todo: dict[str, str] = {}
        for c in chunks:
            todo.setdefault(c.embed_hash, self.model.doc_prefix + embed_text(c.heading, c.body))
        for h in self.store.cached(db, space.id, list(todo)):
            del todo[h]
        if len(todo) > LIVE_TEXTS:
            return None
        if not todo:
            return space.id, []
        try:
            fitted = [(h, *self._fit(t, LIVE_TIMEOUT)) for h, t in todo.items()]
            rows = []
            for start in range(0, len(fitted), 16):
                part = fitted[start:start + 16]
                log.debug("embedding %d texts (%d tokens) before their commit", len(part),
                          sum(p[2] for p in part))
                t0 = time.perf_counter()
                vecs = self.engine.client.embed([t for _, t, _, _ in part],
                                                timeout=LIVE_TIMEOUT)
                self.stats.seconds += time.perf_counter() - t0
                self.stats.requests += 1
                rows += [(h, v, n, tr) for (h, _, n, tr), v in zip(part, vecs)]
        except (EngineError, EngineUnavailable) as e:
            log.debug("embedding before commit failed (%s); left to the embedder thread", e)
            return None
        return space.id, rows

    def _took(self, seconds: float, batch: list) -> None:
        """A request of the embedder thread's, for the pace (EmbedStats)."""
        self.stats.took(seconds, len(batch), sum(b[2] for b in batch))
        texts, tokens = self.space.sampled(batch)
        self.stats.sample_texts += texts
        self.stats.sample_tokens += tokens

    def count_stored(self, rows: list) -> None:
        """Vectors stored (texts embedded and kept): the counts status shows."""
        self.stats.texts += len(rows)
        self.stats.tokens += sum(n for _, _, n, _ in rows)
        self.stats.truncated += sum(tr for _, _, _, tr in rows)

    # -- the embedder thread -----------------------------------------------------------------------

    def _run(self) -> None:
        db = store.connect(self.db_path)
        pace_key = f"embed_pace:{self.model.name}"
        try:
            row = db.execute("SELECT value FROM meta WHERE key = ?", (pace_key,)).fetchone()
            self.stats.before = float(row[0]) if row else None
            burst = (0, 0.0)  # texts taken since the embedder was last idle, and when it began
            while not self._stop.is_set():
                if not self.engine.wait_ready(0.5 if self.engine.state != "failed" else 5.0):
                    self.state = ("engine failed" if self.engine.state == "failed"
                                  else "waiting for engine")
                    continue
                try:
                    if self.space is None:
                        self.state = "loading vectors"
                        probe = self.engine.client.embed([PROBE_TEXT])[0]
                        self.space = self.store.open(db, self.model, probe, self._stop,
                                                     self.activate, self.record)
                        if self.activate:
                            self.store.serve_edits(self)
                    self.state = "idle" if self.space.idle() else "embedding"
                    if self.state == "idle" and burst[0]:
                        self._caught_up(*burst)
                        burst = (0, 0.0)
                    if not self.activate and self.on_complete is not None and \
                            self.space.idle():
                        self.on_complete(self)  # every chunk has its vector: switch to it
                    # (idle, it wakes now and then: a space changed by the indexer alone, its
                    # vectors from the cache, is saved too: see VectorStore.snapshot_if_due)
                    work = self.space.take(WORK_BATCH, self._stop,
                                           SNAPSHOT_LOOK if self.activate else None)
                    if work:
                        self.state = "embedding"
                        burst = (burst[0] + len(work), burst[1] or time.monotonic())
                        self._embed(db, work)
                    self.store.snapshot_if_due(db)
                    self._resumed()
                except EngineUnavailable as e:
                    # said after the wait, not before: at a stop the engines may go first (a
                    # service manager signals the whole group), and a stop is no pause
                    if not self._stop.wait(0.2) and not self._engine_lost:
                        log.info("embedding paused: %s", e)  # once; "resumed" when it answers
                        self._engine_lost = True
                except sqlite3.OperationalError as e:
                    if not store.transient(e):
                        raise
                    self._paused(e)
        finally:
            try:
                if self.space is not None and self.space.changed_at > self.space.saved_at:
                    self.store.snapshot(db, self.space)  # a restart loads it, not every blob
            except Exception:
                log.exception("writing the vector snapshot")
            self._keep_pace(db, pace_key)
            db.close()

    def _caught_up(self, texts: int, since: float) -> None:
        """Every chunk has its vector again: said in the log after a bulk of work (a first
        index, a source added, a model switch), so that a reader of the log sees when the
        embedding ended; an edit's few texts say nothing (a quiet daemon logs nothing)."""
        if texts < CAUGHT_UP_LOG:
            return
        took = time.monotonic() - since
        log.info("embedding caught up: %d texts in %.0f s (%.1f texts/s); every chunk has its "
                 "vector (%s)", texts, took, texts / took if took > 0 else 0.0, self.model.name)

    def _keep_pace(self, db, key: str) -> None:
        """Keep this run's pace for the next one's estimate (when it has one of its own)."""
        if self.stats.texts < 32 or (per := self.stats.seconds_per_text()) is None:
            return
        try:
            with store.transaction(db):
                db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                           (key, repr(per)))
        except sqlite3.Error as e:  # (an estimate: the stop goes on without it)
            log.debug("keeping the embedding pace: %s", e)

    def _paused(self, e: BaseException) -> None:
        self.problem = f"the index cannot be written ({e}); retrying in {self._pause:.0f} s"
        log.warning("embedder: %s", self.problem)
        self._stop.wait(self._pause)
        self._pause = min(self._pause * 2, PAUSE_MAX)

    def _resumed(self) -> None:
        if self._engine_lost:
            log.info("embedding resumed")
            self._engine_lost = False
        if self.problem is not None:
            log.info("embedder: the index can be written again")
            self.problem = None
        self._pause = PAUSE_START

    def _fit(self, text: str, timeout: float | None = None) -> tuple[str, int, bool]:
        """(text, tokens, truncated): cut to the model's context, counted by the engine."""
        limit = self.model.context - SPECIAL_TOKENS
        if self._stop.is_set():
            raise EngineUnavailable("stopping")
        text, n = self.engine.client.fit(text, limit, count=True, timeout=timeout)
        return text, min(n, limit), n > limit

    def _embed(self, db: sqlite3.Connection, hashes: list[str]) -> None:
        """Embed these texts (the queue's hashes): those whose chunks are gone are dropped,
        those already cached (an edit embedded them) only reach the matrix."""
        space = self.space
        done: set[str] = set()
        try:
            texts: dict[str, str] = {}
            for i in range(0, len(hashes), 500):
                part = hashes[i:i + 500]
                for h, heading, body in db.execute(
                        f"SELECT embed_hash, heading, body FROM chunks WHERE embed_hash IN "
                        f"({','.join('?' * len(part))}) GROUP BY embed_hash", part):
                    texts[h] = self.model.doc_prefix + embed_text(heading, body)
            cached = set(self.store.cached(db, space.id, list(texts)))
            if cached:
                self.store.to_matrix(db, space, {h: None for h in cached})
                space.stored(cached)
            # in the queue's order (the query above gives them in its index's): a take that
            # holds the last of the notes' openings and the first of a long note's rest
            # embeds the openings first
            work = [(h, texts[h]) for h in dict.fromkeys(hashes) if h in texts
                    and h not in cached]
            # Token counting runs ahead in a helper thread (its own engine connection), so the
            # engine is not idle between embedding requests while we tokenize the next texts;
            # and each batch is sent before the one the engine embedded last is stored, so it
            # is not idle while we write either.
            batch: list[tuple[str, str, int, bool]] = []
            size = 0
            fitted = self._prefetch.map(self._fit, [text for _, text in work])
            done.update(set(hashes) - {h for h, _ in work})
            sent = None  # (the batch the engine has, its future)
            for (h, _), (text, n, truncated) in zip(work, fitted):
                if self._stop.is_set():
                    break
                if batch and size + n > self.batch_tokens:
                    sent = self._send(db, batch, sent, done)
                    batch, size = [], 0
                batch.append((h, text, n, truncated))
                size += n
            if batch and not self._stop.is_set():
                sent = self._send(db, batch, sent, done)
            if sent is not None and (not self._stop.is_set() or sent[1].done()):
                self._receive(db, *sent, done)
        finally:
            left = [h for h in hashes if h not in done]
            if left:
                space.give_back(left)
            space.done(hashes)

    def _request(self, texts: list[str]):
        """(vectors, seconds the engine took): on the embedder-request thread."""
        t0 = time.perf_counter()
        vecs = self.engine.client.embed(texts)
        return vecs, time.perf_counter() - t0

    def _send(self, db: sqlite3.Connection, batch: list, sent, done: set):
        """Send a batch to the engine (its request thread), then store the one sent before
        (`sent`): the engine embeds this one meanwhile. Returns what is in flight now.
        The texts forgotten since they were taken (no chunk has them any more: a note deleted
        meanwhile) are left out: a deleted long note would keep the engine busy for nothing,
        and status saying "embedding" with nothing left to embed."""
        wanted = self.space.queued({b[0] for b in batch})
        done.update(b[0] for b in batch if b[0] not in wanted)
        batch = [b for b in batch if b[0] in wanted]
        if not batch:
            if sent is not None:
                self._receive(db, *sent, done)
            return None
        log.debug("embedding %d texts (%d tokens)", len(batch), sum(b[2] for b in batch))
        future = self._requests.submit(self._request, [t for _, t, _, _ in batch])
        if sent is not None:
            self._receive(db, *sent, done)
        return batch, future

    def _receive(self, db: sqlite3.Connection, batch: list, future, done: set) -> None:
        """Store a sent batch's vectors once the engine gives them (one input refused: each
        is tried alone, to find it). EngineUnavailable goes up: the batch is given back."""
        try:
            vecs, seconds = future.result()
        except EngineError:
            for item in batch:
                self._embed_batch(db, [item])
            done.update(b[0] for b in batch)
            return
        self._took(seconds, batch)
        self._store(db, batch, vecs)
        done.update(b[0] for b in batch)

    def _store(self, db: sqlite3.Connection, batch: list, vecs) -> None:
        with store.transaction(db, self._stop):
            insert(db, self.space.id, [(h, v, n, tr) for (h, _, n, tr), v in zip(batch, vecs)])
        self.store.to_matrix(db, self.space, {h: v for (h, _, _, _), v in zip(batch, vecs)})
        self.space.stored([h for h, _, _, _ in batch])  # pending_texts falls batch by batch
        self.count_stored(batch)

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
        self._took(time.perf_counter() - t0, batch)
        self._store(db, batch, vecs)

    def _record_failure(self, db: sqlite3.Connection, h: str, reason: str) -> None:
        space = self.space
        row = db.execute("SELECT attempts FROM embed_failures WHERE space = ? AND text_hash = ?",
                         (space.id, h)).fetchone()
        attempts = (row[0] if row else 0) + 1
        now = time.time()
        with store.transaction(db, self._stop):
            db.execute("INSERT OR REPLACE INTO embed_failures (space, text_hash, reason, "
                       "attempts, last_try) VALUES (?, ?, ?, ?, ?)",
                       (space.id, h, reason, attempts, now))
        if attempts >= MAX_ATTEMPTS:
            self.stats.failed += 1
            log.warning("giving up embedding a text (%s) after %d attempts: %s", h, attempts,
                        reason)
        else:
            space.later(now + (1 << attempts), h)
