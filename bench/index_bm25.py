"""Index a real vault through the real daemon (BM25 only) and time searches over the socket.

    python bench/index_bm25.py [--vault obsidian-hub] [--runs 3] [--queries 100]

Prints, as medians over runs:
- initial index: wall time from starting ragd to an idle index, files/s and chunks/s;
- restart with nothing changed: time to idle, and how many files were re-read;
- search latency over the Unix socket (one connection, 100 queries): p50 and p95, next to the
  same queries run in-process (no socket, no daemon) two ways: ragd's own BM25 code (which drops
  words found in over half the chunks) and a plain FTS5 query of every word — and the ratios:
  the cost of the daemon and the protocol, and of ragd's query handling, on top of the index.
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from common import Daemon, copy_vault, pct, quiet_config, ready, save, write_config
from ragd.index import store
from ragd.search import bm25
from ragd.text import query_parts


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
    st = ready(d, vectors=False, timeout=3600)
    return time.perf_counter() - t0, st


def raw_fts5(db, query: str, limit: int) -> list[int]:
    """The plain SQLite FTS5 query a minimal client would run: every word OR-ed, bm25()
    order, no pruning of common words."""
    match = " OR ".join(query_parts(query))
    return [r[0] for r in db.execute("SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ? "
                                     "ORDER BY bm25(chunks_fts) LIMIT ?", (match, limit))]


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
        sock_p50, sock_p95 = [], []
        inproc = {"ragd_fn": ([], []), "raw": ([], [])}  # name -> (p50s, p95s)
        for run in range(args.runs):
            data = tmp / f"data{run}"
            cfg = write_config(tmp / f"config{run}.toml", data, tmp / f"run{run}" / "ragd.sock",
                               [{"name": args.vault, "path": str(vault), "kind": "obsidian"}])
            quiet_config(cfg)
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

            def fetch(ids):
                db.execute("SELECT c.text, f.relpath FROM chunks c JOIN files f ON f.id = "
                           f"c.file_id WHERE c.id IN ({','.join('?' * len(ids))})", ids).fetchall()

            for name, run_query in (("ragd_fn", lambda q: [h.chunk_id for h in
                                                           bm25.search(db, q, 10)]),
                                    ("raw", lambda q: raw_fts5(db, q, 10))):
                for q in queries[:10]:
                    run_query(q)
                lat = []
                for q in queries:
                    t = time.perf_counter()
                    fetch(run_query(q))
                    lat.append((time.perf_counter() - t) * 1e3)
                inproc[name][0].append(pct(lat, 50))
                inproc[name][1].append(pct(lat, 95))
            db.close()

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
            "bm25_fn_inprocess_p50_ms": med(inproc["ragd_fn"][0]),
            "bm25_fn_inprocess_p95_ms": med(inproc["ragd_fn"][1]),
            "fts5_raw_p50_ms": med(inproc["raw"][0]), "fts5_raw_p95_ms": med(inproc["raw"][1]),
            "socket_over_fn_p50": med(sock_p50) / med(inproc["ragd_fn"][0]),
            "socket_over_raw_p50": med(sock_p50) / med(inproc["raw"][0]),
        }
        print(f"vault {args.vault}: {files} files, {chunks} chunks; medians of {args.runs} runs")
        print(f"  initial index (BM25 only)  {result['index_s']:.2f} s   "
              f"{result['files_per_s']:.0f} files/s   {result['chunks_per_s']:.0f} chunks/s")
        print(f"  restart, nothing changed   {result['restart_unchanged_s']:.2f} s to idle, "
              f"{result['restart_files_read']} files read")
        print(f"  search, {len(queries)} queries, k=10 (with fetching the 10 chunks):")
        print(f"    ragd over the socket           p50 {result['search_socket_p50_ms']:.2f} ms"
              f"   p95 {result['search_socket_p95_ms']:.2f} ms")
        print(f"    ragd's BM25 code in-process    p50 "
              f"{result['bm25_fn_inprocess_p50_ms']:.2f} ms   p95 "
              f"{result['bm25_fn_inprocess_p95_ms']:.2f} ms")
        print(f"    plain FTS5 query (no pruning)  p50 {result['fts5_raw_p50_ms']:.2f} ms"
              f"   p95 {result['fts5_raw_p95_ms']:.2f} ms")
        print(f"    socket / in-process p50 {result['socket_over_fn_p50']:.2f}x; "
              f"socket / plain FTS5 p50 {result['socket_over_raw_p50']:.2f}x")
        save(f"index_bm25-{args.vault}", result)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
