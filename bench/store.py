"""The store backends side by side on the dev set: quality and latency through the real daemon.

    python bench/store.py [--rounds 3]

For each backend (sqlite: FTS5 + the local vector index; milvus: Milvus Lite from its wheel),
one daemon over a copy of obsidian-tasks-docs with the default model: the 50 dev questions in
each mode over the socket (hit@k, MRR@10, nDCG@10 by note, as `ragctl eval`), and each
question's latency (median of --rounds runs). Then, with the daemon stopped, Milvus' own
one-query hybrid (both rankings and RRF k=60 in one hybrid_search request, no ragd weights) on
the same collection, with the same query vectors from the raw engine, scored the same way.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

from common import (EMBED_MODEL, SHARED, Daemon, copy_vault, median, pct, quiet_config, ready,
                    save, write_config)

from ragctl import evaluate
from ragd.engines.models import ResolvedModel
from ragd.engines.supervisor import Engine, EngineSettings

QUESTIONS = SHARED / "eval" / "obsidian-tasks" / "obsidian-tasks-questions.jsonl"
MODES = ("hybrid", "vector", "bm25")


def run_backend(work: Path, backend: str, rounds: int) -> tuple[dict, Path]:
    root = copy_vault("obsidian-tasks-docs", work / backend / "vault")
    cfg = quiet_config(write_config(
        work / backend / "config.toml", work / backend / "data", work / backend / "ragd.sock",
        [{"name": "docs", "path": str(root), "kind": "obsidian"}],
        f'[embedding]\nmodel = "{EMBED_MODEL}"\n[store]\nbackend = "{backend}"\n'))
    questions = evaluate.load(QUESTIONS)
    out: dict = {}
    d = Daemon(cfg, work / backend / "ragd.sock", work / backend / "ragd.stderr")
    t0 = time.perf_counter()
    with d:
        st = ready(d, vectors=True)
        out["ready_s"] = round(time.perf_counter() - t0, 1)
        out["chunks"] = st["sources"][0]["chunks"]
        with d.client(timeout=120) as c:
            for mode in MODES:
                lat: dict[int, list[float]] = {}
                res = None
                for _ in range(rounds):
                    res = evaluate.run(c, questions, mode, None, {"docs": str(root)})
                    for i, q in enumerate(questions):  # per-question latency, again
                        t = time.perf_counter()
                        c.call("search", query=q["question"], k=10, mode=mode)
                        lat.setdefault(i, []).append((time.perf_counter() - t) * 1e3)
                per_q = [median(v) for v in lat.values()]
                out[mode] = {**res["overall"], "p50_ms": round(pct(per_q, 50), 2),
                             "p95_ms": round(pct(per_q, 95), 2)}
                print(f"{backend:<7} {mode:<7} {res['overall']}  p50 {out[mode]['p50_ms']} ms",
                      flush=True)
    return out, root


def milvus_one_query(work: Path, root: Path) -> dict:
    """Milvus' hybrid_search (RRF on the server) on the collection the daemon filled."""
    from pymilvus import MilvusClient

    from ragd.index.milvus import MilvusStore
    data = work / "milvus" / "data"
    db = sqlite3.connect(data / "index.sqlite3")
    name = db.execute("SELECT value FROM meta WHERE key = 'store_collection'").fetchone()[0]
    path_of = dict(db.execute("SELECT c.id, f.relpath FROM chunks c JOIN files f "
                              "ON f.id = c.file_id"))
    ms = MilvusStore(data / "index.sqlite3", data, "", "ragd")
    space = int(db.execute("SELECT value FROM meta WHERE key = 'active_space'").fetchone()[0])
    ms.client, ms.view = MilvusClient(uri=str(data / "milvus.db")), (name, space)
    ms.client.load_collection(name)
    model = ResolvedModel(EMBED_MODEL.stem, EMBED_MODEL, "embedding", "mean", 512, "", "", 0.0,
                          None)
    engine = Engine("query", model, EngineSettings(threads=1), work / "raw", work / "logs")
    engine.start()
    assert engine.wait_ready(120), engine.tail_log()
    rows, lat = [], []
    try:
        for q in evaluate.load(QUESTIONS):
            qv = engine.client.embed([q["question"]])[0]
            t = time.perf_counter()
            hits = ms.hybrid(ms.view, db, q["question"], qv, 100)
            lat.append((time.perf_counter() - t) * 1e3)
            ranked: list[str] = []
            for cid, _ in hits:
                if path_of[cid] not in ranked:
                    ranked.append(path_of[cid])
            rows.append(evaluate.metrics(ranked, set(q["relevant"])))
    finally:
        engine.stop()
        ms.client.close()
    res = {m: round(sum(r[m] for r in rows) / len(rows), 4) for m in evaluate.METRICS}
    res["search_p50_ms"] = round(pct(lat, 50), 2)  # the request alone, no query embedding
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backends", default="sqlite,milvus",
                    help="comma-separated; Milvus' one-request hybrid runs with milvus")
    args = ap.parse_args()
    backends = args.backends.split(",")
    work = Path(tempfile.mkdtemp(prefix="ragd-store-"))
    result: dict = {}
    try:
        root = None
        for backend in backends:
            result[backend], root = run_backend(work, backend, args.rounds)
            if backend == "milvus":
                result["milvus_one_query_hybrid"] = milvus_one_query(work, root)
        print(f"\ndev set (50 questions, by note), {result[backends[0]]['chunks']} chunks")
        print(f"{'store':<8} {'mode':<18} {'hit@1':>6} {'hit@5':>6} {'MRR@10':>7} "
              f"{'nDCG@10':>8} {'p50 ms':>7} {'p95 ms':>7}")
        for backend in backends:
            for mode in MODES:
                r = result[backend][mode]
                print(f"{backend:<8} {mode:<18} {r['hit@1']:6.2f} {r['hit@5']:6.2f} "
                      f"{r['mrr@10']:7.3f} {r['ndcg@10']:8.3f} {r['p50_ms']:7.1f} "
                      f"{r['p95_ms']:7.1f}")
        if "milvus" in result:
            r = result["milvus_one_query_hybrid"]
            print(f"{'milvus':<8} {'hybrid_search RRF':<18} {r['hit@1']:6.2f} {r['hit@5']:6.2f} "
                  f"{r['mrr@10']:7.3f} {r['ndcg@10']:8.3f} {r['search_p50_ms']:7.1f}   (request "
                  f"only, no embedding)")
        if "milvus" in result and "sqlite" in result:
            for mode in MODES:
                ratio = result["milvus"][mode]["p50_ms"] / result["sqlite"][mode]["p50_ms"]
                print(f"  {mode}: milvus / sqlite p50 = {ratio:.2f}x")
        save("store" if len(backends) > 1 else f"store-{backends[0]}", result)
        print(json.dumps({b: {m: result[b][m]["p50_ms"] for m in MODES} for b in backends}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
