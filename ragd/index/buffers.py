"""Unsaved buffers: what an editor holds but has not saved, seen by search instead of the file.

Like LSP's didOpen/didChange/didClose: a client sends a buffer's text (``buffer_set``), and
while it holds it — until ``buffer_drop``, its disconnection, or the file on disk coming to equal
it (saved) — search and related answer from the buffer instead of the file: its chunks are
BM25-searchable at once and vector-searchable as soon as their new texts are embedded.

Nothing of a buffer is written to the index: it lives here, in memory, as an overlay.
- BM25: each buffer chunk is scored with FTS5's own bm25 formula (k1 1.2, b 0.75, the column
  weights) against the index's statistics (rows, document frequencies, average length), so its
  scores rank among the index's own; the indexed chunks of a buffered file are left out.
- Vectors: a text already in the embedding cache (the file as indexed, or an earlier version)
  costs nothing; new texts are embedded by the buffers thread (query engine first), and kept in
  memory only.
Buffer chunks have negative ids (-1, -2, ...), and their notes negative file ids.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import sqlite3
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ragd.engines.client import EngineError, EngineUnavailable
from ragd.index import store
from ragd.ingest import chunker, loader, sources
from ragd.ingest.chunker import embed_text
from ragd.workers import Worker
from ragd.text import (COMMON_SHARE, HEADING_WEIGHT, KEYWORDS_WEIGHT, NOTE_COLUMN_WEIGHTS,
                       TEXT_WEIGHT, chunk_rows, doc_freq, doc_freqs, fts_parts, index_tokens,
                       prepare, prune_common)

log = logging.getLogger("ragd.buffers")

K1, B = 1.2, 0.75
WEIGHTS = (HEADING_WEIGHT, KEYWORDS_WEIGHT, TEXT_WEIGHT)
CACHE = 4096  # buffer-embedded vectors kept (by text hash), across buffers


class BufferError(Exception):
    """A buffer cannot be taken; code and message for the error reply."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class BufChunk:
    id: int  # negative
    record: store.ChunkRecord
    tf: dict[str, float]  # stemmed term -> column-weighted frequency (bm25's aFreq)
    length: int  # tokens over all columns (bm25's D)
    stems: set[str] = field(default_factory=set)


@dataclass
class Buffer:
    session: int
    source: str
    rel: str
    path: Path
    text: str
    version: int | None
    hash: str
    file_id: int | None  # the indexed file it stands for (left out of search), if any
    note_id: int  # negative: the buffer's note in search results
    title: str
    chunks: list[BufChunk]
    disk: tuple[int, int]  # the file's (size, mtime_ns) when last compared
    set_at: float
    note_tf: dict[str, float] = field(default_factory=dict)  # its whole text, as notes_fts's
    note_length: int = 0


class BufferStore:
    def __init__(self, cfg, engines, reads, vectors):
        self.cfg = cfg
        self.engines = engines
        self.reads = reads
        self.vectors = vectors
        self._lock = threading.Condition()
        self._by_key: dict[tuple[int, str], Buffer] = {}  # (session, abs path) -> buffer
        self._ids = itertools.count(1)
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()  # embed_hash -> vector
        self._todo: OrderedDict[str, str] = OrderedDict()  # embed_hash -> text to embed
        self._stats: dict[str, tuple[float, int, float]] = {}  # FTS table -> (when, rows, avgdl)
        self._stop = threading.Event()
        self.worker = Worker("buffers", self._run)

    def start(self) -> None:
        self.worker.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        self.worker.stop(10)

    # -- the ops ----------------------------------------------------------------------------------

    def set(self, session: int, path: str, text: str, version: int | None) -> dict:
        src, rel = self._locate(path)
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.cfg.max_file_bytes:
            raise BufferError("bad_args", f"buffer_set: the text is {size} bytes, over the "
                                          f"file size limit (index.max_file_bytes = "
                                          f"{self.cfg.max_file_bytes})")
        limit = self.cfg.max_buffers_per_client
        with self._lock:
            mine = [b for (s, _), b in self._by_key.items() if s == session]
            held = (session, str(src.root / rel)) in self._by_key
        if not held and len(mine) >= limit:
            raise BufferError("unavailable", f"buffer_set: this client holds {len(mine)} "
                                             f"buffers, the limit ([buffers] max_per_client = "
                                             f"{limit}); drop one first")
        try:
            doc = loader.parse(src, rel, text)
        except ValueError as e:
            raise BufferError("bad_args", f"buffer_set: {e}") from None
        records = _records(doc, self.cfg)
        abspath = src.root / rel
        with self.reads.conn() as db:
            row = store.file_row(db, src.name, rel)
            chunks = [self._bufchunk(db, r) for r in records]
            note_tf, note_length = _weighted(db, store.note_row(
                [(r.heading, r.keywords, r.body) for r in records]), NOTE_COLUMN_WEIGHTS)
            cached = self._cached(db, {c.record.embed_hash for c in chunks})
        text_hash = sources.content_hash(text.encode("utf-8", "surrogatepass"))
        buf = Buffer(session, src.name, rel, abspath, text, version, text_hash,
                     row["id"] if row is not None else None, -next(self._ids), doc.title,
                     chunks, sources.stat_of(abspath), time.time(), note_tf, note_length)
        if self._equals_disk(buf):
            self.drop(session, str(abspath))
            return {"path": sources.printable(str(abspath)), "source": src.name,
                    "version": version, "chunks": len(chunks), "dropped": True,
                    "reason": "the buffer equals the file on disk (saved)"}
        new = {}
        with self._lock:
            self._by_key[(session, str(abspath))] = buf
            for h, v in cached.items():
                self._remember(h, v)
            for c in chunks:
                h = c.record.embed_hash
                if h not in self._vectors and h not in cached:
                    new[h] = self._model_prefix() + embed_text(c.record.heading, c.record.body)
            self._todo.update(new)
            self._forget_unheld()  # (the version this one replaces: its texts not in this)
            self._lock.notify_all()
        return {"path": sources.printable(str(abspath)), "source": src.name,
                "version": version, "chunks": len(chunks), "to_embed": len(new)}

    def drop(self, session: int, path: str) -> bool:
        key = (session, str(Path(path)))
        with self._lock:
            dropped = self._by_key.pop(key, None) is not None
            self._forget_unheld()
            return dropped

    def drop_session(self, session: int) -> None:
        with self._lock:
            for key in [k for k in self._by_key if k[0] == session]:
                del self._by_key[key]
            self._forget_unheld()

    def _forget_unheld(self) -> None:
        """Out of the queue, the texts no buffer holds any more (with the lock held): a
        buffer dropped, saved, replaced by its next version or its client gone. Left there,
        they would keep the query engine busy for nothing, each batch pausing the bulk
        embedding and slowing every search, with status saying idle."""
        if not self._todo:
            return
        held = {c.record.embed_hash for b in self._by_key.values() for c in b.chunks}
        for h in [h for h in self._todo if h not in held]:
            del self._todo[h]
        self._lock.notify_all()  # (wait_embedded: nothing may be left)

    def count(self, session: int | None = None) -> int:
        with self._lock:
            return sum(1 for s, _ in self._by_key if session is None or s == session)

    # -- for search ---------------------------------------------------------------------------------

    def active(self) -> list[Buffer]:
        """The buffers in force (the newest per path), after dropping those whose file on disk
        now equals them (saved)."""
        with self._lock:
            bufs = list(self._by_key.values())
        if not bufs:
            return []
        newest: dict[str, Buffer] = {}
        for b in sorted(bufs, key=lambda b: b.set_at):
            newest[str(b.path)] = b
        out = []
        for b in newest.values():
            if self.cfg.source(b.source) is None:
                continue
            st = sources.stat_of(b.path)
            if st != b.disk:
                b.disk = st
                if self._equals_disk(b):
                    log.debug("%s was saved: its buffer is dropped", b.path)
                    self.drop(b.session, str(b.path))
                    continue
            out.append(b)
        return out

    def chunk(self, cid: int) -> tuple[Buffer, BufChunk] | None:
        with self._lock:
            for b in self._by_key.values():
                for c in b.chunks:
                    if c.id == cid:
                        return b, c
        return None

    def bm25_hits(self, db: sqlite3.Connection, query: str, bufs: list[Buffer],
                  allowed: set[str] | None,
                  share: float = COMMON_SHARE) -> list[tuple[int, float]]:
        """(chunk id, score) of buffer chunks matching the query, with FTS5's bm25 over the
        index's statistics and the same query words (comparable with the index's own
        scores)."""
        parts = fts_parts(query)
        if not parts or not bufs:
            return []
        parts = prune_common(db, parts, share)
        rows, avgdl = self._corpus(db)
        terms = _terms(db, parts, rows, lambda p: doc_freq(db, p))
        out = []
        for b in bufs:
            if allowed is not None and b.source not in allowed:
                continue
            for c in b.chunks:
                score = _bm25(terms, c.tf, c.length, avgdl)
                if score > 0:
                    out.append((c.id, score))
        return sorted(out, key=lambda x: -x[1])

    def note_scores(self, db: sqlite3.Connection, parts: list[str],
                    bufs: list[Buffer]) -> dict[int, float]:
        """Each buffer's whole text scored as notes_fts scores a note (FTS5's bm25 over the
        notes' statistics, NOTE_WEIGHTS), for the query words note_terms kept:
        note id (negative) -> score, for the buffers holding one."""
        if not parts or not bufs:
            return {}
        rows, avgdl = self._corpus(db, "notes_fts")
        terms = _terms(db, parts, rows, lambda p: doc_freqs(db, [p], "notes_v")[0])
        out = {}
        for b in bufs:
            score = _bm25(terms, b.note_tf, b.note_length, avgdl)
            if score > 0:
                out[b.note_id] = score
        return out

    def vector_hits(self, qv: np.ndarray, bufs: list[Buffer],
                    allowed: set[str] | None) -> list[tuple[int, float]]:
        out = []
        with self._lock:
            for b in bufs:
                if allowed is not None and b.source not in allowed:
                    continue
                for c in b.chunks:
                    v = self._vectors.get(c.record.embed_hash)
                    if v is not None:
                        out.append((c.id, float(np.dot(v, qv))))
        return sorted(out, key=lambda x: -x[1])

    def vectors_of(self, buf: Buffer) -> list[tuple[BufChunk, np.ndarray]]:
        with self._lock:
            return [(c, self._vectors[c.record.embed_hash]) for c in buf.chunks
                    if c.record.embed_hash in self._vectors]

    def pending(self) -> int:
        with self._lock:
            return len(self._todo)

    # -- inside -------------------------------------------------------------------------------------

    def _locate(self, path: str):
        p = Path(os.path.abspath(os.path.expanduser(path)))
        for src in self.cfg.sources:
            try:
                rel = p.relative_to(src.root).as_posix()
            except ValueError:
                continue
            if rel and rel != "." and sources.Rules(src).wanted(rel):
                return src, rel
        raise BufferError("not_found", f"{path} is not a file ragd indexes (in no source, or "
                                       f"left out by its rules)")

    def _bufchunk(self, db: sqlite3.Connection, r: store.ChunkRecord) -> BufChunk:
        tf, length = _weighted(db, (r.heading, r.keywords, r.body), WEIGHTS)
        return BufChunk(-next(self._ids), r, tf, length, set(tf))

    def _corpus(self, db: sqlite3.Connection, table: str = "chunks_fts") -> tuple[int, float]:
        """Rows of an FTS table of the index (chunks_fts; notes_fts: a row per note with
        chunks) and their average length in tokens (refreshed each minute)."""
        now = time.monotonic()
        stats = self._stats.get(table)
        if stats is None or now - stats[0] > 60:
            prepare(db)
            db.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{table}_vc USING "
                       f"fts5vocab(main, {table}, col)")
            total = db.execute(f"SELECT COALESCE(SUM(cnt), 0) FROM temp.{table}_vc"
                               ).fetchone()[0]
            rows = chunk_rows(db) if table == "chunks_fts" else db.execute(
                "SELECT COUNT(*) FROM files WHERE chunks > 0").fetchone()[0]
            stats = self._stats[table] = (now, rows, (total / rows) if rows else 1.0)
        return stats[1], max(stats[2], 1.0)

    def _cached(self, db: sqlite3.Connection, hashes: set[str]) -> dict[str, np.ndarray]:
        space = self.vectors.active
        if space is None or not hashes:
            return {}
        return self.vectors.cached(db, space.id, hashes)

    def _model_prefix(self) -> str:
        m = self.engines.embed_model
        return m.doc_prefix if m is not None else ""

    def _remember(self, h: str, v: np.ndarray) -> None:  # with self._lock held
        self._vectors[h] = v
        self._vectors.move_to_end(h)
        while len(self._vectors) > CACHE:
            self._vectors.popitem(last=False)

    def _equals_disk(self, b: Buffer) -> bool:
        src = self.cfg.source(b.source)
        try:  # read inside its source, as get reads (a link swapped in is not followed out)
            data = sources.read_bytes(b.path, self.cfg.max_file_bytes,
                                      src.root if src else None)
        except sources.Unreadable:
            return False
        return data.hash == b.hash

    def _run(self) -> None:
        """Embed the buffers' new texts, a few at a time, with the query engine when it runs
        (the main one may be busy with bulk work)."""
        while not self._stop.is_set():
            with self._lock:
                while not self._todo and not self._stop.is_set():
                    self._lock.wait()
                if self._stop.is_set():
                    return
                batch = list(self._todo.items())[:8]
            engines = self.engines
            active = self.vectors.active
            engine = engines.query_engine_ready(active.model if active else None)
            if engine is None:
                self._stop.wait(0.5)
                continue
            limit = (engines.embed_model.context if engines.embed_model else 512) - 4
            try:  # an editor waits: bulk paused meanwhile
                vecs = engines.embed_waited(
                    engine.model, lambda e: e.client.embed([e.client.fit(t, limit)[0]
                                                            for _, t in batch]), engine)
            except (EngineUnavailable, EngineError) as e:
                log.debug("embedding buffer texts: %s", e)
                self._stop.wait(0.5)
                continue
            with self._lock:
                for (h, _), v in zip(batch, vecs):
                    self._remember(h, v)
                    self._todo.pop(h, None)
                self._lock.notify_all()

    def wait_embedded(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._todo:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True


def _records(doc, cfg) -> list[store.ChunkRecord]:
    pieces = chunker.chunk_doc(doc, cfg.chunk_tokens, cfg.chunk_overlap)
    return [store.ChunkRecord(i, c.heading, c.line_start, c.line_end, c.text, c.text_hash,
                              c.embed_hash, c.body, c.keywords) for i, c in enumerate(pieces)]


def _counts(db: sqlite3.Connection, text: str) -> dict[str, int]:
    """Stemmed token counts of a text, as the index's tokenizer makes them."""
    if not text:
        return {}
    return dict(Counter(index_tokens(db, [text])[0].split()))


def _terms(db: sqlite3.Connection, parts: list[str], rows: int,
           df_of) -> list[tuple[list[str], float]]:
    """Each query part's stems and IDF over `rows` rows (df_of(part): its rows)."""
    out = []
    for p in parts:
        words = _stems(db, p.strip('"'))
        if words:
            out.append((words, _idf(rows, df_of(p))))
    return out


def _idf(rows: int, df: int) -> float:
    """FTS5 bm25()'s IDF (never below 1e-6)."""
    return max(math.log((rows - df + 0.5) / (df + 0.5)) if rows else 0.0, 1e-6)


def _bm25(terms: list[tuple[list[str], float]], tf: dict[str, float], length: int,
          avgdl: float) -> float:
    """FTS5 bm25() of one row (column-weighted term frequencies `tf`, `length` tokens) for the
    query's (stems, idf); a phrase counts as its rarest word."""
    score = 0.0
    for words, idf in terms:
        f = min(tf.get(w, 0.0) for w in words)
        if f:
            score += idf * f * (K1 + 1) / (f + K1 * (1 - B + B * length / avgdl))
    return score


def _weighted(db: sqlite3.Connection, columns, weights) -> tuple[dict[str, float], int]:
    """(stemmed term -> column-weighted frequency, tokens over all columns): what FTS5's
    bm25() sees of a row with these column texts and weights."""
    tf: dict[str, float] = {}
    length = 0
    for text, w in zip(columns, weights):
        counts = _counts(db, text)
        for t, n in counts.items():
            tf[t] = tf.get(t, 0.0) + w * n
        length += sum(counts.values())
    return tf, length


def _stems(db: sqlite3.Connection, text: str) -> list[str]:
    return list(_counts(db, text))
