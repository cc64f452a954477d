"""Search while the vectors are still coming: quality at partial coverage, and latency during a
bulk embedding.

    python bench/while_embedding.py [--only coverage,latency] [--coverages 0.1,0.5]
                                    [--set dev|heldout]

coverage: a fresh daemon on a copy of obsidian-tasks-docs, embedding from scratch. When the
  share of chunks with a vector reaches each --coverages value, the main embedding engine is
  paused (SIGSTOP: coverage stays put; the query engine still embeds queries) and the dev set
  (shared/eval/obsidian-tasks) is run in bm25 and hybrid mode over the socket; then again once
  every chunk has its vector. The promise: hybrid is never below BM25. With it, the rank of the
  one note only meaning finds (HOUSEPLANT, planted in the copy): in the top 3 at any coverage.
latency: hybrid search p50 over the socket for the dev-set questions, idle, and while a second
  source (dwarvesf-brain, ~5,900 chunks) is being embedded in bulk — with the query engine
  ([embedding] query_engine = true) and without it. The promise: during bulk <= 2x idle. The
  bulk source's chunks are in the index during the bulk phase (BM25 and fetch grow with it), so
  with the query engine idle is measured again once the bulk source is embedded, on the same
  index: ratio_same_index_p50 is the fair ratio; the per-stage timings say where time went.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from common import (EMBED_MODEL, SHARED, Daemon, copy_vault, median, pct, quiet_config,
                    ready, save, write_config)
from ragctl import evaluate

QUESTIONS = SHARED / "eval" / "obsidian-tasks" / "obsidian-tasks-questions.jsonl"
# --set: the vault and its questions (the held-out set: a check, never tuned on)
SETS = {"dev": ("obsidian-tasks-docs", QUESTIONS),
        "heldout": ("dwarvesf-brain",
                    Path(__file__).resolve().parent / "heldout" / "dwarves-questions.jsonl")}


def make(tmp: Path, sources: list[dict], query_engine: bool = True) -> Daemon:
    extra = (f'[embedding]\nmodel = "{EMBED_MODEL}"\nquery_engine = '
             f'{"true" if query_engine else "false"}\n[engines]\nhealth_interval = 600\n')
    cfg = write_config(tmp / "config.toml", tmp / "data", tmp / "run" / "s.sock", sources, extra)
    return Daemon(quiet_config(cfg), tmp / "run" / "s.sock", tmp / "err.log")


def dev_eval(d: Daemon, mode: str, questions: Path = QUESTIONS) -> dict:
    qs = evaluate.load(questions)
    with d.client(timeout=120) as c:
        roots = {s["name"]: s["path"] for s in c.call("sources")}
        return evaluate.run(c, qs, mode, None, roots)


def losses(row: dict) -> list[str]:
    """The questions hybrid ranks lower than BM25: "id bm25-rank>hybrid-rank" (reciprocal
    ranks as ranks; 0: not in the top 10)."""
    def ranks(mode):
        return {r["id"]: round(1 / r["mrr@10"]) if r.get("mrr@10") else 0
                for r in row[mode]["rows"] if "mrr@10" in r}
    b, h = ranks("bm25"), ranks("hybrid")
    return [f"{i} {b[i]}>{h[i] or '-'}" for i in b
            if b[i] and (h.get(i, 0) == 0 or h[i] > b[i])]


# The question only meaning answers (tests/test_trust.py): the fig note holds none of its
# words, the two distractors hold "tree" and "losing". Written last, the fig note is the most
# recently modified, so it is embedded first; the figure is its rank in hybrid search.
HOUSEPLANT = "why is my indoor tree losing its foliage"


def plant(vault: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_trust import DISTRACTORS, FIG
    for rel, text in {**DISTRACTORS, "Plants/Fiddle-leaf fig.md": FIG}.items():
        (vault / rel).parent.mkdir(parents=True, exist_ok=True)
        (vault / rel).write_text(text)


def fig_rank(d: Daemon) -> int | None:
    res = d.call("search", query=HOUSEPLANT, mode="hybrid", k=10)
    return next((i for i, r in enumerate(res["results"], 1)
                 if r["path"].endswith("Fiddle-leaf fig.md")), None)


def coverage_case(args, tmp: Path) -> dict:
    name, questions = SETS[args.set]
    vault = copy_vault(name, tmp / "vault")
    plant(vault)
    d = make(tmp, [{"name": "tasks", "path": str(vault), "kind": "obsidian"}])
    out = {}
    with d:
        ready(d, vectors=False)
        for target in sorted(float(x) for x in args.coverages.split(",")):
            while True:
                st = d.call("status")
                e = st["engines"].get("embedding", {})
                chunks = st["sources"][0]["chunks"]
                if e.get("vectors", 0) >= target * chunks and e.get("pid"):
                    break
                time.sleep(0.2)
            os.kill(e["pid"], signal.SIGSTOP)  # coverage stays where it is while we measure
            try:
                row = {m: dev_eval(d, m, questions) for m in ("bm25", "hybrid")}
                cov = d.call("search", query="coverage", mode="hybrid")["vector_coverage"]
                rank = fig_rank(d)
            finally:
                os.kill(e["pid"], signal.SIGCONT)
            out[f"{cov:.2f}"] = {**_summary(row), "houseplant_rank": rank,
                                 "hybrid_below_bm25": losses(row)}
            print(f"  coverage {cov:.2f}: {out[f'{cov:.2f}']}", flush=True)
        ready(d, vectors=True)
        row = {m: dev_eval(d, m, questions) for m in ("bm25", "hybrid")}
        out["1.00"] = {**_summary(row), "houseplant_rank": fig_rank(d),
                       "hybrid_below_bm25": losses(row)}
        print(f"  coverage 1.00: {out['1.00']}", flush=True)
    return out


def _summary(row: dict) -> dict:
    return {m: {k: row[m]["overall"][k] for k in ("hit@1", "hit@3", "hit@5", "mrr@10")} for m in row}


def latency_case(args, tmp: Path) -> dict:
    questions = [q["question"] for q in evaluate.load(QUESTIONS)]
    out = {}
    for query_engine in (True, False):
        work = tmp / f"q{int(query_engine)}"
        vault = copy_vault("obsidian-tasks-docs", work / "vault")
        bulk = copy_vault("dwarvesf-brain", work / "bulk")
        d = make(work, [{"name": "tasks", "path": str(vault), "kind": "obsidian"}],
                 query_engine)
        with d:
            ready(d, vectors=True)
            idle, idle_st = _latencies(d, questions)
            cfg = d.config.read_text()
            d.config.write_text(cfg + f'\n[[sources]]\nname = "bulk"\npath = "{bulk}"\n'
                                      f'kind = "obsidian"\n')
            d.call("reload")
            while d.call("status")["engines"]["embedding"]["embedder"] != "embedding":
                time.sleep(0.2)
            time.sleep(2)
            busy, busy_st = _latencies(d, questions)
            e = d.call("status")["engines"]["embedding"]
            still = e["embedder"] == "embedding"
            after = after_st = None
            if query_engine:
                # the same index, the bulk source embedded and nothing running: the fair idle
                ready(d, vectors=True)
                after, after_st = _latencies(d, questions)
        key = "with_query_engine" if query_engine else "without_query_engine"
        out[key] = {"idle_p50_ms": round(median(idle), 1), "idle_p95_ms": round(pct(idle, 95), 1),
                    "bulk_p50_ms": round(median(busy), 1), "bulk_p95_ms": round(pct(busy, 95), 1),
                    "ratio_p50": round(median(busy) / median(idle), 2),
                    "bulk_still_running_at_end": still,
                    # The bulk source's chunks are in the BM25 index during the bulk phase
                    # (1.5k chunks idle, 7.5k with it): BM25 grows with the index, not with
                    # the embedding; the query's embedding is what bulk embedding can slow.
                    "idle_stages_p50_ms": {k: round(median(v), 2) for k, v in idle_st.items()},
                    "bulk_stages_p50_ms": {k: round(median(v), 2) for k, v in busy_st.items()},
                    "embed_ratio_p50": round(median(busy_st.get("embed_ms", [0]))
                                             / max(1e-9, median(idle_st.get("embed_ms", [1]))),
                                             2)}
        if after is not None:
            out[key].update({
                "idle_same_index_p50_ms": round(median(after), 1),
                "idle_same_index_stages_p50_ms": {k: round(median(v), 2)
                                                  for k, v in after_st.items()},
                "ratio_same_index_p50": round(median(busy) / median(after), 2)})
        print(f"  {key}: {out[key]}", flush=True)
        shutil.rmtree(work, ignore_errors=True)
    return out


def _latencies(d: Daemon, questions: list[str]) -> tuple[list[float], dict[str, list[float]]]:
    """Hybrid search latency over the socket, and each stage's time (the reply's timings)."""
    lat, stages = [], {}
    with d.client(timeout=120) as c:
        for q in questions[:5]:
            c.call("search", query=q, mode="hybrid")
        for q in questions:
            t = time.perf_counter()
            res = c.call("search", query=q, mode="hybrid")
            lat.append((time.perf_counter() - t) * 1e3)
            for k, v in res.get("timings", {}).items():
                stages.setdefault(k, []).append(v)
    return lat, stages


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="coverage,latency")
    ap.add_argument("--coverages", default="0.1,0.5")
    ap.add_argument("--set", default="dev", choices=sorted(SETS),
                    help="coverage: the dev set's vault and questions, or the held-out set's")
    args = ap.parse_args()
    results = {}
    for name in args.only.split(","):
        tmp = Path(tempfile.mkdtemp(prefix=f"ragd-while-{name}-"))
        try:
            print(f"== {name}", flush=True)
            results[name] = {"coverage": coverage_case, "latency": latency_case}[name](args, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    save("while_embedding" + ("" if args.set == "dev" else f"_{args.set}"), results)


if __name__ == "__main__":
    main()
