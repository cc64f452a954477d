"""Fusing two rankings of chunks (BM25's, the vectors') into one: convex (the default), RRF,
and both while vectors are still coming. Pure functions of the ranked lists and their scores;
Searcher (hybrid.py) chooses which, and docs/quality.md holds what each was measured to give.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ragd.text import STOPWORDS, content_terms, plain_words

# Below this share of chunks with a vector, hybrid keeps BM25's places and scores (the vector
# side orders the embedded candidates among their own places: in_slots; adds what BM25 did not
# find, after it; and lifts a match by meaning clear enough to trust: Searcher._trusted): a
# fusion with a partial vector list ranks embedded chunks above the unembedded ones that
# answer. Above it, the fusion counts a chunk still without a
# vector as BM25 does: an edit's few chunks waiting for their vectors do not switch the
# ranking. Dense feedback needs it too: its first fusion's best chunks would be BM25's alone.
PARTIAL_FUSION_FROM = 0.95


@dataclass
class Candidate:
    """A chunk as a ranking holds it: its id, its score, and every signal's part in it (the
    reply's `scores`). An editor's unsaved buffer's chunk has a negative id (buffers.py)."""
    chunk_id: int
    score: float
    parts: dict = field(default_factory=dict)


def unit(v) -> np.ndarray:
    """v (a vector or rows of vectors) scaled to length 1."""
    v = np.asarray(v, dtype=np.float32)
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-9)


def vector_weight(query: str) -> float:
    """The vector ranking's weight in the fusion: half for a few typed keywords (at most three
    content words, and no question or filler word). Keywords are BM25's strength; a question
    is the vectors', however few its content words."""
    return 0.5 if len(content_terms(query)) <= 3 and not any(
        w in STOPWORDS for w in plain_words(query)) else 1.0


def rrf(lists: dict[str, list[int]], k: int = 60,
        weights: dict[str, float] | None = None) -> dict[int, float]:
    """Reciprocal Rank Fusion: each list adds weight / (k + rank) to the chunks it ranks."""
    scores: dict[int, float] = {}
    for name, ranked in lists.items():
        w = 1.0 if weights is None else weights.get(name, 1.0)
        for rank, cid in enumerate(ranked, 1):
            scores[cid] = scores.get(cid, 0.0) + w / (k + rank)
    return scores


def partial_rrf(lists: dict[str, list[int]], k: int, weights: dict[str, float],
                coverage: float, unembedded) -> dict[int, float]:
    """RRF while vectors are still being built (coverage < 1): the vector list ranks only the
    chunks embedded so far, so a chunk's rank in it is about coverage x its rank in the whole
    corpus — taken as rank / coverage; and a chunk BM25 found that has no vector yet is given
    its BM25 rank on the vector side too (no opinion, rather than a vote against it). At full
    coverage this is plain weighted RRF."""
    if coverage >= 1.0 or "vector" not in lists:
        return rrf(lists, k, weights)
    w = weights.get("vector", 1.0)
    fused = rrf({name: ids for name, ids in lists.items() if name != "vector"}, k, weights)
    for rank, cid in enumerate(lists["vector"], 1):
        fused[cid] = fused.get(cid, 0.0) + w / (k + rank / max(coverage, 1e-3))
    unembedded = set(unembedded)
    for rank, cid in enumerate(lists.get("bm25", ()), 1):
        if cid in unembedded:
            fused[cid] += w / (k + rank)
    return fused


def minmax(scores: list[float]) -> list[float]:
    """Scores scaled to 0..1 over their list (all 1 when they are equal: one hit, or ties)."""
    lo, hi = min(scores, default=0.0), max(scores, default=0.0)
    return [(x - lo) / (hi - lo) for x in scores] if hi > lo else [1.0] * len(scores)


def convex(lists: dict[str, list[int]], parts: dict[int, dict], share: float,
           unembedded=()) -> dict[int, float]:
    """Convex fusion: share x the cosine + (1 - share) x the BM25 score, each scaled min-max over
    its own list (a chunk missing from a list gets 0 from it). Unlike RRF it keeps how far apart
    the scores are — a clear first BM25 hit stays clear, a flat tail stays flat. A chunk BM25
    found that has no vector yet (an edit being embedded) gets its BM25 value on the vector
    side too: no opinion, rather than a vote against it. (Bruch et al., "An analysis of fusion
    functions for hybrid retrieval", TOIS 2023, found convex fusion better than RRF on BEIR,
    in and out of domain, with a share tuned on few queries.)"""
    scaled = {name: dict(zip(ids, minmax([parts[c][name] for c in ids])))
              for name, ids in lists.items() if name in ("bm25", "vector")}
    fused: dict[int, float] = {}
    for name, w in (("bm25", 1.0 - share), ("vector", share)):
        for cid, x in scaled.get(name, {}).items():
            fused[cid] = fused.get(cid, 0.0) + w * x
    if "vector" in lists:
        bm = scaled.get("bm25", {})
        for cid in bm.keys() & set(unembedded):
            fused[cid] += share * bm[cid]
    return fused


def bm25_order(lists: dict[str, list[int]], parts: dict[int, dict]) -> dict[int, float]:
    """BM25's own scores (as mode bm25 ranks), then what only the vectors found, below every
    BM25 hit in the vectors' order: the fusion while vectors are still coming."""
    fused = {c: parts[c]["bm25"] for c in lists.get("bm25", ())}
    floor = min(fused.values(), default=1.0)
    for rank, cid in enumerate(lists.get("vector", ()), 1):
        fused.setdefault(cid, floor * 0.5 / rank)
    return fused


def in_slots(lists: dict[str, list[int]], parts: dict[int, dict], fused: dict[int, float],
             cosines: dict[int, float], share: float) -> None:
    """While vectors are coming: BM25's candidates that have their vectors (`cosines`: the
    query's cosine to each) are ordered among their own places in BM25's list by the convex
    fusion of the two, each place keeping its score; those without a vector keep theirs. Both
    signals are known only for those, so only among those does the vectors' opinion decide.
    The cosines are scaled over the vector list's and theirs together (what it gave:
    docs/quality.md, "Search while vectors are coming")."""
    ids = [c for c in lists.get("bm25", ()) if c in cosines]
    if len(ids) < 2:
        return
    bm = lists["bm25"]
    b = dict(zip(bm, minmax([parts[c]["bm25"] for c in bm])))
    seen = [parts[c]["vector"] for c in lists.get("vector", ())] + list(cosines.values())
    lo, hi = min(seen), max(seen)
    v = {c: (cosines[c] - lo) / (hi - lo) if hi > lo else 1.0 for c in ids}
    order = sorted(ids, key=lambda c: -((1 - share) * b[c] + share * v[c]))
    slots = [fused[c] for c in ids]
    rank = {c: i for i, c in enumerate(bm, 1)}
    for c, s, held in zip(order, slots, ids):
        fused[c] = s
        if c != held:  # (--explain: whose place it took)
            parts[c]["place_of_bm25_rank"] = rank[held]


def effective_share(share: float, vector_weight: float) -> float:
    """The vector share of convex fusion with the vector ranking weighted (vector_weight): the
    same odds as RRF's weights, share x w against (1 - share)."""
    v = share * vector_weight
    return v / (v + 1.0 - share) if v + 1.0 - share > 0 else share


def lift(items: list, match, rank: int) -> int | None:
    """Move the first item that `match`es up to `rank` (1-based) when it is below it; returns
    the rank it had then, or None when it was not moved. The moved item's score becomes that
    of the item it now stands before, so that scores still read in rank order (a chunk's own
    fused score stays in its parts)."""
    at = next((i for i, x in enumerate(items) if match(x)), None)
    if at is None or at < rank:
        return None
    moved = items.pop(at)
    items.insert(rank - 1, moved)
    below = items[rank].score if rank < len(items) else moved.score
    moved.score = max(moved.score, below)
    return at + 1
