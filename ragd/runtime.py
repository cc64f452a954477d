"""The running daemon: its parts, started and stopped in order, and its configuration reloaded
live (SIGHUP, ``ragctl reload``).

What a reload applies at once: sources added, removed or changed (watched, scanned, purged),
search, watch, GC and index settings, the log level. What needs a restart is said in the reply
(the daemon's paths, its engines and models).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import signal
import threading
import time
from pathlib import Path

from ragd import __version__, config, protocol, settings
from ragd.engines import models
from ragd.engines.manager import Engines
from ragd.events import EventBus
from ragd.index import gc, milvus, store, textindex
from ragd.index.indexer import Indexer
from ragd.index.switch import Embedding
from ragd.index.vectorstore import VectorStore
from ragd.ingest import loader
from ragd.ingest.watcher import Watcher
from ragd.index.buffers import BufferStore
from ragd.ops import Ops
from ragd.ops.parts import Parts
from ragd.ops.reads import ReadPool
from ragd.search.hybrid import Searcher
from ragd.server import Server

log = logging.getLogger("ragd")

# Config field -> the setting's name in the file (said in the reload's reply), by what a reload
# does with it: applies it (LIVE), says it needs a restart (RESTART, in restart_needed), or
# switches the embedding model (MODEL_FIELDS). Sources are handled apart.
LIVE = settings.fields(settings.LIVE)
RESTART = settings.fields(settings.RESTART)
MODEL_FIELDS = tuple(settings.fields(settings.MODEL))

# Seconds a stop may take: the parts still busy then are left to the exit (well within the
# service unit's TimeoutStopSec, and what a person waits for at `ragctl stop`)
STOP_WITHIN = 4.0


class Runtime:
    def __init__(self, cfg: config.Config, cli_config: str | None, cli_sources: list[str]):
        self.cfg = cfg
        self.cli_config = cli_config
        self.cli_sources = cli_sources
        # The main loop sleeps on this pipe: a byte b"s" asks it to stop, b"r" to reload. A
        # signal handler may only write here: one that set a threading.Event took the Event's
        # lock, and a SIGTERM landing while the main thread held that same lock (entering or
        # leaving its wait) deadlocked the daemon for good.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._reload_lock = threading.Lock()
        self.vectors = VectorStore(cfg.data_dir, cfg.vector_dtype, cfg.ann_threshold,
                                   keys_only=cfg.store_backend == "milvus"
                                   and not cfg.store_local_vectors)
        self.vectors.enabled = bool(cfg.embedding_model)
        self.engines = Engines(cfg, on_embedding=self._on_embedding)
        self.embedding = Embedding(cfg, self.engines, self.vectors)
        self.indexer = Indexer(cfg, cfg.db_path, listener=self.vectors, events=EventBus())
        # [store] backend = "milvus": a mirror of the index in Milvus serves the rankings
        self.backend: milvus.MilvusStore | None = None
        if cfg.store_backend == "milvus":
            try:
                import pymilvus  # noqa: F401
            except ImportError:
                raise config.ConfigError(
                    f"{cfg.path or 'config'}: store.backend = \"milvus\" needs the Milvus "
                    f"client: pip install 'ragd[milvus]'") from None
            self.backend = milvus.MilvusStore(cfg.db_path, cfg.data_dir, cfg.store_uri,
                                              cfg.store_collection, cfg.store_token)
            self.vectors.on_commit(self.backend.wake)
        # the keyword ranking's tantivy index (the Milvus store serves its own BM25)
        self.text = (textindex.TextIndex(cfg.db_path, cfg.data_dir)
                     if cfg.bm25_index == "tantivy" and self.backend is None else None)
        if self.text is not None:
            self.indexer.committed.append(self.text.wake)
        # what the ops read: request threads' connections, editors' buffers, the ranking
        self.reads = ReadPool(cfg.db_path)
        self.buffers = BufferStore(cfg, self.engines, self.reads, self.vectors)
        searcher = Searcher(cfg, self.engines, self.vectors, self.buffers, self.backend,
                            self.text, self.reads)
        self.parts = Parts(cfg, self.reads, self.indexer, self.engines, self.vectors,
                           self.embedding, self.buffers, searcher, request_stop=self.stop,
                           reload=self.reload, backend=self.backend, text=self.text)
        self.ops = Ops(self.parts)
        self.server = self.parts.server = Server(cfg.socket, self.ops.dispatch,
                                                 cfg.max_connections)
        self.watcher: Watcher | None = None
        self._recorded: Path | None = None  # the config file of the run record written

    def _record_run(self) -> None:
        """Say where this daemon listens, for a client whose config file names another socket
        since (protocol.run_record). Not for the built-in defaults: no file to edit."""
        if self.cfg.path is None:
            return
        try:
            protocol.write_run_record(self.cfg.path, self.server.path)
            self._recorded = self.cfg.path
        except OSError as e:  # (the daemon serves without it: clients read the config)
            log.warning("cannot write the run record of %s: %s", self.cfg.path, e)

    def run(self, background: bool) -> int:
        cfg = self.cfg
        t0 = time.monotonic()
        log.info("ragd %s starting (pid %d, data dir %s, config %s)", __version__, os.getpid(),
                 cfg.data_dir, cfg.path or "built-in defaults")
        db = store.open_store(cfg.db_path, protocol.upgrading_path(cfg.socket))
        try:
            (milvus.install if self.backend is not None else milvus.uninstall)(db)
            (textindex.install if self.text is not None else textindex.uninstall)(db)
        finally:
            db.close()
        # Queued before the socket opens: a client that sees the daemon answer never sees it
        # idle with the start-up scan still to come. The indexer starts once the sources are
        # watched, so the scan runs after the watches exist: a note saved at any moment is seen
        # by one or the other (one saved between a scan and its watch would wait for the next
        # periodic scan).
        self._forget_unconfigured()
        self._restore_removed([s.name for s in cfg.sources])
        self.indexer.request_scan()
        self._read_again_if_changed()
        try:
            self.server.start()
            self._record_run()
            self.engines.start()
            if background:
                _redirect_output(cfg.log_path)
            if not cfg.sources:
                log.warning("no sources configured: add one with 'ragctl sources add PATH', "
                            "or [[sources]] in %s", cfg.path or "a config file")
            if cfg.watch:
                self.watcher = self.parts.watcher = Watcher(
                    cfg.sources, self.indexer, cfg.watch_quiet_ms / 1000, cfg.scan_interval,
                    cfg.unwatched_scan_interval)
                self.watcher.start()
            self.indexer.start()
            self.buffers.start()
            if self.backend is not None:
                self.backend.start()
            if self.text is not None:
                self.text.start()
            log.info("ready in %.3fs; indexing %d source(s) in the background",
                     time.monotonic() - t0, len(cfg.sources))
            for overlap in cfg.overlaps:
                log.warning("%s", overlap)
            self._schedule_gc(first=60.0)
            # A signal may be taken by any thread; Python runs its handler on the main thread
            # only once that thread runs bytecode again, and this one sleeps in os.read: a
            # SIGTERM that landed on the accept thread left the daemon asleep for good. The
            # C-level handler writes the signal's number to
            # the pipe from whichever thread took it: the read returns, the handler runs here
            # and writes its b"s" or b"r", which the next read gets.
            if threading.current_thread() is threading.main_thread():
                signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
            while True:  # signals and the stop op write to the pipe; nothing polls
                asked = os.read(self._wake_r, 512)
                if b"s" in asked:
                    break
                if b"r" not in asked:  # a signal's number: its handler writes next
                    continue
                try:
                    self.ops.reload_config()
                except config.ReloadError:  # logged, and shown in status
                    pass
            log.info("stopping")
        finally:
            self._stop_parts()
            self.reads.close()
            # (the number first: a late signal must not write to a file that reuses it)
            if threading.current_thread() is threading.main_thread():
                signal.set_wakeup_fd(-1)
            w, self._wake_w = self._wake_w, -1
            os.close(w)
            os.close(self._wake_r)
            log.info("stopped")
        return 0

    def _stop_parts(self) -> None:
        """Stop every part within STOP_WITHIN seconds. Each is told at once, in a thread of its
        own, and waited for until the deadline: one after the other, a part busy with a long
        step (the text index filling a batch, an embedding batch in flight, an engine's
        SIGTERM grace) held up every part after it. The engines stop alongside: a call in
        flight to one (a batch to embed, a live edit's texts) then fails at once, and the
        embedder gives its texts back and leaves (writing its space's snapshot). A part still
        busy at the deadline is left to the process's exit: what it had in hand is not lost,
        its transaction rolls back, and the next start finds the work again (the indexer
        rescans, the text index's outbox and fill are in SQLite, the embedder's queue is every
        text without a vector)."""
        deadline = time.monotonic() + STOP_WITHIN
        self.parts.stopping.set()
        self.server.close()
        if self._recorded is not None:
            protocol.drop_run_record(self._recorded)
        parts = [("watcher", self.watcher.stop if self.watcher is not None else None),
                 ("indexer", self.indexer.stop), ("buffers", self.buffers.stop),
                 ("store", self.backend.stop if self.backend is not None else None),
                 ("text index", self.text.stop if self.text is not None else None),
                 ("embedders", self.embedding.stop), ("engines", self.engines.stop)]

        took: dict[str, float] = {}

        def stop(name, fn):
            t0 = time.monotonic()
            try:
                fn()
            except Exception:
                log.exception("stopping the %s", name)
            took[name] = time.monotonic() - t0

        threads = []
        for name, fn in parts:
            if fn is not None:
                threads.append((name, threading.Thread(target=stop, args=(name, fn),
                                                       name=f"stop-{name}", daemon=True)))
                threads[-1][1].start()
        for _, t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        late = [name for name, t in threads if t.is_alive()]
        slow = sorted(took.items(), key=lambda kv: -kv[1])[:3]
        log.info("parts stopped in %.2fs (slowest: %s)", time.monotonic() - deadline
                 + STOP_WITHIN, ", ".join(f"{n} {t:.2f}s" for n, t in slow))
        if late:
            log.warning("the %s did not stop within %.0f s; left to the exit (their work is "
                        "found again at the next start)", ", ".join(late), STOP_WITHIN)
            self.engines.kill_now()  # no engine outlives ragd

    def _wake(self, what: bytes) -> None:
        if self._wake_w < 0:  # stopped
            return
        try:
            os.write(self._wake_w, what)
        except BlockingIOError:  # the pipe is full of asks already: this one adds nothing new
            pass
        except OSError:  # closed just now: the daemon has stopped
            pass

    def stop(self) -> None:
        """Ask the main loop to stop (safe in a signal handler: a write to a pipe, no lock)."""
        self._wake(b"s")

    def request_reload(self) -> None:
        """Ask the main loop to reload the config (SIGHUP; safe in a signal handler)."""
        self._wake(b"r")

    def _on_embedding(self, model) -> None:
        """The configured embedding model is ready (engines-setup thread): it serves — or, a
        switch under way, the model in use serves and this one is built beside it."""
        self.embedding.start(model)

    def _new_model(self, cfg, new):
        """The configured embedding model changed while one is in use: can the file's be used?
        Returns (the resolved model or None, why it cannot be used or None). A model that
        cannot be used (no such file or registry name, a download failing) is not taken: the
        config in force keeps the model in use, and a reload tries the file's again."""
        if not new.embedding_model:
            return None, None
        try:
            return self.engines.resolve_embedding(
                new.embedding_model, new.embedding_pooling, new.embedding_query_prefix,
                new.embedding_doc_prefix), None
        except Exception as e:
            log.warning("the embedding model %r cannot be used (%s): %r stays",
                        new.embedding_model, e, cfg.embedding_model)
            return None, str(e)

    @staticmethod
    def _next_start_problems(cfg, new) -> list[str]:
        """Why a reranker or generator model the file now names cannot serve (no such file,
        not that kind of model): said at the reload, not found at the next start."""
        out = []
        for role in ("reranker", "generator"):
            value = getattr(new, f"{role}_model")
            spec = models.REGISTRY.get(value)
            if not value or value == getattr(cfg, f"{role}_model") or (
                    spec is not None and spec.pypi is not None and spec.role == role):
                continue  # (a model from PyPI is obtained at the start)
            try:
                models.resolve(value, role, cfg.data_dir, fetch=False)
            except models.ModelError as e:
                out.append(f"{role}.model: {e}")
            except Exception as e:  # (a checker's failure is no reason to fail the reload)
                log.debug("checking %s.model %r: %s", role, value, e)
        return out

    def _holders(self) -> list:
        """Every long-lived part that reads the config: the runtime, the parts the ops read
        (Parts) and each part the runtime or Parts holds that has a `cfg` (engines, embedding,
        indexer, buffers, searcher); found, not listed, so a new part is not missed."""
        found = {id(self): self, id(self.parts): self.parts}
        for part in [*vars(self).values(), *vars(self.parts).values()]:
            if isinstance(getattr(part, "cfg", None), config.Config):
                found.setdefault(id(part), part)
        return list(found.values())

    def _swap(self, cfg) -> None:
        """The config in force is now `cfg` (under the reload lock). Each holder's is replaced
        whole, never changed in place: a request reads one config or the other, each
        consistent (one that needs several settings together takes `cfg` once)."""
        for part in self._holders():
            part.cfg = cfg

    # -- reloading --------------------------------------------------------------------------------

    def reload(self) -> dict:
        """Read the config again and apply it. Raises ReloadError when it cannot be read (the
        daemon goes on with the config it has)."""
        with self._reload_lock:
            try:
                new = config.load(self.cli_config, extra_sources=self.cli_sources)
            except config.ConfigError as e:
                raise config.ReloadError(str(e)) from None
            cfg = self.cfg
            if cfg.sources and not new.sources and not new.sources_listed:
                # An editor's save cut short, a file emptied: taken at its word, it would
                # remove every source. An empty list said outright is taken.
                raise config.ReloadError(
                    f"{new.path or 'the config'} names no source at all, which would remove "
                    f"every source ({', '.join(s.name for s in cfg.sources)}); if that is "
                    f"what you mean, say so with a line 'sources = []' before its first "
                    f"table")
            restart = sorted(key for field, key in RESTART.items()
                             if getattr(cfg, field) != getattr(new, field))
            model_changed = any(getattr(cfg, f) != getattr(new, f) for f in MODEL_FIELDS)
            if model_changed and not cfg.embedding_model:
                restart.append("embedding.model")  # dense search was off: a restart starts it
            rechunk = (cfg.chunk_tokens, cfg.chunk_overlap) != (new.chunk_tokens,
                                                                 new.chunk_overlap)
            old = {s.name: s for s in cfg.sources}
            now = {s.name: s for s in new.sources}
            removed = [n for n in old if n not in now]
            added = [n for n in now if n not in old]
            # a source whose folder moved: its files are listed again there (a file found
            # unchanged at the same relative path is kept, vectors and all)
            moved = [n for n in now if n in old and old[n].root != now[n].root]
            changed = [n for n in now if n in old and n not in moved and old[n] != now[n]]
            # a name changed, the folder the same: purged and listed again under the new name
            # (its vectors come from the cache), but said as what it is
            renamed = [[o, n] for o in removed for n in added if old[o].root == now[n].root]
            missing = [n for n in added + moved if not now[n].root.is_dir()]
            applied = [key for f, key in LIVE.items() if getattr(cfg, f) != getattr(new, f)]
            # the config in force: the file's live settings and sources, the restart settings
            # as they were started with (the reply names those that differ)
            take = {f: getattr(new, f) for f in LIVE}
            switch = model_changed and bool(cfg.embedding_model)
            model = model_error = None
            if switch:
                model, model_error = self._new_model(cfg, new)
                if model_error is None:
                    take.update({f: getattr(new, f) for f in MODEL_FIELDS})
            said = set(cfg.overlaps)
            cfg = dataclasses.replace(cfg, **take, path=new.path, sources=new.sources,
                                      sources_listed=new.sources_listed)
            self._swap(cfg)
            model_note = None
            if model_error is not None:
                model_note = (f"the new embedding model cannot be used ({model_error}); the one "
                              f"in use stays")
            elif switch and not cfg.embedding_model:
                model_note = "embedding.model is now empty: a restart turns dense search off"
            elif switch:
                model_note = self.embedding.change(model, cfg.embedding_model)
            elif cfg.embedding_model and "embedding" in self.engines.errors \
                    and self.embedding.active is None:
                # its preparation failed (no network, no file yet): a reload tries it again
                model_note = self.engines.prepare_embedding()
            overlaps = [o for o in cfg.overlaps if o not in said]
            for overlap in overlaps:
                log.warning("%s", overlap)
            logging.getLogger("ragd").setLevel(cfg.log_level.upper())
            if self.watcher is not None:
                self.watcher.quiet = cfg.watch_quiet_ms / 1000
                self.watcher.scan_interval = cfg.scan_interval
                self.watcher.unwatched_scan_interval = cfg.unwatched_scan_interval
                for name in removed + moved + changed:
                    self.watcher.remove_source(name)
                for name in added + moved + changed:
                    self.watcher.add_source(now[name])
            if removed:
                self._forget_unconfigured()
            restored = self._restore_removed(added)
            for name in added + moved:  # (moved with its kind or rules changed: read again)
                self.indexer.request_scan(name, force=name in moved and dataclasses.replace(
                    old[name], root=now[name].root) != now[name])
            for name in changed:  # rules or kind changed: read every file again
                self.indexer.request_scan(name, force=True)
            if rechunk:
                self.indexer.request_scan(force=True)
            self.indexer.when_idle(functools.partial(store.save_reading, sources=self._reading()))
            retried = self.engines.retry_failed()  # whatever failed them may be fixed now
            result = {"config": str(cfg.path) if cfg.path else None, "added": added,
                      "removed": removed, "moved": moved, "changed": changed,
                      "renamed": renamed, "missing": missing, "rechunk": rechunk,
                      "applied": applied, "restart_needed": restart, "embedding": model_note,
                      "engines_retried": retried, "restored": restored,
                      "overlaps": overlaps}
            if model_error:
                result["embedding_error"] = model_error
            if (problems := self._next_start_problems(cfg, new)):
                result["next_start"] = problems
            log.info("reloaded %s: sources added %s, removed %s, moved %s, changed %s%s%s%s",
                     cfg.path or "built-in defaults", ", ".join(added) or "none",
                     ", ".join(removed) or "none", ", ".join(moved) or "none",
                     ", ".join(changed) or "none",
                     f"; applied {', '.join(applied)}" if applied else "",
                     "; re-chunking every file" if rechunk else "",
                     f"; a restart is needed for {', '.join(restart)}" if restart else "")
            return result

    def _reading(self) -> dict:
        """What decides how a source's files become chunks, per source: the chunking of the
        config, the source's kind and rules, and the parser's version."""
        cfg = self.cfg
        return {s.name: {"chunk_tokens": cfg.chunk_tokens, "chunk_overlap": cfg.chunk_overlap,
                         "kind": s.kind, "include": list(s.include), "exclude": list(s.exclude),
                         "parser": loader.PARSER}
                for s in cfg.sources}

    def _read_again_if_changed(self) -> None:
        """A source read with another chunking, kind or rules than the config's now (changed
        while ragd was stopped) is read again in full, as a reload does; what it is read with
        is recorded once the queue is empty, so a start cut short reads it again."""
        now = self._reading()
        with self.reads.conn() as db:
            before = store.reading(db)
        for name, how in now.items():
            old = before.get(name)
            if isinstance(old, dict) and old != how:
                what = ", ".join(k for k in how if old.get(k) != how[k])
                log.info("source %s: %s changed since it was read: reading every file again",
                         name, what)
                self.indexer.request_scan(name, force=True)
        if now != before:
            self.indexer.when_idle(functools.partial(store.save_reading, sources=now))

    def _forget_unconfigured(self) -> None:
        """Rows of sources the config no longer names are hidden at once and purged."""
        keep = {s.name for s in self.cfg.sources}
        with self.reads.conn() as db:
            present = {r[0] for r in db.execute("SELECT source FROM counts WHERE n > 0")}
        if present - keep:
            self.indexer.unconfigured = present - keep
            self.indexer.purge()

    def _restore_removed(self, names: list[str]) -> list[str]:
        """Of these configured sources, those set aside when they were removed (within the GC
        grace period) are restored, before their scan (a job of the indexer runs first). When
        they are read with other rules or chunking now, their scan reads every file again.
        Returns their names."""
        with self.reads.conn() as db:
            waiting = store.removed_sources(db)
        back = [n for n in names if n in waiting]
        if back:
            self.indexer.restore(back)
            now = self._reading()
            for name in back:
                if waiting[name]["reading"] not in (None, now.get(name)):
                    self.indexer.request_scan(name, force=True)
        return back

    def _schedule_gc(self, first: float) -> None:
        """Sweep the embedding cache every [gc] interval_hours, as a job of the indexer (the
        index's writer)."""
        indexer = self.indexer

        def sweep(db) -> None:
            cfg = self.cfg  # read at each sweep: a reload may have swapped it
            try:
                res = gc.sweep(db, cfg.gc_grace_hours * 3600)
                if res.deleted or res.marked:
                    # deleting is news; marking what recent edits left unused is routine
                    log.log(logging.INFO if res.deleted else logging.DEBUG,
                            "gc: %d cache entries deleted (%d bytes), %d newly unused, %d "
                            "waiting out the grace period", res.deleted, res.bytes_freed,
                            res.marked, res.waiting)
                if res.purged_files:
                    log.info("gc: %d files of sources removed over %.0f h ago deleted",
                             res.purged_files, cfg.gc_grace_hours)
            except Exception:
                log.exception("gc sweep failed")
            finally:
                indexer.call_later(cfg.gc_interval_hours * 3600, lambda: indexer.run_job(sweep))

        indexer.call_later(first, lambda: indexer.run_job(sweep))


def _redirect_output(log_path) -> None:
    """From here on, stray output (a thread's traceback) lands in the log, not in the pipe of
    the ragctl that started us."""
    with open(log_path, "ab") as f:
        os.dup2(f.fileno(), 2)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.close(devnull)

