"""The ops that say how the daemon is: ping, status, sources, and wait (until what is on disk
is searchable), which search --wait uses too.
"""

from __future__ import annotations

import os
import time

from ragd import __version__, workers
from ragd import protocol as P
from ragd.index import store
from ragd.index.space import HEAD_TEXTS
from ragd.ingest.sources import printable
from ragd.ops.parts import Parts
from ragd.replies import OpError
from ragd.search.fusion import PARTIAL_FUSION_FROM

# The order texts wait for their vectors in (scan.Scans._scan_source, VectorStore._load)
EMBED_ORDER = (f"most recently modified notes first (a long note's rest after every note's "
               f"first {HEAD_TEXTS} texts)")
EVENT_GRACE = 0.1  # seconds a wait gives an edit made just before it to be heard


def _bulk(space) -> bool:
    """Is a first embedding (or a storm's) under way: a space short of PARTIAL_FUSION_FROM of
    its chunks' vectors? Then search --wait waits for changes to be indexed, not for the
    backlog (a live edit's texts are first in the embedder's queue anyway)."""
    have, todo = len(space.vectors), space.pending()
    return bool(todo) and have < PARTIAL_FUSION_FROM * (have + todo)


def doing(indexer: str, pending: int, engines: dict, text: dict | None,
          unsaved: int = 0) -> str:
    """What the daemon is doing, in a few words for the status header: the indexer's work
    first, then the embedding engine's (being prepared or started is not idle), then the
    vectors to come (editors' unsaved text first: `unsaved` texts), then the keyword index
    being filled."""
    if indexer != "idle" or pending:
        return indexer if indexer != "idle" else "indexing"
    e = engines.get("embedding") or {}
    state, embedder = e.get("state"), e.get("embedder")
    if state == "preparing model":
        return "preparing the embedding model"
    if state in ("starting", "restarting"):
        return f"{state} the embedding engine"
    if state == "failed":
        return "the embedding engine failed (search ranks by keywords)"
    if embedder in ("waiting for engine", "loading vectors"):
        return "loading vectors" if embedder == "loading vectors" else \
            "starting the embedding engine"
    if unsaved:
        return f"embedding editors' unsaved text ({unsaved:,} texts to go)"
    if e.get("pending_texts"):
        return f"embedding ({e['pending_texts']:,} texts to go)"
    if embedder == "embedding":  # the last batch in flight (its texts may be gone since)
        return "embedding"
    if text and text.get("state") == "filling":
        return "filling the keyword index (FTS5 answers meanwhile)"
    return "idle"


class StatusOps:
    def __init__(self, parts: Parts):
        self.p = parts

    def cmd_ping(self) -> dict:
        return {"pid": os.getpid(), "version": __version__, "protocol": P.PROTOCOL_VERSION}

    def cmd_status(self) -> dict:
        # The indexer's state first: when it says idle, the counts read after it include every
        # commit that made it so (read the other way round, a client could see idle with stale
        # counts).
        waiting = self.p.watcher.pending if self.p.watcher is not None else 0
        pending, idle = self.p.indexer.pending + waiting, self.p.indexer.idle and not waiting
        oldest = self.p.indexer.oldest_pending()
        if self.p.watcher is not None:
            for source, t in self.p.watcher.oldest_pending().items():
                oldest[source] = min(oldest.get(source, t), t)
        now = time.time()
        with self.p.reads.conn() as db:
            counts = store.source_counts(db)
            engines = self.engines_status()
            aside = store.removed_sources(db)
        notices = [n() if callable(n) else n for n in self.p.notices]
        hints = sorted(self.p.indexer.hints) + self.p.cfg.overlaps + [n for n in notices if n]
        for name, r in sorted(aside.items()):
            if self.p.cfg.source(name) is None:  # (else: being restored)
                until = time.strftime("%Y-%m-%d %H:%M", time.localtime(
                    r["removed_at"] + self.p.cfg.gc_grace_hours * 3600))
                hints.append(f"source {name!r} is no longer in the config: its {r['files']} "
                             f"files are set aside until {until} (gc.grace_hours); added back "
                             f"under that name before then, it returns as it was")
        if self.p.restart_needed:
            n = len(self.p.restart_needed)
            hints.insert(0, f"the config changes {', '.join(self.p.restart_needed)}, which "
                            f"take{'s' if n == 1 else ''} effect at the next start "
                            f"('ragctl stop && ragctl start')")
        for problem in reversed(self.p.config_problems):
            hints.insert(0, f"the config file's {problem}")
        if self.p.reload_failed:
            hints.insert(0, self.p.reload_failed)
        per_source = []
        for s in self.p.cfg.sources:
            c = counts.get(s.name, {})
            st = self.p.indexer.source_state(s.name)
            per_source.append({
                "name": s.name, "path": str(s.root), "kind": s.kind,
                "files": c.get("indexed", 0), "skipped": c.get("skipped", 0),
                "failed": c.get("failed", 0), "chunks": c.get("chunks", 0),
                "scanning": st.scanning, "last_scan": st.last_scan, "last_error": st.last_error,
                "unlisted": [printable(d) or "." for d in sorted(st.unlisted)],
                "watched": self.p.watcher is not None and s.name not in self.p.watcher.errors,
                "watch_error": self.p.watcher.errors.get(s.name) if self.p.watcher else None,
                "last_event": self.p.watcher.last_event.get(s.name) if self.p.watcher else None,
                "lag_s": round(now - oldest[s.name], 3) if s.name in oldest else 0.0,
            })
        s = self.p.indexer.stats
        text = self.p.text.status() if self.p.text is not None else None
        bufs = self.p.buffers
        unsaved = {"held": bufs.count(), "to_embed": bufs.pending()} if bufs is not None \
            else {"held": 0, "to_embed": 0}
        return {
            "pid": os.getpid(), "version": __version__, "protocol": P.PROTOCOL_VERSION,
            "uptime_s": round(time.time() - self.p.started, 3),
            "data_dir": str(self.p.cfg.data_dir), "socket": str(self.p.cfg.socket),
            "log": str(self.p.cfg.log_path),
            "config": str(self.p.cfg.path) if self.p.cfg.path else None,
            "pending": pending, "idle": idle, "indexer": self.p.indexer.state,
            "doing": doing(self.p.indexer.state if not idle else "idle", pending, engines, text,
                           unsaved["to_embed"]),
            "buffers": unsaved,
            "sources": per_source, "engines": engines, "hints": hints,
            "connections": {"open": self.p.server.connections if self.p.server else None,
                            "limit": self.p.cfg.max_connections},
            "threads": workers.all_status(),
            "store": (self.p.backend.status() if self.p.backend is not None
                      else {"backend": "sqlite"}),
            "bm25_index": text or {"engine": "fts5"},
            "totals": {"files_indexed": s.files_indexed, "files_unchanged": s.files_unchanged,
                       "files_skipped": s.files_skipped, "files_failed": s.files_failed,
                       "files_removed": s.files_removed, "files_moved": s.files_moved,
                       "chunks_written": s.chunks_written,
                       "watch_overflows": self.p.watcher.overflows if self.p.watcher else 0},
        }

    def cmd_sources(self) -> list[dict]:
        return [{"name": s.name, "path": str(s.root), "kind": s.kind, "include": list(s.include),
                 "exclude": list(s.exclude)} for s in self.p.cfg.sources]

    def fresh(self, timeout: float, vectors: bool | None = None, fill: bool = False) -> bool:
        """Wait (at most timeout s) until changes already made on disk are searchable: the
        watcher's settling events, the indexer's queue and (vectors: True) the embedder's
        backlog are empty. vectors None: wait for the embedder only while its engine is up.
        fill: also until a tantivy index being filled is complete (the `wait` op: until
        nothing is left to do; search meanwhile answers from FTS5, whose order differs).
        Blocks on each part's condition in turn; nothing polls. An edit made just before the
        request is given up to EVENT_GRACE to be heard first (inotify delivers within
        milliseconds; no event may be on its way, and that cannot be known sooner)."""
        deadline = time.monotonic() + timeout
        if self.p.watcher is not None:
            self.p.watcher.wait_heard(min(EVENT_GRACE, timeout))

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        def embedder():
            emb = self.p.embedder
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
            if self.p.watcher is not None and not self.p.watcher.wait_settled(left()):
                return False
            if not self.p.indexer.wait_idle(left()):
                return False
            emb = embedder()
            if emb is not None and not emb.wait_idle(left()):
                return False
            emb = embedder()
            if self.p.backend is not None and self.p.backend.serving \
                    and not self.p.backend.wait_synced(left()):
                return False
            if self.p.text is not None and (self.p.text.serving or fill and not self.p.text.error) \
                    and not self.p.text.wait_synced(left()):
                return False
            if ((self.p.watcher is None or self.p.watcher.pending == 0) and self.p.indexer.idle
                    and (emb is None or emb.idle)):
                return True
            if left() <= 0:
                return False

    def cmd_wait(self, timeout: float, vectors: bool) -> dict:
        """Block until what is on disk is indexed (vectors: and embedded), at most timeout s."""
        if not 0 <= timeout <= 3600:
            raise OpError(P.BAD_ARGS, f"wait: 'timeout' must be between 0 and 3600 s, got "
                          f"{timeout}")
        if vectors and "embedding" not in self.p.engines.configured:
            vectors = False  # no embedding model: nothing to wait for
        t0 = time.monotonic()
        done = self.fresh(timeout, vectors=vectors, fill=True)
        return {"idle": done, "waited_ms": round((time.monotonic() - t0) * 1e3, 1)}

    def engines_status(self) -> dict:
        out = self.p.engines.status()
        emb = self.p.embedder
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
                # at the pace of the last requests (EmbedStats.time_left)
                "eta_s": round(left) if todo and space is not None and (left := s.time_left(
                    *space.pending_split())) is not None else None,
            })
            chunks = sum(c.get("chunks", 0) for c in self.counts().values())
            switch = self.p.embedding.status(chunks)
            if switch is not None:
                out["embedding"]["switch"] = switch
        return out

    def counts(self) -> dict:
        with self.p.reads.conn() as db:
            return store.source_counts(db)

