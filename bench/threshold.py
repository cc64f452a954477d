"""Measure a "nothing relevant" threshold for an embedding model.

    python bench/threshold.py --keep DIR [--model PATH]

Against the SciFact index (built by bench/scifact.py --keep DIR), it compares the best cosine of
in-domain queries (the SciFact *train* claims, each with a relevant abstract) with that of
out-of-domain queries (sentences from the obsidian-hub notes: software and note-taking, nothing a
biomedical corpus answers). Prints both distributions and, for candidate thresholds, the share
of in-domain queries wrongly answered "nothing relevant" and the share of out-of-domain queries
rightly rejected. The registry default is chosen to lose at most 1% of in-domain queries.
"""

from __future__ import annotations

import argparse
import random
import re
from pathlib import Path

from common import EMBED_MODEL, VAULTS, Daemon, pct, ready, write_config
from scifact import load


def ood_queries(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    notes = sorted((VAULTS / "obsidian-hub").rglob("*.md"))
    out = []
    while len(out) < n:
        lines = [ln.strip("#-* ") for ln in rng.choice(notes).read_text(errors="replace")
                 .splitlines() if len(re.findall(r"[A-Za-z]{3,}", ln)) >= 6 and "http" not in ln]
        if lines:
            words = rng.choice(lines).split()
            out.append(" ".join(words[:15]))
    return out


def best(d: Daemon, queries: list[str]) -> list[float]:
    out = []
    with d.client() as c:
        for q in queries:
            out.append(c.call("search", query=q, k=1, mode="vector", rerank=False)
                       ["best_similarity"])
    return sorted(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=Path, required=True)
    ap.add_argument("--model", default=str(EMBED_MODEL))
    args = ap.parse_args()
    work = args.keep
    cfg = write_config(work / "threshold.toml", work / "data", work / "run" / "ragd.sock",
                       [{"name": "scifact", "path": str(work / "corpus")}],
                       f'[embedding]\nmodel = "{args.model}"\n[search]\nmin_similarity = 0.0\n')
    d = Daemon(cfg, work / "run" / "ragd.sock", work / "threshold.log")
    with d:
        ready(d, vectors=True)
        queries, _ = load("train")
        inside = best(d, list(queries.values()))
        outside = best(d, ood_queries(300))

    print(f"best cosine, in-domain ({len(inside)} SciFact train claims): "
          f"p1 {pct(inside, 1):.3f}  p5 {pct(inside, 5):.3f}  p50 {pct(inside, 50):.3f}")
    print(f"best cosine, out-of-domain ({len(outside)} note sentences): "
          f"p50 {pct(outside, 50):.3f}  p95 {pct(outside, 95):.3f}  max {outside[-1]:.3f}")
    print(f"{'threshold':>9} {'in-domain lost':>15} {'out-of-domain rejected':>23}")
    for t in [x / 100 for x in range(10, 50, 5)]:
        lost = sum(v < t for v in inside) / len(inside)
        rejected = sum(v < t for v in outside) / len(outside)
        print(f"{t:9.2f} {lost:15.1%} {rejected:23.1%}")
    safe = max((t / 100 for t in range(0, 100)
                if sum(v < t / 100 for v in inside) / len(inside) <= 0.01), default=0.0)
    print(f"highest threshold losing <= 1% of in-domain queries: {safe:.2f}")


if __name__ == "__main__":
    main()
