"""BEIR SciFact through the real daemon: nDCG@10, recall@100 and MRR@10 for bm25, vector, hybrid.

    python bench/scifact.py [--split test|train] [--model PATH|NAME] [--keep DIR]

One Markdown file per abstract (``<id>.md``: the title as its heading, then the abstract), indexed
by a real ragd with the real engine; every query goes over the socket. A document's rank is the
rank of its best chunk. Tune on --split train; report --split test. --keep reuses an index built
before (its embeddings are cached), so a second run only searches.

Published nDCG@10 on test: BM25 0.665, all-MiniLM-L6-v2 0.645, bge-small-en-v1.5 0.713.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from pathlib import Path

from common import EMBED_MODEL, SHARED, Daemon, median, ready, save, write_config

DATA = SHARED / "eval" / "scifact"


def load(split: str):
    queries = {}
    for line in open(DATA / f"queries-{split}.jsonl", encoding="utf-8"):
        q = json.loads(line)
        queries[q["_id"]] = q["text"]
    qrels: dict[str, set[str]] = {}
    with open(DATA / f"qrels-{split}.tsv", encoding="utf-8") as f:
        next(f)
        for line in f:
            qid, did, score = line.split("\t")
            if int(score) > 0:
                qrels.setdefault(qid, set()).add(did)
    return {q: t for q, t in queries.items() if q in qrels}, qrels


def write_corpus(folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    for line in open(DATA / "corpus.jsonl", encoding="utf-8"):
        doc = json.loads(line)
        title = " ".join(doc["title"].split())
        (folder / f"{doc['_id']}.md").write_text(f"# {title}\n\n{doc['text'].strip()}\n",
                                                encoding="utf-8")
        n += 1
    return n


def metrics(ranked: list[str], relevant: set[str]) -> tuple[float, float, float]:
    dcg = sum(1 / math.log2(i + 2) for i, d in enumerate(ranked[:10]) if d in relevant)
    idcg = sum(1 / math.log2(i + 2) for i in range(min(len(relevant), 10)))
    recall = len(relevant & set(ranked[:100])) / len(relevant)
    mrr = next((1 / (i + 1) for i, d in enumerate(ranked[:10]) if d in relevant), 0.0)
    return dcg / idcg, recall, mrr


def evaluate(d: Daemon, queries, qrels, mode: str, k: int = 400) -> dict:
    """k chunks per query, so that the documents they belong to fill the top 100 that
    recall@100 counts (several chunks of one abstract count once, at its best rank)."""
    scores, lat = [], []
    with d.client(timeout=120) as c:
        for qid, text in queries.items():
            t = time.perf_counter()
            res = c.call("search", query=text, k=k, mode=mode, rerank=False)
            lat.append((time.perf_counter() - t) * 1e3)
            ranked: list[str] = []
            for r in res["results"]:
                doc = Path(r["path"]).stem
                if doc not in ranked:
                    ranked.append(doc)
            scores.append(metrics(ranked, qrels[qid]))
    n = len(scores)
    return {"ndcg@10": sum(s[0] for s in scores) / n, "recall@100": sum(s[1] for s in scores) / n,
            "mrr@10": sum(s[2] for s in scores) / n, "p50_ms": median(lat)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--split", default="test", choices=["test", "train"])
    ap.add_argument("--model", default=str(EMBED_MODEL))
    ap.add_argument("--keep", type=Path, help="build or reuse the index in this folder")
    ap.add_argument("--extra", default="", help="TOML appended to the config (for tuning)")
    ap.add_argument("--label", default="", help="saved as scifact-SPLIT-LABEL.json")
    args = ap.parse_args()

    work = args.keep or Path(tempfile.mkdtemp(prefix="ragd-scifact-"))
    try:
        corpus = work / "corpus"
        if not corpus.exists():
            print(f"writing {write_corpus(corpus)} abstracts", flush=True)
        cfg = write_config(work / "config.toml", work / "data", work / "run" / "ragd.sock",
                           [{"name": "scifact", "path": str(corpus)}],
                           f'[embedding]\nmodel = "{args.model}"\n' + args.extra)
        d = Daemon(cfg, work / "run" / "ragd.sock", work / "ragd.log")
        t0 = time.perf_counter()
        with d:
            st = ready(d, vectors=True)
            e = st["engines"]["embedding"]
            print(f"index ready in {time.perf_counter() - t0:.0f}s: "
                  f"{st['sources'][0]['files']} files, {st['sources'][0]['chunks']} chunks, "
                  f"{e['embedded_texts']} texts embedded now ({e['embedded_tokens']} tokens, "
                  f"{e['truncated']} truncated)", flush=True)
            queries, qrels = load(args.split)
            rows = {mode: evaluate(d, queries, qrels, mode) for mode in ("bm25", "vector", "hybrid")}
        print(f"\nSciFact {args.split} ({len(queries)} queries), model {Path(args.model).name}")
        print(f"{'mode':<8} {'nDCG@10':>8} {'R@100':>7} {'MRR@10':>7} {'p50 ms':>7}")
        for mode, r in rows.items():
            print(f"{mode:<8} {r['ndcg@10']:8.4f} {r['recall@100']:7.4f} {r['mrr@10']:7.4f} "
                  f"{r['p50_ms']:7.1f}")
        save(f"scifact-{args.split}" + (f"-{args.label}" if args.label else ""), rows)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
