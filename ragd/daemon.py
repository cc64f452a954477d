"""``ragd``: the daemon's entry point — configuration, the data-dir lock, logging, signals
(SIGTERM/SIGINT stop, SIGHUP reloads the config); ragd/runtime.py runs the parts."""

from __future__ import annotations

import argparse
import errno
import fcntl
import logging
import logging.handlers
import os
import signal
import sys

from ragd import __version__, config, server
from ragd.index import store
from ragd.runtime import Runtime

log = logging.getLogger("ragd")


class AlreadyRunning(Exception):
    pass


def acquire_lock(cfg: config.Config):
    """One daemon per data dir: an exclusive flock on data_dir/ragd.lock, holding our pid.

    The kernel drops the lock when the process dies, however it dies, so a stale lock file
    never blocks a new daemon.
    """
    cfg.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
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
    server.limit_malloc_arenas()  # before any thread starts
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
        rt = Runtime(cfg, args.config, args.source)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: rt.stop())
        signal.signal(signal.SIGHUP, lambda signum, frame: rt.request_reload())
        if hasattr(signal, "SIGXFSZ"):  # a file size limit is a write error, not death
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        return rt.run(args.background)
    except (store.StoreError, RuntimeError, OSError) as e:
        log.error("%s", e)
        if args.background:
            print(f"ragd: {e}", file=sys.stderr)
        return 1
    finally:
        os.close(lock_fd)


if __name__ == "__main__":
    raise SystemExit(main())
