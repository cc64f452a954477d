"""The daemon's models and their engines: resolve the models, supervise one llama.cpp server
per role (and a small second one for query embeddings). Nothing here knows of vectors: when
the embedding engine is made, ``on_embedding`` is called (the runtime starts an embedder, which
fills the vector store, index/vectorstore.py).

Model resolution can take a while the first time (the default model is fetched from PyPI and
converted), so it runs in a thread after the socket is up: search answers from BM25 meanwhile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import threading
import time

from ragd.engines import models
from ragd.engines.client import EngineUnavailable
from ragd.engines.models import ModelError, ResolvedModel
from ragd.engines.supervisor import Engine, EngineSettings, cores

# Niceness of the bulk embedding engine when a query engine runs beside it (os.nice: 10 gives
# a nice-0 process about 10x its share of a contended core).
BULK_NICE = 10

# While a query is embedded by the query engine, the bulk embedding engines beside it are
# paused (SIGSTOP of their process group, SIGCONT after): llama.cpp's threads meet at a barrier
# after each step of the graph, so the query engine's threads beside busy bulk threads, on as
# many cores, wait at every barrier for a thread that is not running, niced or not: a query
# would take many times its idle time while bulk work runs.
# A flood of queries must not stop the bulk work: a pause lasts at most PAUSE_MAX, and the
# engine owes no more than PAUSE_BURST of pauses not yet repaid by as long running.
PAUSE_MAX = 0.5
PAUSE_BURST = 2.0

log = logging.getLogger("ragd.engines")


class QueryFirst:
    """Pauses the bulk engines while queries are embedded (see PAUSE_MAX): `with
    q.around(engines_to_pause):` around a query's engine call, from any thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._inside = 0
        self._paused: list[Engine] = []
        self._since = 0.0
        self._ran_since = time.monotonic()
        self._debt = 0.0
        self.paused_s = 0.0  # in all (status: the bulk engine's time given to queries)
        self.pauses = 0

    @contextlib.contextmanager
    def around(self, bulk: list[Engine]):
        self._enter(bulk)
        try:
            yield
        finally:
            self._exit()

    def _enter(self, bulk: list[Engine]) -> None:
        with self._lock:
            self._inside += 1
            if self._paused or self._inside > 1 or not bulk:
                return
            now = time.monotonic()
            self._debt = max(0.0, self._debt - (now - self._ran_since))
            if self._debt >= PAUSE_BURST:
                return
            self._paused = [e for e in bulk if e.signal(signal.SIGSTOP)]
            self._since = now

    def _exit(self) -> None:
        with self._lock:
            self._inside -= 1
            if self._paused and (self._inside == 0
                                 or time.monotonic() - self._since > PAUSE_MAX):
                self._resume()

    def _resume(self) -> None:
        for e in self._paused:
            e.signal(signal.SIGCONT)
        now = time.monotonic()
        self._debt += now - self._since
        self.paused_s += now - self._since
        self.pauses += 1
        self._ran_since = now
        self._paused = []


class Engines:
    def __init__(self, cfg, on_embedding=None):
        self.cfg = cfg
        self.on_embedding = on_embedding  # (model): the configured embedding model is ready
        self._lock = threading.Lock()
        self.embed_model: ResolvedModel | None = None
        self.rerank_model: ResolvedModel | None = None
        self.embed_engine: Engine | None = None
        # A second engine for query embeddings (same model, as many threads as the bulk one:
        # one query's embedding takes half as long on two cores as on one): a search never
        # waits behind a bulk embedding batch ([embedding] query_engine), and the bulk engine
        # runs niced (BULK_NICE), so the query's threads take the cores first.
        self.query_engine: Engine | None = None
        # During a model switch: the new model's engine, filling its space beside the old.
        self.next_model: ResolvedModel | None = None
        self.next_engine: Engine | None = None
        self.rerank_engine: Engine | None = None
        # A chat model for `ask` (ragd/search/ask.py), off unless [generator] model is set.
        self.gen_model: ResolvedModel | None = None
        self.gen_engine: Engine | None = None
        self.errors: dict[str, str] = {}
        self.setting_up: dict[str, bool] = {}
        self._embedding_again = False  # the config named another model while one was prepared
        self._thread = threading.Thread(target=self._setup, name="engines-setup", daemon=True)
        self._stopped = threading.Event()
        self._query_first = QueryFirst()
        self.settings = EngineSettings(cfg.llama_server, cores(cfg.engine_threads),
                                       cfg.engine_startup_timeout, cfg.engine_max_restarts,
                                       cfg.engine_restart_window, cfg.engine_health_interval,
                                       failed_retry=cfg.engine_failed_retry)

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
            if role == "embedding":
                self._setup_embedding()
                continue
            model = self._resolve(role, value)
            if model is None:
                self.setting_up[role] = False
                continue
            if role == "generator":
                # the context asked for, within what the model was trained on
                model = dataclasses.replace(model, context=min(self.cfg.generator_context,
                                                               model.context))
                with self._lock:
                    if self._stopped.is_set():
                        return
                    self.gen_model = model
                    self.gen_engine = Engine(role, model, self.settings, run_dir, log_dir)
                    self.gen_engine.start()
            else:
                with self._lock:
                    if self._stopped.is_set():
                        return
                    self.rerank_model = model
                    self.rerank_engine = Engine(role, model, self.settings, run_dir, log_dir)
                    self.rerank_engine.start()
            self.setting_up[role] = False

    def _resolve(self, role: str, value: str) -> ResolvedModel | None:
        """The model for a role, fetched or built if need be; None (the reason in `errors`)
        when it cannot be had."""
        try:
            return models.resolve(
                value, role, self.cfg.data_dir, pooling=self.cfg.pooling_for(role),
                query_prefix=self.cfg.embedding_query_prefix if role == "embedding" else None,
                doc_prefix=self.cfg.embedding_doc_prefix if role == "embedding" else None)
        except ModelError as e:
            self.errors[role] = str(e)
            log.error("%s model: %s", role, e)
        except Exception as e:  # a converter or network failure must not kill the daemon
            self.errors[role] = f"{type(e).__name__}: {e}"
            log.exception("%s model could not be prepared", role)
        if role == "embedding":  # what to do about it, where status and search say it
            self.errors[role] += ("\n(`ragctl models use PATH.gguf` starts a GGUF file you "
                                  "have, without a restart)")
        return None

    def _setup_embedding(self) -> None:
        """Prepare the configured embedding model and hand it over (on_embedding); again while
        the config named another one meanwhile (prepare_embedding)."""
        while not self._stopped.is_set():
            self.setting_up["embedding"] = True
            model = self._resolve("embedding", self.cfg.embedding_model)
            if model is not None:
                self.errors.pop("embedding", None)
                if self.on_embedding is not None:
                    # the runtime decides what to run: this model, or (a switch under way)
                    # the model in use while this one's vectors are built beside it
                    self.on_embedding(model)
                else:
                    self.serve_embedding(model)
            with self._lock:
                if self._embedding_again and self.cfg.embedding_model:
                    self._embedding_again = False
                    self.errors.pop("embedding", None)
                    continue
                self.setting_up["embedding"] = False
                return

    def prepare_embedding(self) -> str:
        """The configured embedding model changed while none serves (its preparation failed —
        no network for the default model, a wrong path — or is still under way): prepare the
        one configured now, on a thread (engines-setup). Returns what happens, for the
        reload's reply."""
        with self._lock:
            if self._stopped.is_set():
                return "ragd is stopping"
            if self.setting_up.get("embedding"):  # (checked by _setup_embedding, same lock)
                self._embedding_again = True
                return ("the embedding model is still being prepared; the one configured now "
                        "follows it")
            self.setting_up["embedding"] = True
        self.errors.pop("embedding", None)
        threading.Thread(target=self._setup_embedding, name="engines-setup",
                         daemon=True).start()
        return f"preparing the embedding model {self.cfg.embedding_model}"

    def resolve_embedding(self, value: str, pooling: str | None, query_prefix: str | None,
                          doc_prefix: str | None) -> ResolvedModel:
        return models.resolve(value, "embedding", self.cfg.data_dir, pooling=pooling or None,
                              query_prefix=query_prefix, doc_prefix=doc_prefix)

    def _dirs(self):
        return self.cfg.socket.parent, self.cfg.data_dir / "engines"

    def serve_embedding(self, model: ResolvedModel) -> Engine:
        """Start the engines that serve this model: the main one (bulk embedding) and the
        query engine. Returns the main one."""
        run_dir, log_dir = self._dirs()
        with self._lock:
            self.embed_model = model
            self.embed_engine = Engine("embedding", model, self._bulk_settings(), run_dir,
                                       log_dir)
            if self.cfg.query_engine:
                self.query_engine = Engine("query", model, self.settings, run_dir, log_dir)
            if self._stopped.is_set():
                return self.embed_engine
            self.embed_engine.start()
            if self.query_engine is not None:
                self.query_engine.start()
        return self.embed_engine

    def _bulk_settings(self):
        """A bulk embedding engine yields the cores to the query engine (when there is one)."""
        if self.cfg.query_engine:
            return dataclasses.replace(self.settings, nice=BULK_NICE)
        return self.settings

    def serve_next(self, model: ResolvedModel) -> Engine:
        """A model switch: an engine for the new model, beside the one in use."""
        run_dir, log_dir = self._dirs()
        with self._lock:
            # its name (socket, log) must differ from the engine in use, which after an earlier
            # switch is itself "embedding-next": two engines on one socket, the old one's stop
            # unlinked the new one's, and embedding stalled until a health check restarted it
            name = ("embedding" if self.embed_engine is not None
                    and self.embed_engine.role == "embedding-next" else "embedding-next")
            self.next_model = model
            self.next_engine = Engine(name, model, self._bulk_settings(), run_dir, log_dir)
            if not self._stopped.is_set():
                self.next_engine.start()
        return self.next_engine

    def promote_next(self) -> None:
        """The switch is done: the new model's engine serves; the old one and its query
        engine stop, and a query engine for the new model starts."""
        run_dir, log_dir = self._dirs()
        with self._lock:
            old = [e for e in (self.embed_engine, self.query_engine) if e is not None]
            self.embed_model, self.embed_engine = self.next_model, self.next_engine
            self.next_model = self.next_engine = None
            self.query_engine = None  # queries go to the promoted engine meanwhile
        # The old engines stop before the new query engine starts: both use query.sock, and
        # each unlinks it (at start, at stop) — started first, the new one lost its socket
        # to the old one's stop, and search answered degraded until a restart.
        for e in old:
            e.stop()
        with self._lock:
            if self.cfg.query_engine and not self._stopped.is_set():
                self.query_engine = Engine("query", self.embed_model, self.settings,
                                           run_dir, log_dir)
                self.query_engine.start()

    def drop_next(self) -> None:
        """The switch is cancelled: the new model's engine stops, and its log goes (named as
        no engine that runs is, it was left behind to puzzle whoever lists the folder; why a
        stalled switch failed was said by status before the cancel)."""
        with self._lock:
            engine, self.next_engine, self.next_model = self.next_engine, None, None
        if engine is not None:
            engine.stop()
            for path in (engine.log_path, engine.log_path.with_name(engine.log_path.name + ".1")):
                try:
                    path.unlink(missing_ok=True)
                except OSError as e:
                    log.debug("%s: %s", path, e)

    def unavailable(self, role: str) -> str | None:
        """Why the role cannot serve right now (None when it can, or is simply starting)."""
        if role in self.errors:
            return f"the {role} model is unavailable: {self.errors[role]}"
        if self.setting_up.get(role):
            return f"the {role} model is being prepared"
        engine = self.engine(role)
        if engine is not None and not engine.ready:
            why = f": {engine.reason.splitlines()[0]}" if engine.reason else ""
            if engine.state == "failed" and engine.next_try:
                why += (f"; next try in {max(0, engine.next_try - time.time()):.0f} s, or "
                        f"at once by 'ragctl reload'")
            state = "has failed" if engine.state == "failed" else f"is {engine.state}"
            return f"the {role} engine {state}{why}"
        return None

    def retry_failed(self) -> list[str]:
        """Every engine left failed is tried again now (a reload). Returns their roles."""
        with self._lock:
            engines = [e for e in (self.embed_engine, self.query_engine, self.next_engine,
                                   self.rerank_engine, self.gen_engine) if e is not None]
        return [e.role for e in engines if e.retry()]

    def stop(self) -> None:
        """Stop every engine, all at once: each has STOP_GRACE after its SIGTERM, and one
        after the other they added up (two to five engines)."""
        self._stopped.set()
        with self._lock:
            pass
        engines = self._running()
        threads = [threading.Thread(target=e.stop, name=f"stop-{e.role}", daemon=True)
                   for e in engines]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def kill_now(self) -> None:
        """SIGKILL every engine still running (ragd's stop ran out of time)."""
        for engine in self._running():
            engine.kill_now()

    def _running(self) -> list:
        return [e for e in (self.embed_engine, self.query_engine, self.next_engine,
                            self.rerank_engine, self.gen_engine) if e is not None]

    def status(self) -> dict:
        """Per configured role: its model and engine (state, pid, restarts, ...)."""
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
        if self.query_engine is not None and "embedding" in out:
            q = self.query_engine.status()
            out["embedding"]["query_engine"] = {k: q[k] for k in ("state", "pid", "restarts",
                                                                  "reason", "nice", "threads",
                                                                  "next_try")}
            # how long the bulk engine was paused while queries were embedded (QueryFirst)
            out["embedding"]["query_engine"]["bulk_paused_s"] = round(
                self._query_first.paused_s, 3)
        return out

    def query_first(self, engine: Engine):
        """Around the embedding of a query by `engine`: the bulk embedding engines are paused
        meanwhile when it is the query engine (QueryFirst)."""
        bulk = [] if engine is not self.query_engine else [
            e for e in (self.embed_engine, self.next_engine) if e is not None]
        return self._query_first.around(bulk)

    def query_engine_ready(self, model: ResolvedModel | None = None,
                           skip: tuple = ()) -> Engine | None:
        """The engine to embed a query with: the query engine, else the main one, if up —
        of this model (during a model switch two models run: a query must be embedded by the
        model of the space it searches); none of `skip`."""
        for e in (self.query_engine, self.embed_engine, self.next_engine):
            if e is not None and e.ready and e not in skip and (
                    model is None or e.model.path == model.path
                    and e.model.pooling == model.pooling):
                return e
        return None

    def embed_waited(self, model: ResolvedModel | None, work, first: Engine | None = None):
        """work(engine) — someone waits for it: a query, an editor's buffer, `related` —
        on the engine query_engine_ready gives (or `first`), the bulk engines paused meanwhile.
        An engine that stops answering part way (stopped by a model switch's hand-over,
        killed, hung) hands the work to the next one of the model that is ready: one engine
        going is no reason to answer without meaning while another is up. Raises the last
        EngineUnavailable (or an EngineError: the request is at fault, not the engine)."""
        tried: list[Engine] = []
        engine = first or self.query_engine_ready(model)
        while True:
            if engine is None:
                raise EngineUnavailable("no embedding engine is ready")
            try:
                with self.query_first(engine):
                    return work(engine)
            except EngineUnavailable as e:
                tried.append(engine)
                engine = self.query_engine_ready(model, skip=tuple(tried))
                if engine is None:
                    raise e from None
                log.info("%s engine did not answer (%s): the %s engine embeds it",
                         tried[-1].role, e, engine.role)
