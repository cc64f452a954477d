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

# numpy's BLAS on one thread, set before numpy is loaded: its worker threads spin for about a
# tenth of a second after each product (a search's matrix-vector product of the vectors), and
# with the query engine's threads on every core that spin held up the next query's embedding
# (7 ms became 100 ms). One thread does a 10k-vector product in well under a millisecond.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from ragd import __version__, config, server  # noqa: E402
from ragd.index import store  # noqa: E402
from ragd.runtime import Runtime  # noqa: E402

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


# What ragd keeps in its data dir that holds the notes' text, their names or the queries: the
# index and its WAL, the tantivy index, the vectors, the logs. (Not the models: public files.)
PRIVATE_FILES = ("index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm",
                 "index.sqlite3-journal", "ragd.log", "ragd.log.1", "ragd.log.2", "ragd.log.3",
                 "ragd.lock", "milvus.db")
PRIVATE_DIRS = ("bm25", "vectors", "engines")


def keep_private(cfg: config.Config) -> str | None:
    """Make what ragd wrote in its data dir readable by its user alone: the daemon's umask 077
    creates files 0600, and those an older ragd created under another umask are tightened
    here. The data dir itself is the user's to choose: when others may enter it, the warning
    to give, else None."""
    def tighten(path: str) -> None:
        try:
            st = os.lstat(path)
            if st.st_mode & 0o077 and st.st_uid == os.getuid() and not os.path.islink(path):
                os.chmod(path, st.st_mode & 0o7700)
        except OSError:
            pass  # gone meanwhile, or not ours: what it holds is not ragd's to change

    top = str(cfg.data_dir)
    for name in PRIVATE_FILES:
        tighten(os.path.join(top, name))
    for name in PRIVATE_DIRS:
        for folder, dirs, files in os.walk(os.path.join(top, name)):
            tighten(folder)
            for f in files:
                tighten(os.path.join(folder, f))
    return open_warning(top)


def open_warning(top: str) -> str | None:
    """The warning to give while the data dir lets other users in, else None (asked again by
    each status: a 'chmod 700' ends it at once)."""
    try:
        mode = os.stat(top).st_mode
    except OSError:
        return None
    if mode & 0o077:
        return (f"the data dir {top} is open to other users (mode {mode & 0o777:o}): they can "
                f"see which files it holds (ragd's own are private); 'chmod 700 {top}' closes "
                f"it")
    return None


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
    # Every file and folder the daemon creates is its user's alone (the index holds the notes'
    # text): whatever the umask of the shell or service manager that started it.
    os.umask(0o077)
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
    open_dir = keep_private(cfg)  # (before the log is opened: an old one is tightened too)
    setup_logging(cfg, to_stderr=not args.background)
    try:
        rt = Runtime(cfg, args.config, args.source)
        if open_dir:
            log.warning("%s", open_dir)
            top = str(cfg.data_dir)
            rt.parts.notices.append(lambda: open_warning(top))
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
