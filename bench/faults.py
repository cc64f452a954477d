"""The fault suite at full size, with the figures for the reliability table.

    python bench/faults.py [--vault obsidian-hub] [--kills 20] [--engine-kills 10]
                           [--frames 10000] [--clients 200] [--seconds 30] [--held 300 400]
                           [--race-seconds 60] [--only NAME,...]

Cases (each on a fresh copy of the vault, the real daemon, the real engine):
- kills: kill -9 of the daemon at --kills random points while it indexes and embeds the vault;
  after each restart it converges. Reports files lost, texts re-embedded per kill (texts sent
  to the engine, as logged before each request, minus distinct texts), and whether
  chunks == FTS rows == vectors at the end. Embedding obsidian-hub takes ~45 min here: the
  kills are spread over the first --kill-window seconds, then it runs to the end.
- engine: kill -9 of the embedding engine --engine-kills times during embedding (of
  --engine-vault): restarts, texts lost, texts stored twice.
- socket: --frames fuzzed frames (tests/test_faults.py's generator), then --clients clients at
  once for --seconds: replies, errors by code, the daemon's RSS before and after.
- flood: --held connections held open saying nothing (over the limit of 256: 300, 400), then
  10 new clients: how long each waits for its answer ("ragd is busy"), median and max.
- race: a folder of the source swapped for a link to an outside folder and back, in a loop,
  for --race-seconds, while a client reads a note in it with get and searches for the outside
  text: gets that returned the outside file, searches that found it, error codes.
- query: a 1 MB query (the vault's own text): the reply and how long it took.
- engine_failed: the embedding engine killed until ragd marks it failed (max_restarts 5 in
  300 s), then how long until it is back by itself (failed_retry 30 s), and embedding resumed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import sqlite3
import tempfile
import time
from pathlib import Path

import statistics

from common import (Daemon, copy_vault, quiet_config, ready, rss_mb, save,
                    write_config)
from conftest import engine_config, small_vault
from ragd import protocol as P
from test_faults import (SwapRace, consistent, fuzz_frames, hammer, hold_connections,
                         kill_until_failed, refused_in, send_fuzz, sent_texts)


def daemon(tmp: Path, vault: Path, extra: str, debug: bool = False) -> Daemon:
    cfg = write_config(tmp / "config.toml", tmp / "data", tmp / "run" / "ragd.sock",
                       [{"name": "v", "path": str(vault), "kind": "obsidian"}], extra)
    if not debug:
        quiet_config(cfg)
    return Daemon(cfg, tmp / "run" / "ragd.sock", tmp / "ragd.stderr")


def case_kills(args, tmp: Path) -> dict:
    vault = copy_vault(args.vault, tmp / "vault")
    n_files = sum(1 for p in vault.rglob("*.md")
                  if not any(s.startswith(".") for s in p.relative_to(vault).parts))
    d = daemon(tmp, vault, engine_config(), debug=True)  # debug: the embed lines are counted
    rng = random.Random(args.seed)
    points = sorted(rng.uniform(1, args.kill_window) for _ in range(args.kills))
    t0 = time.monotonic()
    for i, at in enumerate(points):
        d.start(timeout=120)
        time.sleep(max(0.0, at - (time.monotonic() - t0)))
        d.kill()
        with contextlib.closing(sqlite3.connect(tmp / "data" / "index.sqlite3",
                                                isolation_level=None)) as db:
            consistent(db)
        print(f"  kill {i + 1}/{len(points)} at {time.monotonic() - t0:.0f} s: consistent",
              flush=True)
    with d:
        st = ready(d, vectors=True, timeout=4 * 3600)
    with contextlib.closing(sqlite3.connect(tmp / "data" / "index.sqlite3",
                                            isolation_level=None)) as db:
        consistent(db)
        distinct = db.execute("SELECT COUNT(DISTINCT embed_hash) FROM chunks").fetchone()[0]
        fts = db.execute("SELECT COUNT(*) FROM chunks_fts").fetchone()[0]
    src = st["sources"][0]
    sent = sent_texts(tmp / "data" / "ragd.log")
    return {"kills": len(points), "files": n_files,
            "files_lost": n_files - src["files"] - src["skipped"] - src["failed"],
            "chunks": src["chunks"], "fts_rows": fts,
            "vectors": st["engines"]["embedding"]["vectors"],
            "distinct_texts": distinct, "texts_sent": sent,
            "re_embedded_per_kill": round((sent - distinct) / len(points), 2),
            "total_s": round(time.monotonic() - t0)}


def case_engine(args, tmp: Path) -> dict:
    vault = small_vault(tmp / "vault") if args.engine_vault == "small" else \
        copy_vault(args.engine_vault, tmp / "vault")
    d = daemon(tmp, vault, engine_config(extra="[engines]\nmax_restarts = 1000\n"))
    kills, last = 0, None
    with d:
        # The text first: before it is indexed the embedder is idle with nothing pending,
        # which the loop below would take for "finished" (it once ended with 0 kills).
        d.wait_idle(timeout=600)
        while kills < args.engine_kills:
            e = d.call("status")["engines"]["embedding"]
            if e.get("state") == "ready" and e.get("pid") != last and \
                    e.get("embedder") == "embedding":
                os.kill(e["pid"], signal.SIGKILL)
                last, kills = e["pid"], kills + 1
            elif e.get("pending_texts") == 0 and e.get("embedder") == "idle":
                break  # finished before all the kills: report how many landed
            time.sleep(0.2)
        st = ready(d, vectors=True, timeout=4 * 3600)
    e = st["engines"]["embedding"]
    with contextlib.closing(sqlite3.connect(tmp / "data" / "index.sqlite3")) as db:
        distinct = db.execute("SELECT COUNT(DISTINCT embed_hash) FROM chunks").fetchone()[0]
    return {"engine_kills": kills, "engine_restarts": e["restarts"], "distinct_texts": distinct,
            "texts_stored": e["embedded_texts"], "texts_lost": distinct - e["vectors"]
            if e["vectors"] < distinct else 0, "stored_twice": e["embedded_texts"] - distinct,
            "vectors": e["vectors"], "chunks": st["sources"][0]["chunks"]}


def case_socket(args, tmp: Path) -> dict:
    vault = copy_vault("obsidian-tasks-docs", tmp / "vault")
    d = daemon(tmp, vault, '[embedding]\nmodel = ""\n')
    with d:
        ready(d, vectors=False)
        fresh = rss_mb(d.proc.pid)
        # Warm up with the load to come (its threads, buffers, read connections and their
        # page caches, malloc's heaps): what is measured after is what the load leaves.
        hammer(d.socket, args.clients, args.seconds)
        time.sleep(1.1)
        before = rss_mb(d.proc.pid)
        frames = fuzz_frames(args.frames, seed=args.seed, inside=vault)
        t = time.monotonic()
        out = send_fuzz(d.socket, frames)
        fuzz_s = time.monotonic() - t
        n, errors = hammer(d.socket, args.clients, args.seconds)
        time.sleep(1.1)
        after = rss_mb(d.proc.pid)
        st = d.call("status")
    return {"frames": out["frames"], "replies": out["replies"], "error_replies": out["errors"],
            "fuzz_s": round(fuzz_s, 1), "clients": args.clients, "seconds": args.seconds,
            "requests": n, "client_errors": len(errors), "rss_fresh_mb": round(fresh, 1),
            "rss_before_mb": round(before, 1),
            "rss_after_mb": round(after, 1), "rss_ratio": round(after / before, 3),
            "thread_restarts": sum(t["restarts"] for t in st["threads"]),
            "client_error_kinds": sorted({e.split(": ", 1)[1][:80] for e in errors})[:5]}


def case_flood(args, tmp: Path) -> dict:
    vault = copy_vault("obsidian-tasks-docs", tmp / "vault")
    d = daemon(tmp, vault, '[embedding]\nmodel = ""\n')
    out = {}
    with d:
        ready(d, vectors=False)
        for n in args.held:
            held = hold_connections(d.socket, n)
            waits, said = [], None
            for _ in range(10):
                t, reply = refused_in(d.socket)
                waits.append(t)
                said = (reply.get("error") or {}).get("message")
            out[f"held_{n}"] = {"median_ms": round(1e3 * statistics.median(waits), 2),
                                "max_ms": round(1e3 * max(waits), 2), "reply": said}
            for s in held:
                s.close()
            deadline = time.monotonic() + 30
            while True:  # every slot free again before the next round
                try:
                    if d.call("status")["connections"]["open"] <= 1:
                        break
                except P.DaemonError:
                    pass
                assert time.monotonic() < deadline
                time.sleep(0.05)
    return out


def case_race(args, tmp: Path) -> dict:
    root, outside = tmp / "notes", tmp / "outside"
    (root / "racedir").mkdir(parents=True)
    (outside / "racedir").mkdir(parents=True)
    note = root / "racedir" / "note.md"
    note.write_text("# Inside\n\nThe word insidious lives here.\n")
    (outside / "racedir" / "note.md").write_text("# Outside\n\nThe word swordfish.\n")
    d = daemon(tmp, root, '[embedding]\nmodel = ""\n')
    gets = leaks = searches = found = 0
    codes: dict = {}
    with d:
        ready(d, vectors=False)
        with SwapRace(root, outside) as race, d.client() as c:
            deadline = time.monotonic() + args.race_seconds
            while time.monotonic() < deadline:
                try:
                    leaks += "swordfish" in c.call("get", path=str(note))["text"]
                except P.DaemonError as e:
                    codes[e.code] = codes.get(e.code, 0) + 1
                gets += 1
                if gets % 10 == 0:
                    searches += 1
                    found += bool(c.call("search", query="swordfish", mode="bm25")["results"])
        swaps = race.swaps
    return {"seconds": args.race_seconds, "swaps": swaps, "gets": gets, "outside_served": leaks,
            "searches": searches, "outside_found": found, "error_codes": codes}


def case_query(args, tmp: Path) -> dict:
    vault = copy_vault(args.vault, tmp / "vault")
    d = daemon(tmp, vault, '[embedding]\nmodel = ""\n')
    with d:
        ready(d, vectors=False)
        text = " ".join(p.read_text(errors="replace") for p in sorted(vault.rglob("*.md"))[:2000])
        huge = (text * (1 + (1 << 20) // max(1, len(text))))[:1 << 20]
        t = time.monotonic()
        try:
            d.call("search", query=huge)
            said = "answered"
        except P.DaemonError as e:
            said = f"{e.code}: {e.message}"
        return {"query_bytes": len(huge.encode()), "reply_ms": round(1e3 * (time.monotonic() - t),
                                                                      1), "reply": said}


def case_engine_failed(args, tmp: Path) -> dict:
    vault = small_vault(tmp / "vault")
    d = daemon(tmp, vault, engine_config(extra="[engines]\nfailed_retry = 30\n"))
    with d:
        ready(d, vectors=True)
        t0 = time.monotonic()
        e = kill_until_failed(d, timeout=600)
        failed_at = time.monotonic()
        (vault / "later.md").write_text("# Later\n\nWritten while the engine was failed.\n")
        st = ready(d, vectors=True, timeout=900)
        return {"kills_to_failed_s": round(failed_at - t0, 1),
                "back_and_embedded_after_s": round(time.monotonic() - failed_at, 1),
                "reason": e["reason"].splitlines()[0],
                "restarts": st["engines"]["embedding"]["restarts"]}


CASES = {"kills": case_kills, "engine": case_engine, "socket": case_socket,
         "flood": case_flood, "race": case_race, "query": case_query,
         "engine_failed": case_engine_failed}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vault", default="obsidian-hub")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--kill-window", type=float, default=900.0,
                    help="seconds over which the kills are spread")
    ap.add_argument("--engine-kills", type=int, default=10)
    ap.add_argument("--engine-vault", default="dwarvesf-brain", help="a vault name or 'small'")
    ap.add_argument("--frames", type=int, default=10000)
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--held", type=int, nargs="+", default=[300, 400],
                    help="flood: connections held open, per round")
    ap.add_argument("--race-seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", default=",".join(CASES))
    args = ap.parse_args()
    results = {}
    for name in args.only.split(","):
        tmp = Path(tempfile.mkdtemp(prefix=f"ragd-faults-{name}-"))
        try:
            print(f"== {name}", flush=True)
            results[name] = CASES[name](args, tmp)
            for k, v in results[name].items():
                print(f"  {k:<24} {v}", flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    save("faults", results)


if __name__ == "__main__":
    main()
