"""The Milvus store with and without ragd's own copy of the vectors ([store] local_vectors),
on an index built by bench/scale.py: what ragd's process holds, and what search costs.

    python bench/milvus_memory.py --keep DIR [--queries 50]

DIR is a `bench/scale.py --keep DIR --build-only` folder. Its data folder is copied once to
DIR/milvus-data, and three daemons run on that copy with `[store] backend = "milvus"` and
Milvus Lite (`uri = ""`):
1. local_vectors = false, the first start: it fills the Milvus collection (fill_s, until the
   collection has every chunk);
2. local_vectors = false, and then true: each started twice, the second start measured (the
   first start of the local copy reads every vector from the cache and, past ann_threshold,
   builds its graph, saved when it stops).
Measured (after the start settles): the daemon's RSS, the vector index status reports, the
start until ready (start_s), and hybrid search p50 over the socket. Milvus Lite runs inside
the daemon's process (the milvus-lite wheel), so its memory is in the RSS of both; the
difference between them is ragd's copy of the vectors, which a Milvus server would not need.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from common import EMBED_MODEL, Daemon, quiet_config, ready, rss_mb, save, write_config

from scale import OLD_BUILDS_OVERLAP, measure_queries, queries


def built_overlap(keep: Path) -> int:
    """The chunking the index was built with (scale.daemon_for)."""
    return json.loads((keep / "built.json").read_text()).get("chunk_overlap",
                                                             OLD_BUILDS_OVERLAP)


def daemon(keep: Path, data: Path, local: bool) -> Daemon:
    run = keep / "milvus-run"
    run.mkdir(exist_ok=True)
    cfg = write_config(run / f"config-{int(local)}.toml", data, run / "ragd.sock",
                       [{"name": "notes", "path": str(keep / "notes")}],
                       f'[embedding]\nmodel = "{EMBED_MODEL}"\n[store]\nbackend = "milvus"\n'
                       f'local_vectors = {"true" if local else "false"}\n'
                       f'[index]\nchunk_overlap = {built_overlap(keep)}\n')
    return Daemon(quiet_config(cfg), run / "ragd.sock", run / f"ragd-{int(local)}.log")


def measure(d: Daemon, qs: list[str]) -> dict:
    t0 = time.perf_counter()
    with d:
        st = ready(d, vectors=True)
        out = {"start_s": round(time.perf_counter() - t0, 2)}
        time.sleep(5)
        e = st["engines"]["embedding"]
        out.update(vectors=e["vectors"], vector_index=e["vector_index"],
                   rss_mb=round(rss_mb(d.proc.pid), 1))
        m = measure_queries(d, qs, "hybrid")
        out.update(hybrid_p50_ms=m["p50_ms"], hybrid_p95_ms=m["p95_ms"],
                   hybrid_stages_p50_ms=m["stages"])
        res = d.call("search", query=qs[0], mode="hybrid")
        out["store"] = res.get("store")
        out["rss_mb_after_queries"] = round(rss_mb(d.proc.pid), 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=Path, required=True, help="a bench/scale.py --keep folder")
    ap.add_argument("--queries", type=int, default=50)
    args = ap.parse_args()
    built = json.loads((args.keep / "built.json").read_text())
    data = args.keep / "milvus-data"
    if not data.exists():
        shutil.copytree(args.keep / "data", data, ignore=shutil.ignore_patterns("ragd.log*"))
    qs = queries(args.queries)
    result: dict = {"chunks": built["chunks"]}
    t0 = time.perf_counter()
    with daemon(args.keep, data, False) as d:
        ready(d, vectors=True)
    result["fill_s"] = round(time.perf_counter() - t0, 1)
    print(f"{built['chunks']} chunks; first start with Milvus Lite, its collection filled: "
          f"{result['fill_s']} s", flush=True)
    for local in (False, True):
        key = "local_vectors" if local else "milvus_only"
        # a start that is not measured first, for both: the local copy's first start reads
        # every vector from the cache and (past ann_threshold) builds its graph, saved when it
        # stops; and Milvus Lite's first load of the collection after the fill is slower
        with daemon(args.keep, data, local) as d:
            ready(d, vectors=True)
            while d.call("status")["engines"]["embedding"]["vector_index"].startswith(
                    "exact (building"):
                time.sleep(1)
        result[key] = measure(daemon(args.keep, data, local), qs)
        r = result[key]
        print(f"  local_vectors = {str(local).lower():<5}  RSS {r['rss_mb']} MB "
              f"({r['rss_mb_after_queries']} after the queries), vector index "
              f"{r['vector_index']!r} ({r['vectors']} vectors), start {r['start_s']} s, "
              f"hybrid p50 {r['hybrid_p50_ms']} ms (store {r['store']})", flush=True)
    a, b = result["milvus_only"], result["local_vectors"]
    result["rss_saved_mb"] = round(b["rss_mb"] - a["rss_mb"], 1)
    print(f"  ragd's copy of the vectors: {result['rss_saved_mb']} MB of RSS "
          f"(milvus only / local copy: {a['rss_mb'] / b['rss_mb']:.2f}x); hybrid p50 "
          f"{a['hybrid_p50_ms'] / b['hybrid_p50_ms']:.2f}x")
    save("milvus-memory", result)


if __name__ == "__main__":
    main()
