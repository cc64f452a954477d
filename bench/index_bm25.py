"""Index a real vault through the real daemon (BM25 only) and time searches over the socket.

    python bench/index_bm25.py [--vault obsidian-hub] [--runs 3] [--queries 100]

Prints, as medians over runs:
- initial index: wall time from starting ragd to an idle index, files/s and chunks/s;
- restart with nothing changed: time to idle, and how many files were re-read;
- search latency over the Unix socket (one connection, 100 queries): p50 and p95, next to the
  same queries run in-process straight on SQLite FTS5 (no socket, no daemon), and their ratio —
  the cost of the daemon and the protocol on top of the raw index.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import Daemon, VAULTS, copy_vault, write_config  # noqa: E402
from ragd.index import store  # noqa: E402
from ragd.search import bm25  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def make_queries(vault: Path, n: int, seed: int = 0) -> list[str]:
    """n queries of 2-5 words taken from random lines of random notes (seeded)."""
    rng = random.Random(seed)
    notes = sorted(p for p in vault.rglob("*.md")
                   if not any(s.startswith(".") for s in p.relative_to(vault).parts))
    out = []
    while len(out) < n:
        lines = [ln for ln in rng.choice(notes).read_text(errors="replace").splitlines()
                 if len(re.findall(r"[A-Za-z]{3,}", ln)) >= 5]
        if not lines:
            continue
        words = re.findall(r"[A-Za-z]{3,}", rng.choice(lines))
        k = rng.randint(2, 5)
        start = rng.randrange(0, len(words) - k + 1)
        out.append(" ".join(words[start:start + k]))
    return out


def time_to_idle(d: Daemon, t0: float) -> tuple[float, dict]:
    st = d.wait_idle(timeout=3600, every=0.01)
    return time.perf_counter() - t0, st


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vault", default="obsidian-hub")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--queries", type=int, default=100)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="ragd-bench-"))
    try:
        vault = copy_vault(args.vault, tmp / "vault")
        queries = make_queries(vault, args.queries)
        index_s, files, chunks, restart_s, restart_read = [], 0, 0, [], []
        sock_p50, sock_p95, raw_p50, raw_p95 = [], [], [], []
        for run in range(args.runs):
            data = tmp / f"data{run}"
            cfg = write_config(tmp / f"config{run}.toml", data, tmp / f"run{run}" / "ragd.sock",
                               [{"name": args.vault, "path": str(vault), "kind": "obsidian"}])
            cfg.write_text(cfg.read_text().replace('log_level = "debug"', 'log_level = "info"'))
            d = Daemon(cfg, tmp / f"run{run}" / "ragd.sock", tmp / f"run{run}.log")
            t0 = time.perf_counter()
            d.start()
            try:
                elapsed, st = time_to_idle(d, t0)
                index_s.append(elapsed)
                files = st["sources"][0]["files"]
                chunks = st["sources"][0]["chunks"]

                lat = []
                with d.client() as c:
                    for q in queries[:10]:  # warm the page cache and the read connection
                        c.call("search", query=q, k=10)
                    for q in queries:
                        t = time.perf_counter()
                        c.call("search", query=q, k=10)
                        lat.append((time.perf_counter() - t) * 1e3)
                sock_p50.append(pct(lat, 50))
                sock_p95.append(pct(lat, 95))
            finally:
                d.stop()

            db = store.connect(data / "index.sqlite3", readonly=True)
            for q in queries[:10]:
                bm25.search(db, q, 10)
            lat = []
            for q in queries:
                t = time.perf_counter()
                hits = bm25.search(db, q, 10)
                ids = [h.chunk_id for h in hits]
                db.execute("SELECT c.text, f.relpath FROM chunks c JOIN files f ON f.id = "
                           f"c.file_id WHERE c.id IN ({','.join('?' * len(ids))})", ids).fetchall()
                lat.append((time.perf_counter() - t) * 1e3)
            db.close()
            raw_p50.append(pct(lat, 50))
            raw_p95.append(pct(lat, 95))

            t0 = time.perf_counter()
            d.start()
            try:
                elapsed, st = time_to_idle(d, t0)
                restart_s.append(elapsed)
                restart_read.append(st["totals"]["files_indexed"] + st["totals"]["files_unchanged"])
            finally:
                d.stop()

        med = statistics.median
        result = {
            "vault": args.vault, "runs": args.runs, "files": files, "chunks": chunks,
            "index_s": med(index_s), "files_per_s": files / med(index_s),
            "chunks_per_s": chunks / med(index_s),
            "restart_unchanged_s": med(restart_s), "restart_files_read": max(restart_read),
            "queries": len(queries),
            "search_socket_p50_ms": med(sock_p50), "search_socket_p95_ms": med(sock_p95),
            "search_fts5_p50_ms": med(raw_p50), "search_fts5_p95_ms": med(raw_p95),
            "socket_over_fts5_p50": med(sock_p50) / med(raw_p50),
        }
        print(f"vault {args.vault}: {files} files, {chunks} chunks; medians of {args.runs} runs")
        print(f"  initial index (BM25 only)  {result['index_s']:.2f} s   "
              f"{result['files_per_s']:.0f} files/s   {result['chunks_per_s']:.0f} chunks/s")
        print(f"  restart, nothing changed   {result['restart_unchanged_s']:.2f} s to idle, "
              f"{result['restart_files_read']} files read")
        print(f"  search, {len(queries)} queries, k=10:")
        print(f"    over the socket          p50 {result['search_socket_p50_ms']:.2f} ms   "
              f"p95 {result['search_socket_p95_ms']:.2f} ms")
        print(f"    FTS5 in-process (raw)    p50 {result['search_fts5_p50_ms']:.2f} ms   "
              f"p95 {result['search_fts5_p95_ms']:.2f} ms")
        print(f"    ratio socket / raw p50   {result['socket_over_fts5_p50']:.2f}x")
        out = ROOT / "bench" / "results"
        out.mkdir(exist_ok=True)
        (out / f"index_bm25-{args.vault}.json").write_text(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
