"""Exact matrix against the HNSW graph, on the vectors of a built index: recall and latency.

    python bench/ann.py --index DIR/data/index.sqlite3 [--queries 200] [--sizes 10000,100000]
    python bench/ann.py --index A/index.sqlite3 B/index.sqlite3 --sizes 10000,40000  (real vectors)

Vectors: every chunk's vector of the index's active space (for an index from bench/scale.py,
2,000 real MiniLM vectors of distinct base texts and noisy copies of them; for an index of a
vault, all real). Queries: the dev-set questions and SciFact test claims, embedded by the real
engine (the model of the index). For each size (the first N chunks): the exact product
(ragd/index/vectors.py, float32) and the graph (ragd/index/ann.py: usearch HNSW, M=32,
ef=512; --dtypes: its vectors' storage, int8 searched as the daemon does, the first
RESCORED (50) of its 100 ranked again in float32), both through ragd's own classes,
single-threaded queries.

Prints per size: recall@10 of the graph against the exact top 10 (mean over the queries), the
p50 and p95 query time of each, the graph's build time, and the ratio exact / graph.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

import numpy as np

from common import EMBED_MODEL, pct, save
from scale import queries
from ragd.engines.models import ResolvedModel
from ragd.engines.supervisor import Engine, EngineSettings
from ragd.index.ann import AnnIndex
from ragd.index.vectors import VectorIndex, from_blob
from ragd.index.vectorstore import RESCORED


def load(index: Path, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    db = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    space = int(db.execute("SELECT value FROM meta WHERE key = 'active_space'").fetchone()[0])
    rows = db.execute("SELECT c.id, c.file_id, e.vector FROM chunks c JOIN embeddings e ON "
                      "e.space = ? AND e.text_hash = c.embed_hash ORDER BY c.id LIMIT ?",
                      (space, limit)).fetchall()
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    files = np.array([r[1] for r in rows], dtype=np.int64)
    mat = np.vstack([from_blob(r[2]) for r in rows]).astype(np.float32)
    return ids, files, mat


def load_distinct(indexes: list[Path]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The vectors of every distinct text the chunks of these indexes use (a text repeated in
    many chunks, or in two indexes, counts once: copies would make the top 10 ties), in a fixed
    shuffled order so that each size mixes the indexes. Ids are row numbers."""
    seen: dict[str, np.ndarray] = {}
    for index in indexes:
        db = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
        space = int(db.execute("SELECT value FROM meta WHERE key = 'active_space'"
                               ).fetchone()[0])
        for h, blob in db.execute("SELECT text_hash, vector FROM embeddings WHERE space = ? AND "
                                  "text_hash IN (SELECT embed_hash FROM chunks)", (space,)):
            seen.setdefault(h, from_blob(blob))
        db.close()
    mat = np.vstack(list(seen.values())).astype(np.float32)
    mat = mat[np.random.default_rng(0).permutation(len(mat))]
    ids = np.arange(len(mat), dtype=np.int64)
    return ids, ids.copy(), mat


def embed(qs: list[str], model_path: Path) -> np.ndarray:
    model = ResolvedModel(model_path.stem, model_path, "embedding", "mean", 512, "", "", 0.0,
                          None)
    work = Path(tempfile.mkdtemp(prefix="ragd-ann-"))
    engine = Engine("query", model, EngineSettings(), work / "run", work / "logs")
    engine.start()
    assert engine.wait_ready(120), engine.tail_log()
    try:
        return np.vstack([engine.client.embed([q])[0] for q in qs]).astype(np.float32)
    finally:
        engine.stop()


class Rescored:
    """An int8 graph searched as the daemon searches it: its top `candidates` (a search's
    search.candidates), the first RESCORED of them ranked again by their float32 vectors
    (VectorStore.rescore reads them from the embedding cache; here, from the matrix)."""

    def __init__(self, graph: AnnIndex, ids: np.ndarray, mat: np.ndarray, candidates: int = 100):
        self.graph, self.mat, self.candidates = graph, mat, candidates
        self.row = {int(i): r for r, i in enumerate(ids.tolist())}

    def search(self, q: np.ndarray, k: int):
        ids, cos = self.graph.search(q, max(k, self.candidates))
        best = cos.copy()
        best[:RESCORED] = self.mat[[self.row[int(i)] for i in ids[:RESCORED]]] @ q
        top = np.argsort(-best, kind="stable")[:k]
        return ids[top], best[top]


def timed_search(index, qv: np.ndarray, k: int) -> tuple[list[set], list[float]]:
    tops, lat = [], []
    for q in qv[:5]:
        index.search(q, k)
    for q in qv:
        t = time.perf_counter()
        ids, _ = index.search(q, k)
        lat.append((time.perf_counter() - t) * 1e3)
        tops.append(set(ids.tolist()))
    return tops, lat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--index", type=Path, required=True, nargs="+",
                    help="one index: its chunks' vectors in id order; several: the distinct "
                         "vectors of all of them, shuffled (real vectors from several corpora)")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--model", type=Path, default=EMBED_MODEL)
    ap.add_argument("--dtypes", default="f16",
                    help="how the graph stores its vectors, each compared: f16,i8")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if len(args.index) == 1:
        ids, files, mat = load(args.index[0], max(sizes))
    else:
        ids, files, mat = load_distinct(args.index)
    print(f"{len(ids)} vectors from {', '.join(map(str, args.index))}", flush=True)
    qv = embed(queries(args.queries), args.model)
    out = []
    for n in sizes:
        n = min(n, len(ids))
        exact = VectorIndex(mat.shape[1])
        exact.add(ids[:n].tolist(), mat[:n], files[:n].tolist())
        ex_tops, ex_lat = timed_search(exact, qv, 10)
        for dtype in args.dtypes.split(","):
            t = time.perf_counter()
            graph = AnnIndex.from_rows(mat.shape[1], None, ids[:n], files[:n], mat[:n],
                                       threads=1, dtype=dtype)
            build_s = time.perf_counter() - t
            searched = Rescored(graph, ids[:n], mat[:n]) if graph.approximate else graph
            gr_tops, gr_lat = timed_search(searched, qv, 10)
            recall = float(np.mean([len(a & b) / max(1, len(a))
                                    for a, b in zip(ex_tops, gr_tops)]))
            row = {"vectors": n, "dtype": dtype, "recall_at_10": round(recall, 4),
                   "exact_p50_ms": round(pct(ex_lat, 50), 3),
                   "exact_p95_ms": round(pct(ex_lat, 95), 3),
                   "hnsw_p50_ms": round(pct(gr_lat, 50), 3),
                   "hnsw_p95_ms": round(pct(gr_lat, 95), 3),
                   "hnsw_build_s": round(build_s, 1), "hnsw_mb": round(graph.nbytes / 2**20, 1),
                   "exact_over_hnsw_p50": round(pct(ex_lat, 50) / pct(gr_lat, 50), 1)}
            out.append(row)
            print(f"{n:>8} vectors, graph of {dtype}"
                  f"{f' (first {RESCORED} of 100 ranked again in float32)' if graph.approximate else ''}: recall@10 {row['recall_at_10']:.4f}; "
                  f"exact p50 {row['exact_p50_ms']} ms (p95 {row['exact_p95_ms']}), hnsw p50 "
                  f"{row['hnsw_p50_ms']} ms (p95 {row['hnsw_p95_ms']}), "
                  f"{row['exact_over_hnsw_p50']}x; graph {row['hnsw_mb']} MB, built in "
                  f"{row['hnsw_build_s']} s (1 thread)", flush=True)
    name = "ann" if len(args.index) == 1 else "ann-real"
    saved = save(name, {"index": [str(i) for i in args.index], "queries": len(qv), "sizes": out})
    print(f"saved {saved}")


if __name__ == "__main__":
    main()
