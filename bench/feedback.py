"""What hybrid search's dense feedback costs: hybrid p50 with it off and on, interleaved, on an
index built before, against the raw engine embedding the same queries.

    python bench/feedback.py --keep DIR [--queries 200] [--rounds 5] [--json]

DIR holds a config.toml and its indexed data (bench/scifact.py --keep DIR, SciFact: 9,254
chunks; bench/scale.py --keep DIR). The daemon starts on it; each round measures every query
once with search.feedback_chunks = 0, then with the default (a config reload, live), the order
alternating between rounds so that neither setting always runs on a warmer machine. Queries
are the dev set's questions and SciFact's claims, alternating (bench/scale.py's). The figures
are medians over rounds of each round's p50; the quality side is `ragctl eval` (the dev set,
SciFact), as the docstring of Searcher._feedback reports.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path

from common import EMBED_MODEL, Daemon, pct, quiet_config, ready, save
from scale import queries, raw_embed_p50

from ragd.config import Config

DEFAULT = Config.__dataclass_fields__["feedback_chunks"].default


def unset_feedback(cfg: Path) -> str:
    """Take this bench's [search] table out of the config; returns the text left."""
    text = re.sub(r"\n*# bench/feedback\.py\n\[search\]\nfeedback_chunks = \d+\n", "\n",
                  cfg.read_text())
    cfg.write_text(text)
    return text


def set_feedback(cfg: Path, chunks: int) -> None:
    text = unset_feedback(cfg)
    if "\n[search]\n" in text:
        raise SystemExit(f"{cfg}: has a [search] table; this bench adds its own")
    cfg.write_text(text + f"\n# bench/feedback.py\n[search]\nfeedback_chunks = {chunks}\n")


def p50(d: Daemon, qs: list[str], want_feedback: bool) -> float:
    lat = []
    with d.client(timeout=120) as c:
        for q in qs:
            t = time.perf_counter()
            res = c.call("search", query=q, mode="hybrid", rerank=False)
            lat.append((time.perf_counter() - t) * 1e3)
            if res.get("results") and ("feedback" in res) != want_feedback:
                raise SystemExit(f"feedback {'missing' if want_feedback else 'present'}: {q}")
    return pct(lat, 50)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=Path, required=True, help="an indexed bench folder")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", type=Path, default=EMBED_MODEL)
    ap.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    args = ap.parse_args()

    cfg = quiet_config(args.keep / "config.toml")
    set_feedback(cfg, 0)
    qs = queries(args.queries)
    runs: dict[str, list[float]] = {"off": [], "on": []}
    d = Daemon(cfg, args.keep / "run" / "ragd.sock", args.keep / "ragd.log")
    try:
        with d:
            st = ready(d, vectors=True)
            chunks = sum(s["chunks"] for s in st["sources"])
            p50(d, qs[:10], False)  # warm
            for r in range(args.rounds):
                for name in (("off", "on") if r % 2 == 0 else ("on", "off")):
                    set_feedback(cfg, DEFAULT if name == "on" else 0)
                    d.call("reload")
                    runs[name].append(p50(d, qs, name == "on"))
    finally:
        unset_feedback(cfg)
    embed = raw_embed_p50(args.model, qs, args.keep)
    off, on = statistics.median(runs["off"]), statistics.median(runs["on"])
    result = {"chunks": chunks, "queries": len(qs), "rounds": args.rounds,
              "feedback_chunks": DEFAULT, "hybrid_p50_off_ms": round(off, 2),
              "hybrid_p50_on_ms": round(on, 2), "feedback_cost_ms": round(on - off, 2),
              "embed_p50_ms": round(embed, 2), "off_over_embed": round(off / embed, 2),
              "on_over_embed": round(on / embed, 2),
              "runs_ms": {k: [round(x, 2) for x in v] for k, v in runs.items()}}
    print(f"{chunks} chunks, {len(qs)} queries x {args.rounds} rounds (medians of per-round p50)")
    print(f"  raw engine, a query         p50 {result['embed_p50_ms']} ms")
    print(f"  hybrid, feedback off        p50 {result['hybrid_p50_off_ms']} ms "
          f"({result['off_over_embed']}x the raw engine)")
    print(f"  hybrid, feedback {DEFAULT} chunks  p50 {result['hybrid_p50_on_ms']} ms "
          f"({result['on_over_embed']}x the raw engine)")
    print(f"  the feedback costs          {result['feedback_cost_ms']} ms")
    save(f"feedback-{chunks}", result)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
