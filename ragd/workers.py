"""Long-lived threads, supervised.

Every thread that lives as long as the daemon runs inside a :class:`Worker`: if its loop raises,
the exception is logged with its traceback, recorded (``ragctl status`` shows the thread's
state, its restarts and the error's first line), and the loop is started again after a backoff.
A loop that returns has ended on purpose (the daemon is stopping). docs/threads.md names every
thread, what it owns and which locks it takes.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Callable

log = logging.getLogger("ragd.workers")

BACKOFF_START = 1.0
BACKOFF_MAX = 60.0
STEADY = 60.0  # a loop that ran this long before failing starts its backoff from the bottom

_all: "weakref.WeakValueDictionary[int, Worker]" = weakref.WeakValueDictionary()
_all_lock = threading.Lock()


class Worker:
    def __init__(self, name: str, run: Callable[[], None], *,
                 on_restart: Callable[[], None] | None = None,
                 backoff_start: float = BACKOFF_START, backoff_max: float = BACKOFF_MAX):
        self.name = name
        self.state = "new"
        self.restarts = 0
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self._run = run
        self._on_restart = on_restart
        self._backoff = (backoff_start, backoff_max)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        with _all_lock:
            _all[id(self)] = self

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Mark the worker as stopping (its loop must be told to return by its owner) and wait
        for the thread to end."""
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if not self._thread.is_alive():  # stopped by its owner: no longer one of the daemon's
            with _all_lock:              # threads (a model switch left a list of "stopped")
                _all.pop(id(self), None)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def status(self) -> dict:
        return {"name": self.name, "state": self.state, "restarts": self.restarts,
                "last_error": self.last_error, "last_error_at": self.last_error_at}

    def _main(self) -> None:
        backoff = self._backoff[0]
        while True:
            started = time.monotonic()
            self.state = "running"
            try:
                self._run()
                self.state = "stopped"
                return
            except Exception as e:
                if self._stopping.is_set():
                    self.state = "stopped"
                    return
                self.restarts += 1
                first = (str(e).splitlines() or [""])[0]
                self.last_error = f"{type(e).__name__}: {first}"[:500]
                self.last_error_at = time.time()
                if time.monotonic() - started > STEADY:
                    backoff = self._backoff[0]
                log.exception("the %s thread failed (restart %d in %.0f s)", self.name,
                              self.restarts, backoff)
                self.state = f"restarting (failed: {self.last_error})"
                if self._stopping.wait(backoff):
                    self.state = "stopped"
                    return
                backoff = min(backoff * 2, self._backoff[1])
                if self._on_restart is not None:
                    try:
                        self._on_restart()
                    except Exception:
                        log.exception("the %s thread's restart hook failed", self.name)


def all_status() -> list[dict]:
    """Every live worker's status, by name."""
    with _all_lock:
        workers = list(_all.values())
    return sorted((w.status() for w in workers if w.state != "new"), key=lambda s: s["name"])
