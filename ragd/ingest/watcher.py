"""Watching sources (watchdog: inotify on Linux): the observer and its watches, and the
checker (``watch-checker``) that finds where watching went astray. The events heard are
coalesced and handed to the indexer by changes.py (``Changes``, the flusher). When the watcher
cannot follow (the queue overflows, or inotify runs out of watches) it falls back to a
reconciliation scan of the source, and a periodic scan (``watch.scan_interval``) catches
whatever was missed anyway.

Three ways inotify loses events, and what is done about each:

* the kernel's event queue overflows (``fs.inotify.max_queued_events``): watchdog re-adds its
  watches and logs a warning but tells no handler, so a logging handler listens for that warning
  and every source is reconciled with a scan;
* a storm (a ``git checkout``, a sync tool dumping a folder) races folder creation against watch
  creation: once a burst of at least ``STORM_PATHS`` changed paths has settled, its source is
  reconciled with a scan (which reads only files whose size or mtime differ from the index;
  changes.py counts the bursts);
* the watch limit (``fs.inotify.max_user_watches``) is reached: watchdog skips the folders it
  cannot watch without a word, so the watcher compares the folders of each source with the
  watches its process holds (``/proc/self/fdinfo``); a source not fully watched is reported with
  the sysctl to raise and is scanned every ``watch.unwatched_scan_interval`` seconds instead;
  once its folders can be watched again (the limit was raised), it is watched afresh.

And one way the watch itself goes astray: a source's folder moved away (renamed, its disk
unmounted) takes its inotify watch along, with events under the old path, and watchdog says
nothing. Every second each source's folder is looked up (one stat): gone, the source is
unwatched and reported, its files kept; back, it is watched afresh and scanned.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
import warnings

from watchdog.events import (DirCreatedEvent, DirDeletedEvent, DirMovedEvent, FileAttribEvent,
                             FileClosedEvent, FileCreatedEvent, FileDeletedEvent, FileModifiedEvent,
                             FileMovedEvent, FileSystemEvent, FileSystemEventHandler)
from watchdog.observers import Observer

from ragd.config import Source
from ragd.ingest import inotify
from ragd.ingest.changes import Changes
from ragd.workers import Worker

log = logging.getLogger("ragd.watcher")

# where watchdog (>= 7.1) reports IN_Q_OVERFLOW
OVERFLOW_LOGGER = "watchdog.observers.inotify_c"
# Each source's folder is looked up this often (a stat): inotify says nothing of a folder
# moved away, and until it is seen gone search shows paths that are not there; one renamed
# and renamed back, a disk unplugged and plugged in, is back within seconds, and the files
# written in it meanwhile are indexed then.
ROOT_LOOK = 1.0
# What is asked of inotify: not opens, reads or closes without a write (ragd's own reading of a
# file would otherwise fill the kernel's queue with events about itself).
WANTED_EVENTS = [FileCreatedEvent, FileModifiedEvent, FileAttribEvent, FileClosedEvent,
                 FileDeletedEvent, FileMovedEvent, DirCreatedEvent, DirDeletedEvent, DirMovedEvent]
INOTIFY_HINT = ("raise the inotify watch limit, e.g. `sudo sysctl fs.inotify.max_user_watches="
                "524288` (and add it to /etc/sysctl.conf)")


class _Handler(FileSystemEventHandler):
    def __init__(self, changes: Changes, source: Source):
        self.changes = changes
        self.source = source

    def dispatch(self, event: FileSystemEvent) -> None:
        try:
            self.changes.on_event(self.source, event)
        except Exception:  # an odd event must not stop the observer thread
            log.exception("watch event %r", event)


class _OverflowSpy(logging.Handler):
    """watchdog repairs its watches after an inotify queue overflow and logs a warning, but
    dispatches nothing to event handlers: hear the warning, and reconcile."""

    def __init__(self, watcher: "Watcher"):
        super().__init__(logging.WARNING)
        self.watcher = watcher

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if "overflow" in record.getMessage().lower():
                self.watcher.overflowed()
        except Exception:
            log.exception("handling an inotify queue overflow")


class Watcher:
    """Two threads of its own besides watchdog's: the flusher (``self.changes``: events
    coalesced per path, handed to the indexer once quiet) and the checker (the inotify
    bookkeeping: are all folders watched; the periodic reconciliation scans). Both sleep until
    something is due."""

    def __init__(self, sources: list[Source], indexer, quiet: float = 0.25,
                 scan_interval: float = 600.0, unwatched_scan_interval: float = 30.0):
        self.sources = sources
        self.indexer = indexer
        self.scan_interval = scan_interval
        self.unwatched_scan_interval = unwatched_scan_interval
        self.observer = Observer()
        self.errors: dict[str, str] = {}  # source -> why it is not (fully) watched
        self.overflows = 0  # inotify queue overflows seen (each followed by a scan)
        self._overflow_said = -1e9
        self._limited: set[str] = set()  # sources missing watches (the limit): scanned often
        self._watches: dict = {}  # source -> watchdog's ObservedWatch
        self._strays: set[str] = set()  # sources last found with watchable folders unwatched
        # each watched source's folder as it was when watched (st_dev, st_ino): a folder moved
        # away takes its inotify watch along, silently (see _check_roots)
        self._roots: dict[str, tuple[int, int]] = {}
        self._gone: set[str] = set()  # sources whose folder is gone: watched when it is back
        self._spy = _OverflowSpy(self)
        # The checker's schedule, under _check_cv.
        self._check_cv = threading.Condition()
        self._check_at: float | None = time.monotonic()  # compare folders and watches next
        self._roots_now = False  # an event came from a source whose folder is not there
        self._stop = threading.Event()
        self.changes = Changes(sources, indexer, quiet, recheck=self._check_in,
                               flushed=self._roots_gone)
        self.checker = Worker("watch-checker", self._check_loop)

    def start(self) -> None:
        logging.getLogger(OVERFLOW_LOGGER).addHandler(self._spy)
        # A folder moved back where it was (out of a source and back, renamed and back) keeps
        # its inode, so inotify gives its old watch again, and watchdog (7.x) warns that it
        # replaces the callback it had there by the same one: a RuntimeWarning of the whole
        # watch table (~9 KB) on stderr, which is the daemon's log. Nothing is wrong; the
        # events follow. (Set when watching starts: importing this module changes nothing.)
        warnings.filterwarnings("ignore", message=r"Callback with id '.*' already exists for "
                                r"watch", category=RuntimeWarning)
        self.observer.start()  # before any watch, so that a source that cannot be watched
        for s in self.sources:  # fails alone, at its own schedule()
            self._watch(s)
        self.changes.start()
        self.checker.start()

    def _watch(self, s: Source) -> None:
        """Watch a source; say why not when it cannot be."""
        try:
            self._schedule(s)
        except FileNotFoundError:
            self._lost(s)
        except OSError as e:
            if not os.path.isdir(s.root):
                self._lost(s)
            else:
                self._unwatched(s, e)

    def _lost(self, s: Source) -> None:
        """The source's folder is not there: reported, its indexed files kept, and watched
        once it exists (_check_roots)."""
        self._gone.add(s.name)
        self._roots.pop(s.name, None)
        why = (f"its folder {s.root} is not there (moved, deleted, not mounted, or mistyped): "
               f"its indexed files are kept, and it is watched once the folder exists "
               f"(looked for every {ROOT_LOOK:g} s)")
        if self.errors.get(s.name) != why:
            self.errors[s.name] = why
            log.warning("source %s: %s", s.name, why)

    def _schedule(self, s: Source) -> None:
        st = os.stat(s.root)
        self._watches[s.name] = self.observer.schedule(
            _Handler(self.changes, s), str(s.root), recursive=True, event_filter=WANTED_EVENTS)
        self._roots[s.name] = (st.st_dev, st.st_ino)

    def _check_roots(self) -> None:
        """Each source's folder still where it was? inotify follows a folder moved away (its
        events keep the old path) and watchdog says nothing of it; a folder deleted ends its
        watch. Gone: the source is unwatched and reported, its files kept (the indexer's scan
        says so). Back, or another folder in its place: it is watched afresh and scanned."""
        for s in list(self.sources):
            try:
                st = os.stat(s.root)
                here = (st.st_dev, st.st_ino) if os.path.isdir(s.root) else None
            except OSError:
                here = None
            if s.name in self._gone:
                if here is not None:
                    self._gone.discard(s.name)
                    if not self._rewatch(s, f"its folder {s.root} is there"):  # (logged)
                        self.errors[s.name] = (f"cannot watch {s.root} (see the log); the "
                                               f"source is scanned every "
                                               f"{self.unwatched_scan_interval:g} s instead")
                continue
            was = self._roots.get(s.name)
            if was is None or here == was:
                continue  # (not watched for another reason: the checks above handle it)
            if here is not None:  # another folder at its path (re-cloned, restored)
                self._rewatch(s, f"another folder is at {s.root}")
                continue
            watch = self._watches.pop(s.name, None)
            if watch is not None:
                with contextlib.suppress(KeyError, OSError, RuntimeError):
                    self.observer.unschedule(watch)
            self._lost(s)
            self.indexer.request_scan(s.name)

    def _rewatch(self, s: Source, why: str = "its folders can be watched now") -> bool:
        """Watch a source afresh (watchdog does not retry a folder it once failed to watch):
        after the watch limit was raised. What happened meanwhile is caught by a scan."""
        old = self._watches.pop(s.name, None)
        try:
            if old is not None:
                self.observer.unschedule(old)
            self._schedule(s)
        except (OSError, KeyError) as e:
            log.warning("source %s: watching again failed: %s", s.name, e)
            return False
        self._limited.discard(s.name)
        self.errors.pop(s.name, None)
        self._strays.discard(s.name)
        log.info("source %s: %s; watching it afresh", s.name, why)
        self.indexer.request_scan(s.name)
        self._check_in(2.0)
        return True

    def add_source(self, s: Source) -> None:
        """Watch a source added by a reload (or changed: removed first)."""
        self.sources = [x for x in self.sources if x.name != s.name] + [s]
        self.changes.add_source(s)
        self._watch(s)
        self._check_in(2.0)

    def remove_source(self, name: str) -> None:
        """Stop watching a source a reload removed; what waited for it is dropped."""
        self.sources = [x for x in self.sources if x.name != name]
        self.changes.remove_source(name)  # its events ignored from now on, its queue dropped
        watch = self._watches.pop(name, None)
        if watch is not None:
            try:
                self.observer.unschedule(watch)
            except (KeyError, OSError, RuntimeError) as e:
                log.debug("unwatching %s: %s", name, e)
        self.errors.pop(name, None)
        self._limited.discard(name)
        self._strays.discard(name)
        self._roots.pop(name, None)
        self._gone.discard(name)

    def _unwatched(self, s: Source, e: OSError) -> None:
        scans = f"the source is scanned every {self.unwatched_scan_interval:g} s instead"
        if e.errno == errno.ENOSPC:
            why = (f"inotify watch limit reached (fs.inotify.max_user_watches = "
                   f"{inotify.watch_limit()}): {INOTIFY_HINT}; {scans}")
            self._limited.add(s.name)  # checked again at its scans, watched once it can be
        else:
            why = f"cannot watch {s.root}: {e}; {scans}"
        self.errors[s.name] = why
        log.warning("source %s: %s", s.name, why)

    def stop(self) -> None:
        logging.getLogger(OVERFLOW_LOGGER).removeHandler(self._spy)
        self._stop.set()
        with self._check_cv:
            self._check_cv.notify_all()
        self.changes.stop(5)
        try:
            self.observer.stop()
            self.observer.join(5)
        except RuntimeError:
            pass
        self.checker.stop(5)

    # -- what waits (status, search --wait): the flusher's queues ---------------------------------

    @property
    def quiet(self) -> float:
        return self.changes.quiet

    @quiet.setter
    def quiet(self, seconds: float) -> None:  # (a reload changes it live)
        self.changes.quiet = seconds

    @property
    def last_event(self) -> dict[str, float]:
        return self.changes.last_event

    @property
    def pending(self) -> int:
        return self.changes.pending

    def oldest_pending(self) -> dict[str, float]:
        return self.changes.oldest_pending()

    def wait_heard(self, timeout: float) -> bool:
        return self.changes.wait_heard(timeout)

    def wait_settled(self, timeout: float) -> bool:
        return self.changes.wait_settled(timeout)

    # -- recovery ---------------------------------------------------------------------------------

    def overflowed(self) -> None:
        """The kernel dropped inotify events (any source may have lost some): scan them all."""
        self.overflows += 1
        now = time.monotonic()
        if now >= self._overflow_said + 10:  # one line per 10 s at most, with the count
            self._overflow_said = now
            log.warning("inotify queue overflowed (fs.inotify.max_queued_events; %d time(s) "
                        "so far): events were lost; reconciling every source with a scan",
                        self.overflows)
        events = getattr(self.indexer, "events", None)
        if events is not None:
            events.publish("error", source=None,
                           message="inotify queue overflowed; reconciling with a scan")
        self.indexer.request_scan()

    def _roots_gone(self, names: set) -> None:
        """Events of a source whose folder is not there: inotify follows a folder moved away
        and reports what is done in it under the old path. The check loop looks at the
        sources' folders now, not at its next round: a folder moved away and back between two
        rounds was never seen gone, so nothing scanned it when it came back, and what was
        written in it meanwhile was not indexed."""
        roots = {s.name: s.root for s in self.sources}
        if any(n in roots and not os.path.isdir(roots[n]) for n in names):
            with self._check_cv:
                self._roots_now = True
                self._check_cv.notify_all()

    # -- the checker ------------------------------------------------------------------------------

    def _check_in(self, delay: float) -> None:
        """New folders (or a re-watch): once things settle, see that each got its watch."""
        with self._check_cv:
            at = time.monotonic() + delay
            if self._check_at is None or self._check_at > at:
                self._check_at = at
                self._check_cv.notify_all()

    def _check_loop(self) -> None:
        next_scan = time.monotonic() + self.scan_interval
        next_unwatched = time.monotonic() + self.unwatched_scan_interval
        last_look = time.monotonic()
        while not self._stop.is_set():
            with self._check_cv:
                now = time.monotonic()
                if self._roots_now:  # (_roots_gone)
                    self._roots_now = False
                    next_unwatched = now
                due = [next_scan, next_unwatched, last_look + ROOT_LOOK]
                if self._check_at is not None:
                    due.append(self._check_at)
                if min(due) > now:
                    self._check_cv.wait(min(due) - now)
                    continue
                check = self._check_at is not None and self._check_at <= now
                if check:
                    self._check_at = None  # the next new folder sets a time again
            if now >= next_scan:
                self.indexer.request_scan()
                next_scan = now + self.scan_interval
                check = True
            look_all = now >= next_unwatched
            if look_all or now >= last_look + ROOT_LOOK:
                last_look = now
                self.check_roots()
            if look_all:
                if self.errors:
                    for name in sorted(self.errors):  # not (fully) watched
                        self.indexer.request_scan(name)
                    check = check or bool(self._limited)  # has the limit been raised?
                next_unwatched = now + self.unwatched_scan_interval
            if check:
                self.check_watches()
            if not self.observer.is_alive() and not self._stop.is_set():
                self._restart_observer()

    def _restart_observer(self) -> None:
        """watchdog's observer thread ended (it should not): start a new one and rescan."""
        log.error("the file watching thread ended; starting it again and rescanning")
        self.observer = Observer()
        self._watches.clear()
        self.observer.start()
        for s in self.sources:
            self._watch(s)
        self.indexer.request_scan()

    def check_roots(self) -> None:
        try:
            self._check_roots()
        except Exception:  # a check must never stop the checker
            log.exception("checking the sources' folders")

    def check_watches(self) -> None:
        try:
            self._check_watches()
        except Exception:  # a check must never stop the checker
            log.exception("checking the watches")

    def _check_watches(self) -> None:
        """Compare each source's folders with the watches held: watchdog skips a folder it
        cannot watch without a word. A folder without a watch is tried with a watch of our own:
        if that fails too (the watch limit, a permission), the source is reported and scanned
        often. If it works, the folder may just be new (its watch on the way): look again soon;
        still unwatched then, or a reported source whose folders can now be watched (the limit
        was raised): watch the source afresh."""
        watched = inotify.inotify_watched()
        if watched is None:
            return
        for s in self.sources:
            if s.name in self.errors and s.name not in self._limited:
                continue  # not watched at all; already said why
            folders = inotify.folders(s.root)
            missing = sorted(p for i, p in folders.items() if i not in watched)
            if not missing:
                self._strays.discard(s.name)
                if s.name in self._limited:
                    self._limited.discard(s.name)
                    self.errors.pop(s.name, None)
                    log.info("source %s: every folder is watched again", s.name)
                continue
            failures = [(p, err) for p in missing if (err := inotify.try_watch(p)) is not None]
            if not failures:
                if s.name in self._limited or s.name in self._strays:
                    self._rewatch(s)
                else:
                    self._strays.add(s.name)
                    self._check_in(2.0)
                continue
            path, err = failures[0]
            if err == errno.ENOSPC:
                cause = (f"inotify watch limit reached (fs.inotify.max_user_watches = "
                         f"{inotify.watch_limit()}): {INOTIFY_HINT}")
            else:
                cause = f"cannot watch {path}: {os.strerror(err)}"
            why = (f"{cause}; {len(failures)} of {len(folders)} folders are not watched, "
                   f"e.g. {path}; meanwhile the source is scanned every "
                   f"{self.unwatched_scan_interval:g} s")
            if s.name not in self._limited:
                log.warning("source %s: %s", s.name, why)
            self.errors[s.name] = why
            self._limited.add(s.name)
