"""What every benchmark shares: the daemon from the test fixtures, one percentile, process
CPU and memory readings, and waiting without polling.

Benchmarks must not load what they measure: they wait for the daemon with its `wait` op (it
blocks on the daemon's own conditions) instead of asking for its status every few ms.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import (EMBED_MODEL, SHARED, VAULTS, Daemon, copy_vault,  # noqa: E402,F401
                      write_config)

RESULTS = ROOT / "bench" / "results"
median = statistics.median


def pct(xs, p: float) -> float:
    """The p-th percentile, linearly interpolated between the closest ranks (numpy's default);
    the one percentile every bench reports."""
    xs = sorted(xs)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * p / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def quiet_config(cfg: Path) -> Path:
    """Benchmarks log at info: debug lines cost time in what is measured."""
    cfg.write_text(cfg.read_text().replace('log_level = "debug"', 'log_level = "info"'))
    return cfg


def ready(d: Daemon, vectors: bool, timeout: float = 7200) -> dict:
    """Block until indexed (and embedded): the daemon's wait op, no polling. With the Milvus
    store, also until its collection has every chunk (a first fill is not a change the wait
    op tracks: its status is read every half second, before anything is measured), and until
    the tantivy BM25 index has every chunk (idem)."""
    st = d.wait_idle(timeout=timeout, vectors=vectors)
    deadline = time.monotonic() + timeout

    def behind(st) -> str | None:
        if st.get("store", {}).get("backend") == "milvus" and not (
                st["store"]["state"] == "in sync" and st["store"]["pending"] == 0):
            return f"the Milvus store did not catch up: {st['store']}"
        text = st.get("bm25_index", {})
        if text.get("engine") == "tantivy" and not (text["serving"] and text["pending"] == 0):
            return f"the tantivy index did not catch up: {text}"
        return None

    while (why := behind(st)) is not None:
        if time.monotonic() > deadline:
            raise SystemExit(why)
        time.sleep(0.5)
        st = d.call("status")
    return st


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def rss_parts_mb(pid: int) -> dict[str, float]:
    """A process's RSS by kind: anon (its own memory), file (pages of mapped files, which the
    kernel can drop and read again) and shmem, in MB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
                name, kb = line.split()[:2]
                out[name[3:-1].lower()] = round(int(kb) / 1024, 1)
    return out


def evict(*roots: Path) -> int:
    """Ask the kernel to drop every file under these folders (or these files) from the page
    cache (posix_fadvise DONTNEED): the nearest a user without root comes to a machine that
    has not read them for hours. Pages a running process maps stay. Returns the files seen."""
    n = 0
    for root in roots:
        for f in ([root] if root.is_file() else root.rglob("*")):
            try:
                if not f.is_file() or f.is_symlink():
                    continue
                fd = os.open(f, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            finally:
                os.close(fd)
    return n


def children(pid: int) -> list[int]:
    """Direct children of a process (the engines of a daemon)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return out


def save(name: str, result: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2))
    return path


def timed(fn, *args, **kw) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn(*args, **kw)
    return (time.perf_counter() - t) * 1e3, out
