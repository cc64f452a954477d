"""Supervision of one llama.cpp server per role (embedding, reranker, generator).

Each engine is a child process: the native ``llama-server`` when the config names one, else the
bundled engine (ragd/engines/bundled.py). Both are started, health-checked and stopped the same
way. A monitor thread per engine:

- removes a stale socket file, starts the process, polls ``/health`` until it answers or the
  start-up deadline passes (no fixed sleeps);
- watches it: a process that exits, or a ``/health`` that fails HUNG_CHECKS times in a row, is
  killed and restarted after an exponential backoff (capped at BACKOFF_MAX);
- after ``max_restarts`` failures within ``restart_window`` seconds the engine is marked
  ``failed``, with the last lines of its log as the reason, and tried again after a longer
  backoff (BACKOFF_MAX doubling up to ``failed_retry``, 5 min by default), or at once when
  asked (``retry``: a reload): left down, it would leave search on BM25 and every new text
  unembedded until ragd was restarted.

No orphans: children run in their own process group, get SIGTERM then SIGKILL on stop, and have
PR_SET_PDEATHSIG set so the kernel kills them if ragd itself dies (even by SIGKILL). Logs go to
``<data_dir>/engines/<role>.log``.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ragd.engines.bundled import PROMPT_CACHE_MIB
from ragd.engines.client import EngineClient
from ragd.engines.models import ResolvedModel
from ragd.workers import Worker

log = logging.getLogger("ragd.engines")

BACKOFF_START = 0.5
BACKOFF_MAX = 30.0
HEALTH_TIMEOUT = 10.0
HUNG_CHECKS = 3
# An engine's log past this size is copied to <role>.log.1 and emptied, at a start or a health
# check: llama.cpp's server logs a few lines per request (705 KB for 6,000 texts embedded, and
# every search adds two), and a daemon left running for months must not fill the disk.
LOG_CAP_BYTES = 4 << 20

# Seconds an engine has to exit after SIGTERM when ragd stops (then SIGKILL): within ragd's
# own bound on a stop (runtime.STOP_WITHIN); an engine has nothing to save
STOP_GRACE = 2.0
STOPPED, STARTING, READY, RESTARTING, FAILED = "stopped", "starting", "ready", "restarting", "failed"


@dataclass(frozen=True)
class EngineSettings:
    llama_server: str = ""  # path of a native binary; "" = the bundled engine
    threads: int = 2
    startup_timeout: float = 60.0
    max_restarts: int = 5
    restart_window: float = 300.0
    # Seconds between /health checks, which only find a hung engine (a dead one is seen at
    # once, on its pidfd). Each check costs the engine ~10 ms of CPU: every 2 s was 0.5% of a
    # core of an idle daemon.
    health_interval: float = 30.0
    # An engine marked failed is tried again after this long at most (the first try sooner:
    # BACKOFF_MAX, doubling): what made it fail (memory, a disk, a killer) often passes.
    failed_retry: float = 300.0
    # Scheduling priority of the process (os.nice): the bulk embedding engine runs at a lower
    # priority than the query engine, so a query's embedding is not slowed by a bulk batch
    # sharing the cores (and bulk loses nothing when no query runs).
    nice: int = 0


def cores(threads: int) -> int:
    """[engines] threads as an engine's thread count: 0 is every core this process may run
    on (its CPU affinity, which a container or taskset narrows)."""
    if threads > 0:
        return threads
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def _child_setup(nice: int):
    def setup() -> None:  # runs in the child between fork and exec
        _set_pdeathsig()
        if nice:
            try:
                os.nice(nice)
            except OSError:
                pass
    return setup


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass  # not Linux: the process group and stop() still clean up


def command(role: str, model: ResolvedModel, sock: Path, settings: EngineSettings) -> list[str]:
    """The engine's command line. For a native llama-server: a Unix socket only (--host PATH
    ending in .sock: no TCP port); a context, batch and micro-batch of the model's context, so
    that one text of up to that many tokens is one micro-batch (an embedding model needs its
    whole input in one); one slot; the pooling search expects; --embedding, or --reranking for
    the reranker (/v1/rerank); no web UI. The generator (chat completions): the context only
    (batches as the server likes), the GGUF's chat template through Jinja, and a small prompt
    cache. Checked against llama.cpp as vendored in llama-cpp-python 0.3.36
    (tests/native_server.py)."""
    ctx = str(model.context)
    if role == "generator":
        if settings.llama_server:
            return [settings.llama_server, "-m", str(model.path), "--host", str(sock),
                    "-c", ctx, "-np", "1", "-t", str(settings.threads), "--jinja",
                    "--cache-ram", str(PROMPT_CACHE_MIB), "--no-webui"]
        return [sys.executable, "-m", "ragd.engines.bundled", "--model", str(model.path),
                "--host", str(sock), "--role", "generator", "--ctx-size", ctx,
                "--threads", str(settings.threads)]
    if settings.llama_server:
        cmd = [settings.llama_server, "-m", str(model.path), "--host", str(sock),
               "-c", ctx, "-b", ctx, "-ub", ctx, "-np", "1", "-t", str(settings.threads),
               "--pooling", model.pooling, "--no-webui"]
        cmd += ["--reranking"] if role == "reranker" else ["--embedding"]
        return cmd
    serves = "reranker" if role == "reranker" else "embedding"  # "query": embeds queries
    return [sys.executable, "-m", "ragd.engines.bundled", "--model", str(model.path),
            "--host", str(sock), "--role", serves, "--pooling", model.pooling, "--ctx-size",
            ctx, "--threads", str(settings.threads)]


# How long llama.cpp's OpenMP threads spin for more work before they sleep (libgomp's
# GOMP_SPINCOUNT; its default, 300,000, left them spinning for ~10 ms of CPU after every
# request). Between the operations of one graph they wait microseconds, well within this; after
# a query's embedding they would take the cores from the search work that follows it. A value
# in ragd's own environment is passed on instead.
OMP_SPIN = 30000


# An engine log's lines that say why it failed (llama.cpp's own words for it)
TELLING = re.compile(r"error|assert|failed|abort|exception|cannot|unable|invalid|unknown "
                     r"model|not supported|unsupported", re.IGNORECASE)


def child_env() -> dict[str, str]:
    """The engine's environment: ragd's own, less what llama.cpp reads as command-line options
    (LLAMA_ARG_*, LLAMA_API_KEY). A user's settings for their own llama-server must not change
    the server ragd runs: LLAMA_API_KEY, for one, makes /health answer while every embedding
    request fails with 401, and a bad LLAMA_ARG_* value aborts the server at start."""
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("LLAMA_ARG_") or k == "LLAMA_API_KEY")}
    env.setdefault("GOMP_SPINCOUNT", str(OMP_SPIN))
    # ggml runs gdb on an abort to print a backtrace: seconds of CPU at each failed start, and
    # a debugger's pages where the reason (the GGML_ASSERT line before them) should be
    env.setdefault("GGML_NO_BACKTRACE", "1")
    return env


class Engine:
    def __init__(self, role: str, model: ResolvedModel, settings: EngineSettings,
                 run_dir: Path, log_dir: Path):
        self.role = role
        self.model = model
        self.settings = settings
        self.socket = run_dir / f"{role}.sock"
        self.log_path = log_dir / f"{role}.log"
        self.client = EngineClient(str(self.socket))
        self.state = STOPPED
        self.reason: str | None = None
        self.restarts = 0
        self.pid: int | None = None
        self.ready_since: float | None = None
        self._proc: subprocess.Popen | None = None
        self._failures: collections.deque[float] = collections.deque()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._retry = threading.Event()  # a failed engine: try again now (reload, stop)
        self.next_try: float | None = None  # when a failed engine is tried again (Unix time)
        self._lock = threading.Lock()
        self._pidfd: int | None = None
        self.worker = Worker(f"engine-{role}", self._monitor,
                             on_restart=lambda: self._kill("its monitor restarted"))
        run_dir.mkdir(parents=True, exist_ok=True)
        log_dir.mkdir(parents=True, exist_ok=True)

    # -- control ---------------------------------------------------------------------------------

    def start(self) -> None:
        self.worker.start()

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def takes_every_core(self) -> bool:
        """Its threads are as many as the cores ragd may run on: work run beside one of its
        requests slows that request by about as much as the work itself."""
        return self.settings.threads >= cores(0)

    def retry(self) -> bool:
        """A failed engine is tried again now (a reload asks); False when it is not failed."""
        if self.state != FAILED:
            return False
        log.info("%s engine: trying the failed engine again now", self.role)
        self._retry.set()
        return True

    def stop(self, grace: float = STOP_GRACE) -> None:
        self._stop.set()
        # not ready from now: a request sent to it while it stops would be lost (its monitor
        # says so only once it sees the process gone)
        self._ready.clear()
        self._retry.set()
        self._kill("stopping", grace)
        self._ready.clear()
        self.worker.stop(grace + 1)
        self.state = STOPPED
        try:  # the engine leaves its socket file behind
            self.socket.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.debug("removing %s: %s", self.socket, e)

    def status(self) -> dict:
        return {"role": self.role, "state": self.state, "reason": self.reason, "pid": self.pid,
                "restarts": self.restarts, "model": self.model.name,
                "model_path": str(self.model.path),
                "engine": self.settings.llama_server or "bundled (xllamacpp)",
                "nice": self.settings.nice, "threads": self.settings.threads,
                "socket": str(self.socket),
                "log": str(self.log_path),
                "next_try": round(self.next_try, 3) if self.state == FAILED and self.next_try
                else None}

    def _cap_log(self) -> None:
        """Keep the engine's log under LOG_CAP_BYTES, as logrotate's copytruncate does: the
        server holds it open for appending, so emptied in place its next line goes at the start
        (a line written between the copy and the emptying is lost; the previous log stays whole
        in <role>.log.1)."""
        try:
            if self.log_path.stat().st_size <= LOG_CAP_BYTES:
                return
            old = self.log_path.with_name(self.log_path.name + ".1")
            tmp = old.with_name(old.name + ".tmp")
            shutil.copyfile(self.log_path, tmp)
            os.replace(tmp, old)  # (whole, for a reader)
            os.truncate(self.log_path, 0)
        except FileNotFoundError:  # no log yet (a first start): nothing to keep small
            return
        except OSError as e:  # (a log that cannot be kept small is no reason to stop)
            log.warning("%s engine: its log %s could not be rotated: %s", self.role,
                        self.log_path, e)

    def tail_log(self, lines: int = 8) -> str:
        """The last start's lines that say what went wrong (errors, failed asserts), else its
        last lines: a model llama.cpp cannot serve aborts after pages of loading notes."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 32768))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        last = text.strip().splitlines()
        for i in range(len(last) - 1, -1, -1):
            if last[i].startswith("--- ") and " starting: " in last[i]:
                last = last[i + 1:]
                break
        telling = [line for line in last if TELLING.search(line)]
        return "\n".join((telling or last)[-lines:])

    # -- the monitor thread ----------------------------------------------------------------------

    def _spawn(self) -> subprocess.Popen:
        if self.socket.exists() or self.socket.is_symlink():
            self.socket.unlink()  # a stale socket makes the server fail to bind
        cmd = command(self.role, self.model, self.socket, self.settings)
        self._cap_log()
        logf = open(self.log_path, "ab")
        logf.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}\n"
                   .encode())
        logf.flush()
        try:
            return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                    env=child_env(), start_new_session=True,
                                    preexec_fn=_child_setup(self.settings.nice))
        finally:
            logf.close()

    def kill_now(self) -> None:
        """SIGKILL the engine's process group (ragd's stop ran out of time: no orphans)."""
        proc = self._running()
        if proc is not None:
            log.warning("%s engine (pid %d): still running as ragd stops, sending SIGKILL",
                        self.role, proc.pid)
            _signal_group(proc, signal.SIGKILL)

    def signal(self, sig: int) -> bool:
        """Send sig to the engine's process group; False when no engine process runs. Used to
        pause the bulk engine while a query is embedded (manager.QueryFirst)."""
        with self._lock:  # held: a restart must not swap the process between check and send
            proc = self._proc
            return proc is not None and proc.poll() is None and _signal_group(proc, sig)

    def _running(self) -> subprocess.Popen | None:
        with self._lock:
            proc = self._proc
        return proc if proc is not None and proc.poll() is None else None

    def _kill(self, why: str, grace: float = 5.0) -> None:
        proc = self._running()
        if proc is None:
            return
        log.info("%s engine (pid %d): %s, sending SIGTERM", self.role, proc.pid, why)
        # SIGCONT after it: a paused engine must see its SIGTERM
        if not _signal_group(proc, signal.SIGTERM, signal.SIGCONT):
            return
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            log.warning("%s engine (pid %d) did not exit after SIGTERM, sending SIGKILL",
                        self.role, proc.pid)
            _signal_group(proc, signal.SIGKILL)
            proc.wait(5)

    def _wait_health(self, proc: subprocess.Popen) -> bool:
        deadline = time.monotonic() + self.settings.startup_timeout
        delay = 0.02
        while time.monotonic() < deadline and not self._stop.is_set():
            if proc.poll() is not None:
                return False
            if self.client.health(2.0):
                return True
            self._stop.wait(delay)
            delay = min(delay * 1.5, 0.25)
        return False

    def _monitor(self) -> None:
        backoff = BACKOFF_START
        retry_in = min(BACKOFF_MAX, self.settings.failed_retry)  # once failed
        while not self._stop.is_set():
            self.state = STARTING if self.restarts == 0 else RESTARTING
            t0 = time.monotonic()
            try:
                proc = self._spawn()
            except OSError as e:
                self._failed(f"cannot start {self.role} engine: {e}")
                if not self._wait_retry(retry_in):
                    return
                retry_in = min(retry_in * 2, self.settings.failed_retry)
                continue
            with self._lock:
                self._proc = proc
                self._open_pidfd(proc)
            self.pid = proc.pid
            if self._wait_health(proc):
                self.state, self.reason = READY, None
                self.ready_since = time.time()
                retry_in = min(BACKOFF_MAX, self.settings.failed_retry)
                self._ready.set()
                log.info("%s engine ready (pid %d, %.2fs, model %s)", self.role, proc.pid,
                         time.monotonic() - t0, self.model.name)
                why = self._watch(proc)
                backoff = BACKOFF_START  # it ran: start the next backoff from the bottom
            else:
                why = ("exited during start-up" if proc.poll() is not None else
                       f"not healthy within {self.settings.startup_timeout:.0f}s")
            self._ready.clear()
            self._kill(why)
            if self._stop.is_set():
                return
            now = time.monotonic()
            self._failures.append(now)
            while self._failures and now - self._failures[0] > self.settings.restart_window:
                self._failures.popleft()
            code = proc.poll()
            self.reason = f"{why} (exit status {code})" if code is not None else why
            log.warning("%s engine %s", self.role, self.reason)
            if len(self._failures) >= self.settings.max_restarts:
                self._failed(f"{self.role} engine failed {len(self._failures)} times within "
                             f"{self.settings.restart_window:.0f}s; last: {self.reason}\n"
                             f"{self.tail_log()}")
                if not self._wait_retry(retry_in):
                    return
                retry_in = min(retry_in * 2, self.settings.failed_retry)
                self._failures.clear()
                backoff = BACKOFF_START
                self.restarts += 1
                continue
            self.state = RESTARTING
            log.info("restarting the %s engine in %.1fs", self.role, backoff)
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, BACKOFF_MAX)
            self.restarts += 1

    def _watch(self, proc: subprocess.Popen) -> str:
        """Block until the engine dies, hangs, or we stop. Waiting on the process (not a
        sleep) notices a death at once; /health between waits notices a hang."""
        misses = 0
        while not self._stop.is_set():
            every = self.settings.health_interval
            if self._exited_within(proc, every / 4 if misses else every):
                self._ready.clear()
                return "stopping" if self._stop.is_set() else "exited"
            if self.client.health(min(HEALTH_TIMEOUT, 2 * self.settings.health_interval + 1)):
                misses = 0
                self._ready.set()
                self._cap_log()
                continue
            if proc.poll() is not None or self._stop.is_set():
                continue
            misses += 1
            self._ready.clear()
            if misses >= HUNG_CHECKS:
                return f"hung (/health failed {misses} times)"
        return "stopping"

    def _open_pidfd(self, proc: subprocess.Popen) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        if hasattr(os, "pidfd_open"):
            try:
                self._pidfd = os.pidfd_open(proc.pid)
            except OSError:
                self._pidfd = None

    def _exited_within(self, proc: subprocess.Popen, timeout: float) -> bool:
        """Has the process exited within timeout? Sleeps in the kernel on a pidfd (Linux):
        Popen.wait(timeout) would wake every 50 ms to poll."""
        fd = self._pidfd
        if fd is not None:
            try:
                select.select([fd], [], [], timeout)
            except (OSError, ValueError):
                pass
            return proc.poll() is not None
        try:
            proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def _failed(self, reason: str) -> None:
        self.state, self.reason = FAILED, reason
        self._ready.clear()
        log.error("%s", reason)

    def _wait_retry(self, delay: float) -> bool:
        """Failed: wait `delay` seconds, or until retry() or stop(); False when stopping."""
        self.next_try = time.time() + delay
        log.info("%s engine: trying again in %.0f s (or at a reload)", self.role, delay)
        self._retry.wait(delay)
        self._retry.clear()
        self.next_try = None
        return not self._stop.is_set()


def _signal_group(proc: subprocess.Popen, *sigs: int) -> bool:
    """Send each of sigs to the process group the engine leads (started with
    start_new_session: the bundled engine's Python parent and its server child go together);
    False when the group is gone."""
    try:
        for sig in sigs:
            os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True
