"""Hybrid ranking: BM25 (tantivy or FTS5) and dense vectors, fused, optionally reranked by a
cross-encoder.

    vector top-N ┐                     vector top-N of the query moved
                 ├─ RRF ─ best chunks ─ towards those chunks' vectors ┐
    BM25 top-N   ┘                                                    ├─ convex fusion ─ ...
    BM25 top-N  ──────────────────────────────────────────────────────┘   (or RRF, k=60)
    ... ─ threshold ─ rerank top-M within a time budget ─ top k

RRF adds 1/(k + rank) over the lists a chunk appears in; it only chooses the feedback chunks
(Searcher._feedback), unless search.fusion = "rrf". The final fusion mixes the two scores, each
scaled over its list (convex). The threshold looks at the best cosine of the query itself:
below it the answer is "nothing relevant" (no results, with the reason), and nothing is
reranked — unless some chunk contains every word of the query (a literal match), which is
answered as usual with ``below_threshold``. When the embedding
engine is down, search answers from BM25 alone and says so (``degraded``); when the reranker is
down or slow, the fused order is returned and the reply says it was not reranked.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np


from ragd.engines.client import EngineError, EngineUnavailable
from ragd.search import bm25, boilerplate, notes
from ragd.search.filters import Filters
from ragd.text import (COMMON_SHARE, HYBRID_COMMON_SHARE, chunk_rows, content_terms,
                       note_terms, symbols)

MODES = ("hybrid", "vector", "bm25")


def _unit(v) -> np.ndarray:
    """v (a vector or rows of vectors) scaled to length 1."""
    v = np.asarray(v, dtype=np.float32)
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-9)


def _done(value) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut


def vector_weight(query: str) -> float:
    """The vector ranking's weight in the fusion: half for a query of at most three content
    words. A few typed keywords are BM25's strength (dev set: BM25 MRR 0.94 on keyword
    queries, vectors 0.69). Giving long questions more vector weight helped the dev set's
    paraphrases but hurt SciFact's claims (train nDCG@10 -0.004): not kept."""
    return 0.5 if len(content_terms(query)) <= 3 else 1.0


@dataclass
class Candidate:
    chunk_id: int
    score: float
    parts: dict = field(default_factory=dict)


def rrf(lists: dict[str, list[int]], k: int = 60,
        weights: dict[str, float] | None = None) -> dict[int, float]:
    """Reciprocal Rank Fusion: each list adds weight / (k + rank) to the chunks it ranks."""
    scores: dict[int, float] = {}
    for name, ranked in lists.items():
        w = 1.0 if weights is None else weights.get(name, 1.0)
        for rank, cid in enumerate(ranked, 1):
            scores[cid] = scores.get(cid, 0.0) + w / (k + rank)
    return scores


# Below this share of chunks with a vector, hybrid keeps BM25's scores and order (the vector
# side only adds what BM25 did not find, after it, and lifts a match by meaning clear enough
# to trust: Searcher._trusted): a fusion with a partial vector list ranks embedded chunks
# above the unembedded ones that answer (docs/quality.md). Above it, the fusion counts a
# chunk still without a vector as BM25 does: an edit's few chunks waiting for their vectors
# do not switch the ranking.
PARTIAL_FUSION_FROM = 0.95

def _lift(items: list, match, rank: int, info: dict) -> None:
    """Move the first item that `match`es up to `rank` (1-based) when it is below it."""
    at = next((i for i, x in enumerate(items) if match(x)), None)
    if at is not None and at >= rank:
        items.insert(rank - 1, items.pop(at))
        info["trusted"]["lifted_from"] = at + 1

# When no chunk holds a word of the query, a match by meaning alone must be this much above
# the similarity threshold to be shown (Searcher._anything_relevant).
MEANING_MARGIN = 0.1
# The rank a match by meaning that clear (Searcher._trusted) is lifted to when below it: while
# vectors are coming (BM25's order otherwise), and once they are all in (fused).
TRUSTED_RANK = 2
TRUSTED_RANK_FULL = 3


def partial_rrf(lists: dict[str, list[int]], k: int, weights: dict[str, float],
                coverage: float, unembedded) -> dict[int, float]:
    """RRF while vectors are still being built (coverage < 1): the vector list ranks only the
    chunks embedded so far, so a chunk's rank in it is about coverage x its rank in the whole
    corpus — taken as rank / coverage; and a chunk BM25 found that has no vector yet is given
    its BM25 rank on the vector side too (no opinion, rather than a vote against it). At full
    coverage this is plain weighted RRF. Dev set MRR@10 (bench/while_embedding.py), hybrid
    against BM25's 0.642: 0.604 at 10% coverage, 0.632 at 50% (weighting the vector list by the
    coverage instead: 0.597 and 0.511; this and the coverage weight together: 0.607, 0.622).
    Still a little below BM25: RRF's flattening of BM25's scores costs on its own."""
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


def _minmax(scores: list[float]) -> list[float]:
    """Scores scaled to 0..1 over their list (all 1 when they are equal: one hit, or ties)."""
    lo, hi = min(scores, default=0.0), max(scores, default=0.0)
    return [(x - lo) / (hi - lo) for x in scores] if hi > lo else [1.0] * len(scores)


def convex(lists: dict[str, list[int]], parts: dict[int, dict], share: float,
           unembedded=()) -> dict[int, float]:
    """Convex fusion: share x the cosine + (1 - share) x the BM25 score, each scaled min-max over
    its own list (a chunk missing from a list gets 0 from it). Unlike RRF it keeps how far apart
    the scores are — a clear first BM25 hit stays clear, a flat tail stays flat. A chunk BM25
    found that has no vector yet (an edit being embedded) gets its BM25 value on the vector
    side too: no opinion, rather than a vote against it.

    Measured through the daemon (ragctl eval, 2026-12-01), RRF (k=60) -> convex at share 0.6,
    both after dense feedback: dev set MRR@10 0.838 -> 0.841 (hit@3 0.86 -> 0.88, hit@5 0.94 ->
    0.90; 0.838 -> 0.831 once comment-only sections stopped being chunks: one question),
    SciFact train nDCG@10 0.721 -> 0.732, test 0.717 -> 0.725. Share 0.5 was better on SciFact
    (train 0.737) and worse on the dev set (0.818); 0.7 worse on both (README, Quality).
    Bruch et al., "An analysis of fusion functions for hybrid retrieval" (TOIS 2023), found the
    same of convex fusion against RRF on BEIR, in and out of domain, with a share tuned on few
    queries."""
    scaled = {name: dict(zip(ids, _minmax([parts[c][name] for c in ids])))
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


def effective_share(share: float, vector_weight: float) -> float:
    """The vector share of convex fusion with the vector ranking weighted (vector_weight): the
    same odds as RRF's weights, share x w against (1 - share)."""
    v = share * vector_weight
    return v / (v + 1.0 - share) if v + 1.0 - share > 0 else share


NOTE_CANDIDATES = 100  # notes the note-level BM25 scores (then scaled 0..1 over them)


def note_evidence(db: sqlite3.Connection, query: str, weight: float, dfs: dict | None = None,
                  overlay=None, bufs=(), exclude=()) -> dict[int, tuple[float, float, int]]:
    """A note's words as one document: file id -> (what it adds to the note's score, its BM25
    score, its rank), for the best NOTE_CANDIDATES notes by the BM25 of their whole text; the
    score scaled 0..1 over them, times `weight`. notes.group adds it to notes ranked by their
    chunks (a note no chunk brought gains nothing: it has no chunk to show). An editor's
    unsaved buffer (`bufs`, of the BufferStore `overlay`) is scored as its note would be, in
    place of its file (`exclude`).

    Why: a chunk is scored on its own words, so a note whose sections each hold some words of
    the question ranks below one chunk holding most of them. Callan ("Passage-level evidence in
    document retrieval", SIGIR 1994) found the best passage and the whole document together
    better than either. Measured through the daemon (ragctl eval, 2026-12-01), note_weight
    0 -> 0.25: dev set hybrid MRR@10 0.831 -> 0.842 (hit@5 0.90 -> 0.94), BM25 alone 0.662 ->
    0.685; SciFact train nDCG@10 hybrid 0.732 -> 0.736, BM25 0.696 -> 0.701 (test: hybrid
    0.725 -> 0.729, BM25 0.692 -> 0.686). 0.5 lost on the dev set (README, Quality). Cost:
    +2.6 ms a hybrid search at 9k chunks, +6.6 ms at 100k, +11.6 ms at 1M (FTS5 scores every
    note holding a word it is given: NOTE_COMMON_SHARE, NOTE_POSTINGS)."""
    parts = note_terms(db, query, dfs)
    scores = bm25.note_search(db, parts, NOTE_CANDIDATES + len(exclude))
    for fid in exclude:  # files an unsaved buffer stands in for: the buffer is scored instead
        scores.pop(fid, None)
    if bufs and overlay is not None:
        scores.update(overlay.note_scores(db, parts, bufs))
    scores = dict(sorted(scores.items(), key=lambda x: -x[1])[:NOTE_CANDIDATES])
    if not scores:
        return {}
    scaled = dict(zip(scores, _minmax(list(scores.values()))))
    return {fid: (weight * scaled[fid], round(x, 6), rank)
            for rank, (fid, x) in enumerate(scores.items(), 1)}


class Searcher:
    def __init__(self, cfg, engines, vectors, buffers=None, backend=None, text=None):
        self.cfg = cfg
        self.backend = backend  # index/milvus.py: serves both rankings once in sync
        self.text = text  # index/textindex.py: serves the BM25 ranking once filled
        self.engines = engines
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="query-embed")
        self.vectors = vectors  # the VectorStore (index/vectorstore.py)
        self.buffers = buffers  # unsaved editor buffers (index/buffers.py), an overlay

    def threshold(self) -> float:
        """search.min_similarity when set, else the embedding model's measured one: the
        registry's, also for a GGUF given by path that the registry model's probe recognised
        (VectorStore.open)."""
        if self.cfg.min_similarity >= 0:
            return self.cfg.min_similarity
        model = self.engines.embed_model
        if model is None:
            return 0.0
        space = self.vectors.active
        if not model.min_similarity and space is not None and space.recognised is not None:
            return space.recognised.min_similarity
        return model.min_similarity

    def run(self, db: sqlite3.Connection, query: str, k: int, mode: str,
            filters: Filters | None, rerank: bool | None,
            group: str = "chunk", text_view=None) -> tuple[list[Candidate], dict]:
        """Rank chunks for the query. Returns (candidates best first, reply fields). For
        group "note" the reranker sees the best chunk of each of the top notes, and the
        fields hold `note_evidence` (note_evidence, for notes.group). text_view: what
        TextIndex.view gave for this snapshot (the tantivy searcher, or why not)."""
        filters = filters or Filters()
        dfs: dict = {}  # the query words' chunk counts: the chunk ranking's, for the notes
        timings: dict[str, float] = {}
        bufs = self.buffers.active() if self.buffers is not None else []
        if bufs:  # the buffers stand in for their files
            filters = dataclasses.replace(filters, exclude_files=tuple(
                b.file_id for b in bufs if b.file_id is not None))
            bufs = [b for b in bufs if filters.admits_buffer(b.source, b.rel)]
        info: dict = {"mode": mode, "reranked": False, "timings": timings}
        # the Milvus collection this search reads (taken once), or None: SQLite
        view = self.backend.view if self.backend is not None and self.backend.serving \
            else None
        if self.backend is not None:
            info["store"] = "milvus" if view else f"sqlite (milvus {self.backend.state})"
        n = max(self.cfg.search_candidates, k)
        # the files the filters let through, read once (each ranking applies them); None when
        # that is every file: a filter that keeps everything costs nothing (an 18k-id term set
        # cost tantivy 11 ms a search at 100k chunks)
        files = filters.file_ids(db) if filters.active else None
        if files is not None and len(files) == db.execute("SELECT COUNT(*) FROM files"
                                                          ).fetchone()[0]:
            files = None
        if files is not None and len(files) == 0 and not bufs:  # not "nothing relevant"
            info["reason"] = "no indexed note passes the filters"
            info["filtered_out"] = True
            return [], info
        lists: dict[str, list[int]] = {}
        parts: dict[int, dict] = {}
        signed = False  # a chunk holds a symbol of the query (see _bm25_ranking)

        if mode in ("hybrid", "vector") and "embedding" not in self.engines.configured:
            mode = info["mode"] = "bm25"  # dense search is off by configuration: not degraded
        # The query's embedding is asked for first and BM25 runs while the engine works on it:
        # a hybrid search costs max(embedding, BM25), not their sum.
        embedding = self._embed_query(query, info) if mode in ("hybrid", "vector") else None
        if mode == "hybrid":
            # while vectors are coming hybrid keeps BM25's ranking: the one mode bm25 gives
            space = self.vectors.active
            coverage = self._coverage(db, space.vectors) if space is not None else 1.0
            prune = (HYBRID_COMMON_SHARE if coverage >= PARTIAL_FUSION_FROM
                     else COMMON_SHARE)
            signed = self._bm25_ranking(db, query, n, filters, files, bufs, lists, parts, info,
                                        view, text_view, prune, dfs)
        query_vector = None
        if mode in ("hybrid", "vector"):
            got = self._vector_ranking(db, embedding, n, files, lists, parts, info, view, bufs)
            if not isinstance(got, str):
                query_vector = got
            else:
                info["degraded"] = True
                info["reason"] = got
                info["requested_mode"] = mode
                if mode == "vector":
                    signed = self._bm25_ranking(db, query, n, filters, files, bufs, lists, parts,
                                                info, view, text_view, dfs=dfs)
                mode = info["mode"] = "bm25"
        elif mode == "bm25":
            signed = self._bm25_ranking(db, query, n, filters, files, bufs, lists, parts, info,
                                        view, text_view, dfs=dfs)
        t = time.perf_counter()

        if not self._anything_relevant(db, query, mode, filters, lists, info, signed):
            return [], info
        if lists.get("vector"):
            head = lists["vector"][:5]
            common = boilerplate.shared(db, head)
            first = next((c for c in head if c not in common), head[0])
            info["_vfirst"] = (first, parts[first]["vector"])
        weights = {"vector": vector_weight(query), "bm25": 1.0}
        coverage = info.get("vector_coverage", 1.0)
        if mode == "hybrid" and coverage >= PARTIAL_FUSION_FROM:
            self._feedback(db, query_vector, n, files, lists, parts, weights, info, view, bufs)
        for name, ranked_ids in lists.items():  # each signal's rank, for --explain
            for rank, cid in enumerate(ranked_ids, 1):
                parts[cid][f"{name}_rank"] = rank
        if mode == "hybrid":
            info["weights"] = weights
            unembedded = info.pop("unembedded", ())
            if coverage < PARTIAL_FUSION_FROM and "vector" in lists:
                # BM25's own scores and order (as mode bm25 ranks), then what only the
                # vectors found, below every BM25 hit; a match by meaning clear enough to
                # trust is lifted (_trusted)
                info["fusion"] = "bm25 order: vectors still coming"
                fused = {c: parts[c]["bm25"] for c in lists.get("bm25", ())}
                floor = min(fused.values(), default=1.0)
                for rank, cid in enumerate(lists["vector"], 1):
                    fused.setdefault(cid, floor * 0.5 / rank)
                key = None  # (no fused score: BM25's own)
            elif self.cfg.fusion == "convex" and "vector" in lists:
                info["fusion"] = "convex"
                share = round(effective_share(self.cfg.vector_share, weights["vector"]), 4)
                info["weights"] = {"vector": share, "bm25": round(1.0 - share, 4)}
                fused = convex(lists, parts, share, unembedded)
                key = "fused"
            elif "vector" not in lists:  # every cosine was below the threshold
                info["fusion"] = "bm25 only: vectors below the threshold"
                fused = {c: parts[c]["bm25"] for c in lists.get("bm25", ())}  # as mode bm25
                key = None
            else:
                info["fusion"] = "rrf"
                fused = partial_rrf(lists, self.cfg.rrf_k, weights, coverage, unembedded)
                key = "rrf"
            if "vector" in lists:
                self._cut_weak_tail(fused, parts, info)
            for cid, s in fused.items() if key else ():
                parts[cid][key] = round(s, 6)
            order = sorted(fused, key=lambda c: -fused[c])
            ranked = [Candidate(c, fused[c], parts[c]) for c in order]
        else:
            key = "vector" if mode == "vector" else "bm25"
            ranked = [Candidate(c, parts[c][key], parts[c]) for c in lists.get(key, [])]

        if ranked:
            common = boilerplate.shared(db, [c.chunk_id for c in ranked])
            for c in ranked:
                if c.chunk_id in common:
                    c.score *= boilerplate.weight(common[c.chunk_id])
                    c.parts["shared_by"] = common[c.chunk_id]
            if common:
                ranked.sort(key=lambda c: -c.score)
        trusted = self._trusted(info.pop("_vfirst", None), mode, coverage)
        if trusted is not None:
            info["trusted"] = trusted
        timings["fusion_ms"] = round((time.perf_counter() - t) * 1e3, 2)
        if rerank is None:  # the default: rerank when a reranker is configured
            rerank = self.cfg.rerank and "reranker" in self.engines.configured
        if rerank and ranked:
            top = (notes.firsts(db, ranked, self.cfg.rerank_top, self.buffers)
                   if group == "note" else ranked[:self.cfg.rerank_top])
            self._rerank(db, query, ranked, top, info)
        if trusted is not None and group == "chunk" and not info["reranked"]:
            _lift(ranked, lambda c: c.chunk_id == trusted["chunk_id"], trusted["rank"], info)
        if group == "note" and self.cfg.note_weight > 0 and ranked and view is None \
                and not info["reranked"]:  # (the reranker's order stands: notes.group)
            # (Milvus serving: its BM25 is not FTS5's; the notes' own rows are not used)
            if key == "fused":  # convex: the BM25 share of the mix
                weight = self.cfg.note_weight * info["weights"]["bm25"]
            elif key is None or mode == "bm25" or info.get("fusion", "").startswith("bm25"):
                weight = self.cfg.note_weight * max(c.score for c in ranked)  # BM25's scale
            else:  # RRF and vector search rank as they did
                weight = 0.0
            if weight > 0:
                t = time.perf_counter()
                info["note_evidence"] = note_evidence(db, query, weight, dfs,
                                                      self.buffers, bufs, filters.exclude_files)
                timings["notes_bm25_ms"] = round((time.perf_counter() - t) * 1e3, 2)
        return ranked, info

    def _anything_relevant(self, db, query: str, mode: str, filters: Filters,
                           lists: dict[str, list[int]], info: dict, signed: bool) -> bool:
        """'Nothing relevant' when neither signal has anything: no vector above the similarity
        threshold, and no chunk holding a content word or a symbol (`signed`) of the query
        (question and filler words alone do not count). Below the threshold the vector list
        is dropped and BM25 answers, flagged below_threshold. When no chunk holds a word of
        the query, meaning alone must clear a higher bar (meaning_bar): a word no note holds
        ("sourdough") is near the threshold to some chunk of any large vault."""
        thr = self.threshold()
        best = info.get("best_similarity", 1.0)
        weak_vectors = "vector" in lists and best < thr
        if mode == "vector":
            if weak_vectors:
                # a chunk holding every word of the query is a literal match, relevant
                # whatever the cosine (rare names and identifiers embed poorly)
                if not bm25.all_terms_match(db, query, filters):
                    return self._nothing(info, filters.narrowed, "vector")
                info["below_threshold"] = True
            return True
        keywords = bool(lists.get("bm25")) and (signed or bm25.content_match(db, query, filters)
                                                or any(c < 0 for c in lists["bm25"]))
        if not keywords and "vector" in lists and not weak_vectors and thr > 0:
            bar = round(thr + MEANING_MARGIN, 4)
            info["meaning_bar"] = bar
            if best < bar:
                return self._nothing(info, filters.narrowed, "meaning")
        if weak_vectors:
            del lists["vector"]
            if not keywords:
                return self._nothing(info, filters.narrowed, "hybrid")
            # While vectors are still coming, no close match among the chunks embedded so far
            # is no finding (a source just added has none: best similarity -1): not flagged,
            # so it does not make the answer low-confidence ("ask" refused a question every
            # word of which its note holds, a fresh-user trial)
            if info.get("vector_coverage", 1.0) >= 1.0:
                info["below_threshold"] = True
        elif mode == "bm25" and not keywords:
            return self._nothing(info, filters.narrowed, "bm25")
        return True

    def _trusted(self, first, mode: str, coverage: float) -> dict | None:
        """The chunk the vectors rank first for the query itself (before dense feedback; not
        boilerplate) when its cosine clears the threshold by MEANING_MARGIN: a match by meaning
        this clear is never buried under keyword matches of the question's words ("why is my
        indoor tree losing its foliage": the fig note 28th behind AVL trees while vectors were
        coming, 4th after feedback). Hybrid only; its note is lifted to TRUSTED_RANK (while
        vectors are coming) or TRUSTED_RANK_FULL."""
        thr = self.threshold()
        if first is None or mode != "hybrid" or thr <= 0 or first[1] < thr + MEANING_MARGIN:
            return None
        return {"chunk_id": first[0], "cosine": round(first[1], 4),
                "rank": TRUSTED_RANK if coverage < 1.0 else TRUSTED_RANK_FULL}

    def _cut_weak_tail(self, ranked: dict[int, float], parts: dict[int, dict],
                       info: dict) -> None:
        """Hybrid: drop from `ranked` the chunks found by meaning alone (no BM25 hit) whose
        cosine is below the similarity threshold (below meaning_bar when no chunk holds a word
        of the query): by the threshold's own measure they are not relevant, and a word found
        in one note came back with nine notes of similarity 0.25 after it. Not in vector
        search, where nothing else stands in. After dense feedback the cosine compared is the
        moved query's (what the fusion used)."""
        floor = info.get("meaning_bar") or self.threshold()
        if floor <= 0:  # no threshold (0: off)
            return
        weak = [c for c in ranked
                if "bm25" not in parts[c] and parts[c].get("vector", floor) < floor]
        for c in weak:
            del ranked[c]
        if weak:
            info["cut_below_threshold"] = len(weak)

    def _nothing(self, info: dict, filtered: bool, why: str) -> bool:
        """Say why nothing is relevant, with the evidence of the ranking that looked: `why`
        "bm25" (no chunk holds a content word), "vector" (no chunk is close enough in
        meaning), "hybrid" (neither), "meaning" (no chunk holds a word, and meaning alone is
        below meaning_bar). `filtered`: the search was narrowed by filters, and the reason
        says so (a walk read "no note holds a content word" of a word that a note left out
        by --since held)."""
        info["nothing_relevant"] = True
        none = "no note the filters let through" if filtered else "no note"
        words = f"{none} holds a content word of the query"
        coverage = info.get("vector_coverage", 1.0)
        partial = (f" (vectors cover {100 * coverage:.0f}% of the chunks so far: a note not "
                   f"embedded yet is not compared)" if coverage < 1.0 else "")
        if "best_similarity" in info and info["best_similarity"] < 0:
            close = "no chunk has a vector to compare yet"
        elif "best_similarity" in info:
            bar = info.get("meaning_bar") if why == "meaning" else self.threshold()
            close = (f"the best similarity {info['best_similarity']:.3f} is below "
                     + (f"the {bar:.3f} a match by meaning alone needs (search.min_similarity "
                        f"+ {MEANING_MARGIN})" if why == "meaning" else
                        f"the threshold {bar:.3f} (search.min_similarity)"))
        else:
            close = None
        if why == "bm25" or close is None:
            info["reason"] = f"nothing relevant: {words}"
        elif why == "vector":
            info["reason"] = f"nothing relevant: {close}{partial}"
        else:
            info["reason"] = f"nothing relevant: {words}, and {close}{partial}"
        return False

    def _embed_query(self, query: str, info: dict):
        """Start embedding the query (on a thread of the pool; the engine call waits on a
        socket, so BM25 runs meanwhile). Returns a future of (space, vector) or of why not."""
        engines = self.engines
        space = self.vectors.active
        if space is None:
            return _done(engines.unavailable("embedding") or "the embedding engine is starting")
        # The query engine, when it runs: the main one may be busy with a bulk batch (or
        # restarting: then the query engine still answers, and the other way round).
        engine = engines.query_engine_ready(space.model)
        if engine is None:
            return _done(engines.unavailable("embedding") or "the embedding engine is starting")

        def embed():
            t = time.perf_counter()
            text = space.model.query_prefix + query
            try:
                # a query past the model's context (an agent pasting a page) is cut to it, as
                # documents are: the engine refused it, and search said the engine was down
                limit = space.model.context - 4  # ([CLS]/[SEP] or BOS/EOS)
                text, n = engine.client.fit(text, limit)
                if n is not None and n > limit:
                    info["query_truncated"] = {"tokens": n, "kept": limit}
                qv = engine.client.embed([text], timeout=10.0)[0]
            except (EngineUnavailable, EngineError) as e:
                return f"the embedding engine is unavailable: {e}"
            info["timings"]["embed_ms"] = round((time.perf_counter() - t) * 1e3, 2)
            return space, qv

        return self._pool.submit(embed)

    @staticmethod
    def _coverage(db, vectors) -> float:
        """The share of the index's chunks these vectors cover (1.0 for an empty index)."""
        total = chunk_rows(db)
        return min(1.0, len(vectors) / total) if total else 1.0

    def _bm25_ranking(self, db, query, n, filters, files, bufs, lists, parts, info, view,
                      text_view, share: float = COMMON_SHARE, dfs: dict | None = None
                      ) -> bool:
        """Fill lists['bm25']: from the Milvus collection `view` when given, else from the
        tantivy searcher of text_view when it holds this snapshot, else FTS5 (dropping query
        words in over `share` of the rows); `files`: the file ids the filters let through (None:
        every file); `dfs` gets the query words' chunk counts (tantivy and FTS5 read them).
        Returns whether a chunk holds a symbol of the query (only tantivy indexes them:
        symbols)."""
        signed = False
        t = time.perf_counter()
        hits = None
        if view is not None:
            try:
                hits = self.backend.bm25(view, db, query, n, files)
            except Exception as e:  # Milvus failing: this ranking from SQLite, said so
                info["store"] = f"sqlite (milvus failed: {type(e).__name__}: {e})"[:300]
        if hits is None and text_view is not None and view is None:
            searcher, why = text_view
            if bufs:  # their scores are on FTS5's scale
                why = "fts5 (unsaved editor buffers are searched)"
            elif searcher is not None:
                try:
                    hits = self.text.search(searcher, db, query, n, share, files, dfs)
                    signs = symbols(query)
                    signed = bool(hits and signs and self.text.holds_any(searcher, signs, files))
                except Exception as e:  # tantivy failing: FTS5 answers, said so
                    why = f"fts5 (tantivy failed: {type(e).__name__}: {e})"[:300]
            info["bm25_index"] = why
        if hits is None:
            hits = [(h.chunk_id, h.score) for h in bm25.search(
                db, query, n, filters, share, dfs)]
            info.setdefault("bm25_index", "fts5")  # (bm25_index = "fts5": no tantivy index)
        if bufs:
            hits = sorted(hits + self.buffers.bm25_hits(db, query, bufs, None, share),
                          key=lambda h: -h[1])[:n]
        lists["bm25"] = [cid for cid, _ in hits]
        for cid, score in hits:
            parts.setdefault(cid, {})["bm25"] = round(score, 6)
        info["timings"]["bm25_ms"] = round((time.perf_counter() - t) * 1e3, 2)
        return signed

    def _vector_ranking(self, db, embedding, n, files, lists, parts,
                        info, view=None, bufs=()):
        """Fill lists['vector'] from the query's embedding (a future), from the Milvus
        collection `view` when given and of the query's space. Returns why vectors cannot be
        used (a str), or (the space, the query's vector)."""
        got = embedding.result()
        if isinstance(got, str):
            return got
        t = time.perf_counter()
        space, qv = got
        vi = space.vectors
        ids, cos = self._dense(db, space, qv, n, files, info, view, bufs)
        info["vector_space"] = vi.space
        info["vector_coverage"] = round(self._coverage(db, vi), 4)
        if info["vector_coverage"] < 1.0 and "bm25" in lists:  # (buffers' chunks: ids < 0)
            info["unembedded"] = [c for c in lists["bm25"] if c >= 0 and c not in vi]
        info["best_similarity"] = round(float(cos[0]), 4) if len(cos) else -1.0
        self._set_vector_list(ids, cos, lists, parts)
        info["timings"]["vector_ms"] = round((time.perf_counter() - t) * 1e3, 2)
        return got

    @staticmethod
    def _set_vector_list(ids, cos, lists, parts) -> None:
        for cid in lists.get("vector", ()):  # a list searched again replaces the first one
            parts[cid].pop("vector", None)
        lists["vector"] = [int(i) for i in ids]
        for cid, c in zip(lists["vector"], cos):
            parts.setdefault(cid, {})["vector"] = round(float(c), 6)

    def _dense(self, db, space, qv, n, files, info, view, bufs):
        """(chunk ids, cosines) of the n chunks nearest to qv: from the Milvus collection
        `view` when it holds this space, else the local index; buffers' chunks merged in."""
        vi = space.vectors
        ids = None
        if view is not None and view[1] != space.id:
            # just after a model switch: the collection holds the other model's vectors
            info["store"] = "sqlite (milvus holds another vector space)"
        elif view is not None:
            try:
                ids, cos = self.backend.dense(view, qv, n, files)
                info["store_space"] = space.id  # the collection's, checked equal above
            except Exception as e:  # Milvus failing: this ranking from the local index
                info["store"] = f"sqlite (milvus failed: {type(e).__name__}: {e})"[:300]
        if ids is None:
            ids, cos = vi.search(qv, n, files)
        if bufs:
            pairs = sorted([*zip(ids.tolist(), cos.tolist()),
                            *self.buffers.vector_hits(qv, bufs, None)],
                           key=lambda p: -p[1])[:n]
            ids = np.array([p[0] for p in pairs], dtype=np.int64)
            cos = np.array([p[1] for p in pairs], dtype=np.float32)
        return ids, cos

    def _feedback(self, db, query_vector, n, files, lists, parts, weights, info,
                  view, bufs) -> None:
        """Pseudo-relevance feedback on the dense side (Rocchio): the vectors of the first
        fusion's best chunks, averaged and weighted, are added to the query's vector, and the
        dense ranking is searched again with it. The chunks both rankings put first pull the
        query towards the notes' own wording — a question's paraphrase moves towards the note
        that answers it, and BM25's exact matches inform the vector side. Measured through the
        daemon (ragctl eval, 2026-12-01), off -> 5 chunks at weight 0.5: dev set MRR@10 0.803
        -> 0.828, hit@1 0.72 -> 0.76 (hit@5 0.96 -> 0.94); SciFact train nDCG@10 0.7168 ->
        0.7212, test 0.7127 -> 0.7170. At weight 0.5 every size from 3 to 8 chunks gained on
        both sets (dev MRR@10 +0.007 to +0.025, SciFact train +0.001 to +0.004); at weight 1.0
        3-4 chunks lost on the dev set and 6-8 on SciFact."""
        m, beta = self.cfg.feedback_chunks, self.cfg.feedback_weight
        if m <= 0 or beta <= 0 or query_vector is None or "vector" not in lists:
            return
        t = time.perf_counter()
        space, qv = query_vector
        first = partial_rrf(lists, self.cfg.rrf_k, weights, info.get("vector_coverage", 1.0),
                            info.get("unembedded", ()))
        top = sorted(first, key=lambda c: -first[c])[:m]
        # (an unsaved buffer's chunks, ids < 0, give none: their vectors are not in the index)
        found, vecs = space.vectors.get([c for c in top if c >= 0])
        if not found:
            return
        q2 = _unit(qv) + beta * _unit(vecs).mean(axis=0)
        q2 = _unit(q2)
        ids, cos = self._dense(db, space, q2, n, files, info, view, bufs)
        self._set_vector_list(ids, cos, lists, parts)
        info["feedback"] = {"chunks": len(found), "weight": beta}
        info["timings"]["feedback_ms"] = round((time.perf_counter() - t) * 1e3, 2)

    def _rerank(self, db, query: str, ranked: list[Candidate], top: list[Candidate],
                info: dict) -> None:
        """Rerank `top` (candidates of `ranked`): they go first, in the reranker's order; the
        rest follow in the fused order."""
        engines = self.engines
        eng = engines.rerank_engine
        if eng is None:
            info["rerank_reason"] = engines.unavailable("reranker") or "no reranker is configured"
            return
        if not eng.ready:
            info["rerank_reason"] = f"the reranker is {eng.state}" + (
                f": {eng.reason.splitlines()[0]}" if eng.reason else "")
            return
        ids = [c.chunk_id for c in top]
        texts = dict(db.execute(f"SELECT id, text FROM chunks WHERE id IN "
                                f"({','.join('?' * len(ids))})", ids).fetchall())
        budget = self.cfg.rerank_budget_ms / 1000.0
        deadline = time.monotonic() + budget
        try:
            limit = max(16, engines.rerank_model.context - len(eng.client.tokenize(query)) - 8)
            docs = [eng.client.fit(texts.get(cid, ""), limit)[0] for cid in ids]
            left = deadline - time.monotonic()
            if left <= 0:
                raise EngineUnavailable("over the time budget while preparing")
            scores = eng.client.rerank(query, docs, timeout=left)
        except (EngineUnavailable, EngineError) as e:
            info["rerank_reason"] = (f"the reranker did not answer within its "
                                     f"{self.cfg.rerank_budget_ms} ms budget" if
                                     time.monotonic() >= deadline else f"the reranker failed: {e}")
            return
        for c, s in zip(top, scores):
            c.parts["rerank"] = round(s, 6)
            c.score = s
        chosen = {id(c) for c in top}
        ranked[:] = sorted(top, key=lambda c: -c.score) + [c for c in ranked
                                                             if id(c) not in chosen]
        info["reranked"] = True
