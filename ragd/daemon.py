"""``ragd``: the daemon's entry point — configuration, the data-dir lock, logging, start-up
and clean shutdown of the indexer and the socket server."""

from __future__ import annotations

import argparse
import errno
import fcntl
import logging
import logging.handlers
import os
import signal
import sys
import threading
import time

from ragd import __version__, config
from ragd.engines.manager import Engines
from ragd.events import EventBus
from ragd.index import gc, store
from ragd.index.indexer import Indexer
from ragd.ingest.watcher import Watcher
from ragd.ops import Ops
from ragd.server import Server

log = logging.getLogger("ragd")


class AlreadyRunning(Exception):
    pass


def acquire_lock(cfg: config.Config):
    """One daemon per data dir: an exclusive flock on data_dir/ragd.lock, holding our pid.

    The kernel drops the lock when the process dies, however it dies, so a stale lock file
    never blocks a new daemon.
    """
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(cfg.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise AlreadyRunning(f"ragd is already running (pid {pid}) on data dir {cfg.data_dir}; "
                             f"stop it with 'ragctl stop' first") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def setup_logging(cfg: config.Config, to_stderr: bool) -> None:
    root = logging.getLogger("ragd")
    root.setLevel(cfg.log_level.upper())
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler = logging.handlers.RotatingFileHandler(cfg.log_path, maxBytes=10 << 20,
                                                   backupCount=3)
    handler.setFormatter(fmt)
    root.addHandler(handler)
    if to_stderr:
        err = logging.StreamHandler(sys.stderr)
        err.setFormatter(fmt)
        root.addHandler(err)


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="ragd", description="The ragd retrieval daemon (runs in "
                                 "the foreground; 'ragctl start' runs it in the background).")
    ap.add_argument("--config", metavar="PATH", help="config file (default: $RAGD_CONFIG, "
                    "else $XDG_CONFIG_HOME/ragd/config.toml, else built-in defaults)")
    ap.add_argument("--source", metavar="PATH", action="append", default=[],
                    help="also index this folder (kind detected: obsidian if it has .obsidian/)")
    ap.add_argument("--background", action="store_true",
                    help="log to the log file only (used by 'ragctl start')")
    ap.add_argument("--version", action="version", version=f"ragd {__version__}")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        cfg = config.load(args.config, extra_sources=args.source)
    except config.ConfigError as e:
        print(f"ragd: config error: {e}", file=sys.stderr)
        return 2
    try:
        lock_fd = acquire_lock(cfg)
    except AlreadyRunning as e:
        print(f"ragd: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"ragd: cannot use data dir {cfg.data_dir}: {e}", file=sys.stderr)
        return 1
    setup_logging(cfg, to_stderr=not args.background)
    try:
        return run(cfg, args.background)
    except (store.StoreError, RuntimeError, OSError) as e:
        log.error("%s", e)
        if args.background:
            print(f"ragd: {e}", file=sys.stderr)
        return 1
    finally:
        os.close(lock_fd)


def schedule_gc(indexer: Indexer, cfg: config.Config, first: float) -> None:
    """Sweep the embedding cache every [gc] interval_hours, as a job of the indexer (the
    index's writer)."""
    def sweep(db) -> None:
        try:
            res = gc.sweep(db, cfg.gc_grace_hours * 3600)
            if res.deleted or res.marked:
                log.info("gc: %d cache entries deleted (%d bytes), %d newly unused, %d waiting "
                         "out the grace period", res.deleted, res.bytes_freed, res.marked,
                         res.waiting)
        except Exception:
            log.exception("gc sweep failed")
        finally:
            indexer.call_later(cfg.gc_interval_hours * 3600, lambda: indexer.run_job(sweep))

    indexer.call_later(first, lambda: indexer.run_job(sweep))


def run(cfg: config.Config, background: bool) -> int:
    t0 = time.monotonic()
    log.info("ragd %s starting (pid %d, data dir %s, config %s)", __version__, os.getpid(),
             cfg.data_dir, cfg.path or "built-in defaults")
    db = store.open_store(cfg.db_path)
    db.close()

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: stop.set())
    if hasattr(signal, "SIGXFSZ"):  # a file size limit is a write error to handle, not death
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    engines = Engines(cfg)
    indexer = Indexer(cfg, cfg.db_path, listener=engines, events=EventBus())
    ops = Ops(cfg, indexer, engines, request_stop=stop.set)
    server = Server(cfg.socket, ops.dispatch, cfg.max_connections)
    # Queued before the socket opens: a client that sees the daemon answer never sees it idle
    # with the start-up scan still to come. The indexer starts once the sources are watched, so
    # the scan runs after the watches exist: a note saved at any moment is seen by one or the
    # other (a note saved between a scan and its watch would wait for the next periodic scan).
    indexer.request_scan()
    try:
        server.start()
        engines.start()
        if background:
            # From here on, stray output (a thread's traceback) lands in the log, not in the
            # pipe of the ragctl that started us.
            with open(cfg.log_path, "ab") as f:
                os.dup2(f.fileno(), 2)
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 1)
            os.close(devnull)
        if not cfg.sources:
            log.warning("no sources configured: add [[sources]] to %s, or pass --source PATH",
                        cfg.path or "a config file")
        if cfg.watch:
            ops.watcher = Watcher(cfg.sources, indexer, cfg.watch_quiet_ms / 1000,
                                  cfg.scan_interval, cfg.unwatched_scan_interval)
            ops.watcher.start()
        indexer.start()
        log.info("ready in %.3fs; indexing %d source(s) in the background",
                 time.monotonic() - t0, len(cfg.sources))
        schedule_gc(indexer, cfg, first=60.0)
        stop.wait()  # signals and `ragctl stop` set it; nothing polls
        log.info("stopping")
    finally:
        ops.stopping.set()
        server.close()
        if ops.watcher is not None:
            ops.watcher.stop()
        indexer.stop()
        engines.stop()
        ops.reads.close()
        log.info("stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
