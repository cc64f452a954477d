"""Which embedding model serves, and switching to another with zero downtime.

Like an alias swap in Elasticsearch: a model change (the config's [embedding] model, pooling
or prefixes changed and reloaded, or ``ragctl models use``) does not leave search without
vectors. The model in use keeps serving — its space answers queries, its engines embed them —
while a second engine embeds every live chunk text into the new model's space beside it (cache
first: texts the new model embedded before cost nothing). Edits during the switch are queued for
both spaces. When the new space covers every chunk, one transaction makes it the active space;
the old engines stop; the old vectors stay in the cache under the GC grace period (switching
back finds them).

The model in use is recorded in the index (meta ``active_model``), so a restart during a switch
resumes it: the recorded model serves again and the configured one is built beside it. Until
the flip's transaction commits, the index's active space is the old one: a kill -9 at any point
leaves a usable index.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from ragd.engines.models import ResolvedModel
from ragd.index import store
from ragd.index.embedder import Embedder
from ragd.index.vectorstore import VectorStore

log = logging.getLogger("ragd.switch")


def identity(m: ResolvedModel) -> tuple:
    """What makes two configured models the same vector space (before the probe check)."""
    return (str(Path(m.path).resolve()), m.pooling, m.query_prefix, m.doc_prefix)


def to_record(m: ResolvedModel, value: str) -> str:
    """The model in use, as the index records it: what runs it again, and the config's value
    for it (a registry name or a path)."""
    return json.dumps({"value": value, "name": m.name, "path": str(m.path), "pooling": m.pooling,
                       "context": m.context, "query_prefix": m.query_prefix,
                       "doc_prefix": m.doc_prefix, "min_similarity": m.min_similarity,
                       "dims": m.dims})


def from_record(text: str) -> tuple[ResolvedModel, str] | None:
    try:
        d = json.loads(text)
        return (ResolvedModel(d["name"], Path(d["path"]), "embedding", d["pooling"],
                              int(d["context"]), d["query_prefix"], d["doc_prefix"],
                              float(d["min_similarity"]), d.get("dims")),
                d.get("value") or d["path"])
    except (ValueError, KeyError, TypeError):
        return None


class Embedding:
    def __init__(self, cfg, engines, vectors: VectorStore):
        self.cfg = cfg
        self.engines = engines
        self.vectors = vectors
        self.active: Embedder | None = None
        self.next: Embedder | None = None
        self.switch_started: float | None = None
        self.values: dict[int, str] = {}  # id(embedder) -> the config's value for its model
        self._lock = threading.RLock()

    # -- starting ---------------------------------------------------------------------------------

    def start(self, configured: ResolvedModel) -> None:
        """The configured model is ready (the engines' setup thread). Serve it — or, when the
        index records another model in use (a switch was under way), serve that one and build
        the configured one beside it."""
        got = self._recorded()
        value = self.cfg.embedding_model
        with self._lock:
            if self.active is not None:  # (prepared again after a reload: a change of model)
                log.info("%s", self.change(configured, value))
                return
            if got is not None and identity(got[0]) != identity(configured) and \
                    Path(got[0].path).is_file():
                recorded, old_value = got
                log.info("resuming the switch from %s to %s: %s serves meanwhile",
                         recorded.name, configured.name, recorded.name)
                self._serve(recorded, old_value)
                self._begin(configured, value)
            else:
                self._serve(configured, value)

    def _recorded(self) -> tuple[ResolvedModel, str] | None:
        db = store.connect(self.cfg.db_path)
        try:
            row = db.execute("SELECT value FROM meta WHERE key = 'active_model'").fetchone()
        finally:
            db.close()
        return from_record(row[0]) if row else None

    def _serve(self, model: ResolvedModel, value: str) -> None:
        engine = self.engines.serve_embedding(model)
        self.active = Embedder(self.cfg.db_path, engine, model, self.vectors,
                               batch_tokens=self.cfg.embed_batch_tokens,
                               record=to_record(model, value))
        self.values[id(self.active)] = value
        self.active.start()

    def _begin(self, model: ResolvedModel, value: str) -> None:
        engine = self.engines.serve_next(model)
        self.next = Embedder(self.cfg.db_path, engine, model, self.vectors,
                             batch_tokens=self.cfg.embed_batch_tokens, activate=False,
                             on_complete=self._flip, record=to_record(model, value))
        self.values[id(self.next)] = value
        self.next.worker.name = "embedder-next"
        self.switch_started = time.time()
        self.next.start()
        log.info("switching the embedding model from %s to %s: building its vectors beside "
                 "the ones in use, which answer meanwhile", self.active.model.name, model.name)

    # -- a change of model (reload) ---------------------------------------------------------------

    def change(self, model: ResolvedModel, value: str) -> str:
        """The configured model is now `model`. Returns what happens, for the reload's reply."""
        with self._lock:
            if self.active is None:  # none serves yet, or its preparation failed
                return self.engines.prepare_embedding()
            if self.next is not None:
                if identity(model) == identity(self.next.model):
                    return f"already switching to {model.name}"
                self._cancel()
                if identity(model) == identity(self.active.model):
                    return f"switch cancelled: {model.name} stays"
            elif identity(model) == identity(self.active.model):
                return "unchanged"
            self._begin(model, value)
            return f"switching to {model.name}"

    def cancel(self) -> bool:
        with self._lock:
            if self.next is None:
                return False
            self._cancel()
            return True

    def _cancel(self) -> None:
        nxt, self.next, self.switch_started = self.next, None, None
        nxt.stop()
        self.engines.drop_next()
        with self.vectors.sync:
            self.vectors.building = None
        log.info("the switch to %s is cancelled; what it embedded stays in the cache",
                 nxt.model.name)

    def _flip(self, nxt: Embedder) -> None:
        """The new space covers every chunk (called on its embedder's thread): make it the
        active one, in one transaction, and stop the old model's engines."""
        with self._lock:
            if nxt is not self.next:
                return
            old = self.active
            db = store.connect(self.cfg.db_path)
            try:
                with self.vectors.sync:
                    with store.transaction(db):
                        self.vectors.make_active(db, nxt.space.id, nxt.record)
                    self.vectors.promote(nxt.space)
                    nxt.activate = True
                    self.vectors.serve_edits(nxt)
            finally:
                db.close()
            self.active, self.next = nxt, None
            took = time.time() - (self.switch_started or time.time())
            self.switch_started = None
            nxt.worker.name = "embedder"
        log.info("the switch to %s is done (%.0f s): its space %d answers now; %s stops, its "
                 "vectors stay cached", nxt.model.name, took, nxt.space.id, old.model.name)
        threading.Thread(target=self._retire, args=(old,), name="retire", daemon=True).start()

    def _retire(self, old: Embedder) -> None:
        old.stop()
        self.engines.promote_next()

    def stop(self) -> None:
        embedders = [e for e in (self.next, self.active) if e is not None]
        for e in embedders:  # all told first: one waited for is no reason for another to go on
            e.tell_stop()
        for e in embedders:
            e.stop()

    # -- status -----------------------------------------------------------------------------------

    def status(self, chunks: int) -> dict | None:
        nxt = self.next
        if nxt is None or self.active is None:
            return None
        have = len(nxt.space.vectors) if nxt.space is not None else 0
        out = {"from": self.active.model.name, "to": nxt.model.name,
               "from_value": self.values.get(id(self.active)),
               "to_value": self.values.get(id(nxt)),
               "from_space": self.active.space_id, "to_space": nxt.space_id,
               "vectors": have, "chunks": chunks,
               "progress": round(min(1.0, have / chunks), 4) if chunks else 1.0,
               "state": nxt.status, "engine": nxt.engine.state,
               "engine_reason": nxt.engine.reason,
               "started": self.switch_started}
        todo = nxt.pending()
        elapsed = time.time() - (self.switch_started or time.time())
        rate = nxt.stats.texts / elapsed if elapsed > 5 and nxt.stats.texts else None
        out["texts_to_embed"] = todo
        out["eta_s"] = round(todo / rate) if rate and todo is not None else None
        return out
