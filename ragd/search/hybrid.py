"""Hybrid ranking: BM25 (tantivy or FTS5) and dense vectors, fused, optionally reranked by a
cross-encoder.

    vector top-N ┐                     vector top-N of the query moved
                 ├─ RRF ─ best chunks ─ towards those chunks' vectors ┐
    BM25 top-N   ┘                                                    ├─ convex fusion ─ ...
    BM25 top-N  ──────────────────────────────────────────────────────┘   (or RRF, k=60)
    ... ─ threshold ─ boilerplate ─ a clear match by meaning lifted ─ rerank top-M ─ top k

RRF adds 1/(k + rank) over the lists a chunk appears in; it only chooses the feedback chunks
(Searcher._feedback), unless search.fusion = "rrf". The final fusion mixes the two scores, each
scaled over its list (convex; fusion.py). The threshold looks at the best cosine of the query
itself: below it, and with no chunk holding a content word, the answer is "nothing relevant"
(no results, with the reason); a chunk containing every word of the query (a literal match) is
answered as usual with ``below_threshold``. When the embedding engine is down, search answers
from BM25 alone and says so (``degraded``); when the reranker is down or slow, the fused order
is returned and the reply says it was not reranked.

Searcher.run returns a Ranking: what was ranked and why, from which ops/search.py chooses the
reply's fields. The stages share one _Query (the lists and their scores), never the reply.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np

from ragd.engines.client import EngineError, EngineUnavailable
from ragd.index import store
from ragd.index.keysonly import VectorsElsewhere
from ragd.search import bm25, boilerplate, notes
from ragd.search.filters import Filters
from ragd.search.fusion import (PARTIAL_FUSION_FROM, Candidate, bm25_order, convex,
                                effective_share, in_slots, lift, partial_rrf, unit, vector_weight)
from ragd.search.ranking import Ranking, Trusted
from ragd.text import (COMMON_SHARE, HYBRID_COMMON_SHARE, WORD, chunk_rows, content_terms,
                       symbols)

MODES = ("hybrid", "vector", "bm25")

# When no chunk holds a word of the query, a match by meaning alone must be this much above
# the similarity threshold to be shown (Searcher._anything_relevant); a vector first hit this
# far above it is trusted (Searcher._trusted) when it also stands MEANING_GAP above the best
# chunk of any other note: the vectors single out one note (with every vector in, twice that
# lead stands in for a shorter margin, out of the weak band). Without the gap the
# lift put a note that was not the answer at rank 3 in half the dev set's searches at 10%
# vector coverage, each pushing the answers below down one (docs/quality.md).
MEANING_MARGIN = 0.1
# A best chunk by meaning within this of the threshold is a weak match (Ranking.weak_meaning):
# with weak word evidence too (notes.WEAK_CONFIDENCE), the notes likely do not answer: a
# question in a vault's own domain that it does not answer finds some of its words, and
# nothing close in meaning (its calibration: docs/quality.md).
WEAK_MEANING = 0.05
MEANING_GAP = 0.07
GAP_CHUNKS = 30  # of the vector list looked through for the best chunk of another note
# How many of BM25's first candidates must have their vectors for the fusion to be fair
# (Ranking.candidate_coverage): those that make the results. A source being embedded that
# holds the query's words further down does not send the notes that answer, all embedded,
# back to BM25's order; a first embedding covers a query's first candidates as thinly as
# the rest.
CANDIDATES_COVERED = 20
# The rank a match by meaning that clear is lifted to when below it, at any coverage: third,
# not second, because each lift of a note that is not the answer pushes the answers below it
# down one (docs/quality.md, "Search while vectors are coming").
TRUSTED_RANK = 3


@dataclass
class _Embedded:
    """The query's vector, from the query-embed thread: its space and what it cost."""
    space: object
    vector: np.ndarray
    ms: float
    truncated: dict | None = None


@dataclass
class _Query:
    """One search's working state, shared by the stages of Searcher.run."""
    db: sqlite3.Connection
    text: str
    n: int  # candidates per ranking
    filters: Filters
    files: set | None  # the file ids the filters let through; None: every file
    bufs: list  # the unsaved editor buffers searched instead of their files
    view: object  # the Milvus collection read (taken once), or None: SQLite
    text_view: object  # what TextIndex.view gave for this snapshot
    lists: dict[str, list[int]] = field(default_factory=dict)  # each ranking's chunk ids
    parts: dict[int, dict] = field(default_factory=dict)  # chunk id -> each signal's part
    dfs: dict = field(default_factory=dict)  # the query words' chunk counts (for the notes)
    terms: list | None = None  # TextIndex.terms of the query, when counted before BM25
    signed: bool = False  # a chunk holds a symbol of the query (see _bm25_ranking)
    unembedded: list[int] = field(default_factory=list)  # BM25 hits with no vector yet
    query_vector: _Embedded | None = None
    # the vectors' first chunk for the query itself, its cosine, and how far it stands above
    # the best chunk of another note (None: no other note in the list)
    first: tuple[int, float, float | None] | None = None
    # the whole-note BM25 (notes.note_evidence at weight 1), computed beside the rest of the
    # search on a connection of its own (Searcher._start_notes); None: computed in its turn
    notes: Future | None = None
    by_note: bool = False  # results grouped by note: the whole-note BM25 is wanted
    # each chunk's cosine to the query itself, kept when dense feedback searches again with a
    # moved query (None: no feedback; the vector list's cosines are the query's own)
    own: dict[int, float] | None = None
    # chunk id -> its stored float32 vector (None: none stored), as the rescorings of this
    # search read them (VectorStore.rescore): feedback's search reads only what the first did not
    stored: dict = field(default_factory=dict)


def _done(value) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut


class Searcher:
    def __init__(self, cfg, engines, vectors, buffers=None, backend=None, text=None,
                 reads=None):
        self.cfg = cfg
        self.reads = reads  # ops/reads.ReadPool: a second connection for the notes' BM25
        self.backend = backend  # index/milvus.py: serves both rankings once in sync
        self.text = text  # index/textindex.py: serves the BM25 ranking once filled
        self.engines = engines
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="query-embed")
        # The whole-note BM25 has threads of its own: in the query-embed pool's queue, whose
        # threads may all be waiting on the engine while several clients search during a bulk
        # embedding, a walk of a few milliseconds waited for hundreds.
        self._notes_pool = ThreadPoolExecutor(2, thread_name_prefix="query-notes")
        # The chunks' BM25 from tantivy, beside the vector search (_rank): tantivy lets go of
        # the interpreter lock while it searches, usearch does not.
        self._bm25_pool = ThreadPoolExecutor(2, thread_name_prefix="query-bm25")
        self.vectors = vectors  # the VectorStore (index/vectorstore.py)
        self.buffers = buffers  # unsaved editor buffers (index/buffers.py), an overlay
        self.boilerplate = boilerplate.Known()  # boilerplate counts while no chunk changes

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
            group: str = "chunk", text_view=None, candidates: int | None = None) -> Ranking:
        """Rank chunks for the query. For group "note" the reranker sees the best chunk of each
        of the top notes, and the Ranking holds `note_evidence` (for notes.group). text_view:
        what TextIndex.view gave for this snapshot (the tantivy searcher, or why not).
        candidates: per ranking (default search.candidates, at least k)."""
        r = Ranking(mode)
        q = self._begin(db, query, k, filters, text_view, r, candidates)
        if q is None:
            return r
        q.by_note = group == "note"
        self._rank(q, r)
        r.asked = q.n
        r.full = any(len(ids) >= q.n for ids in q.lists.values())
        t = time.perf_counter()
        if not self._anything_relevant(q, r):
            return r
        if q.lists.get("vector"):
            head = q.lists["vector"][:5]
            common = boilerplate.shared(db, head, self.boilerplate)
            first = next((c for c in head if c not in common), head[0])
            q.first = (first, q.parts[first]["vector"], self._gap(q, first))
        weights = {"vector": vector_weight(query), "bm25": 1.0}
        if r.mode == "hybrid" and r.fusion_coverage >= PARTIAL_FUSION_FROM:
            self._feedback(q, r, weights)
        for name, ranked_ids in q.lists.items():  # each signal's rank, for --explain
            for rank, cid in enumerate(ranked_ids, 1):
                q.parts[cid][f"{name}_rank"] = rank
        if r.mode == "hybrid":
            ranked, key = self._fuse(q, r, weights)
        else:
            key = "vector" if r.mode == "vector" else "bm25"
            ranked = [Candidate(c, q.parts[c][key], q.parts[c]) for c in q.lists.get(key, [])]
        self._weigh_boilerplate(db, ranked)
        r.trusted = self._trusted(q.first, r.mode, r.fusion_coverage)
        r.timings["fusion_ms"] = round((time.perf_counter() - t) * 1e3, 2)
        if rerank is None:  # the default: rerank when a reranker is configured
            rerank = self.cfg.rerank and "reranker" in self.engines.configured
        if rerank and ranked:
            top = (notes.firsts(db, ranked, self.cfg.rerank_top, self.buffers)
                   if group == "note" else ranked[:self.cfg.rerank_top])
            self._rerank(db, query, ranked, top, r)
        if r.trusted is not None and group == "chunk" and not r.reranked:
            trusted = r.trusted
            trusted.lifted_from = lift(ranked, lambda c: c.chunk_id == trusted.chunk_id,
                                       trusted.rank)
        if group == "note" and ranked and not r.reranked:  # (the reranker's order stands)
            self._note_evidence(q, r, ranked, key)
        r.candidates = ranked
        return r

    # -- the stages -------------------------------------------------------------------------------

    def _begin(self, db, query: str, k: int, filters: Filters | None, text_view,
               r: Ranking, candidates: int | None = None) -> _Query | None:
        """The search's state: the filters, buffers and store it reads. None when the filters
        let no note through (not "nothing relevant": r says so)."""
        filters = filters or Filters()
        bufs = self.buffers.active() if self.buffers is not None else []
        if bufs:  # the buffers stand in for their files
            filters = dataclasses.replace(filters, exclude_files=tuple(
                b.file_id for b in bufs if b.file_id is not None))
            bufs = [b for b in bufs if filters.admits_buffer(b.source, b.rel)]
        view = self.backend.view if self.backend is not None and self.backend.serving \
            else None
        if self.backend is not None:
            r.store = "milvus" if view else f"sqlite (milvus {self.backend.state})"
        # the files the filters let through, read once (each ranking applies them); None when
        # that is every file: a filter that keeps everything costs nothing (a large term set
        # costs tantivy a pass over it for every search)
        files = filters.file_ids(db) if filters.active else None
        if files is not None and len(files) == store.count_files(db):
            files = None
        if files is not None and len(files) == 0 and not bufs:
            r.reason = "no indexed note passes the filters"
            r.filtered_out = True
            return None
        return _Query(db, query, max(candidates or self.cfg.search_candidates, k), filters,
                      files, bufs, view, text_view)

    def _rank(self, q: _Query, r: Ranking) -> None:
        """Each ranking the mode asks for (q.lists): BM25, the vectors, or both; BM25 alone
        when the vectors cannot be had (r.degraded)."""
        if r.mode in ("hybrid", "vector") and "embedding" not in self.engines.configured:
            r.mode = "bm25"  # dense search is off by configuration: not degraded
        # The query's embedding is asked for first and BM25 runs while the engine works on it:
        # a hybrid search costs max(embedding, BM25), not their sum — unless the engine's
        # threads take every core: then anything run beside them only slows them (their
        # threads wait for each other at every layer, and one without a core holds up all).
        t = time.perf_counter()
        side = None  # the chunks' BM25 on a thread (below), or None: in its turn
        embedding, alone = self._embed_query(q.text) if r.mode in ("hybrid", "vector") \
            else (None, False)
        if alone:  # (its wall time here: the engine's own, embed_ms, and the hand-overs)
            wait([embedding])
            r.timings["embed_wait_ms"] = round((time.perf_counter() - t) * 1e3, 2)
        if r.mode == "hybrid":
            t = time.perf_counter()
            space = self.vectors.active
            coverage = self._coverage(q.db, space.vectors) if space is not None else 1.0
            partial = coverage < PARTIAL_FUSION_FROM
            counted = self._count_words(q)
            if counted:  # the notes' BM25 can start before the chunks' ranking
                self._start_notes(q)
            r.timings["words_ms"] = round((time.perf_counter() - t) * 1e3, 2)
            if counted and coverage >= 1.0 and q.view is None:
                # every chunk has its vector: the chunks' BM25 (tantivy's: q.terms counted)
                # runs on a thread beside the vector search, and is taken in after it
                side = self._bm25_pool.submit(self._tantivy_hits, q, HYBRID_COMMON_SHARE)
            else:
                self._bm25_ranking(q, r, COMMON_SHARE if partial else HYBRID_COMMON_SHARE)
                if partial and (self._embedded_share(q, space.vectors) or 0) >= \
                        PARTIAL_FUSION_FROM:
                    # the chunks these words found have their vectors: fused as when all are in
                    self._bm25_ranking(q, r, HYBRID_COMMON_SHARE)
            self._start_notes(q)
        if r.mode in ("hybrid", "vector"):
            why = self._vector_ranking(q, r, embedding)
            if side is not None:
                self._bm25_ranking(q, r, HYBRID_COMMON_SHARE, side.result())
                self._unembedded(q, r)  # (a model switched since the coverage was read)
            if why is not None:
                r.degraded = True
                r.reason = why
                r.requested_mode = r.mode
                if r.mode == "vector":
                    self._bm25_ranking(q, r)
                r.mode = "bm25"
        else:
            self._bm25_ranking(q, r)

    def _fuse(self, q: _Query, r: Ranking, weights: dict) -> tuple[list[Candidate], str | None]:
        """Hybrid: the two rankings as one (fusion.py), the chunks found by meaning alone below
        the threshold left out. Returns the candidates and the name of the fused score in
        their parts (None: BM25's own)."""
        lists, parts = q.lists, q.parts
        r.weights = weights
        if r.fusion_coverage < PARTIAL_FUSION_FROM and "vector" in lists:
            # BM25's own scores and order, what only the vectors found after them; a match by
            # meaning clear enough to trust is lifted (_trusted)
            r.fusion = "bm25 order: vectors still coming"
            fused, key = bm25_order(lists, parts), None
            self._in_slots(q, fused, weights)
        elif self.cfg.fusion == "convex" and "vector" in lists:
            r.fusion = "convex"
            share = round(effective_share(self.cfg.vector_share, weights["vector"]), 4)
            r.weights = {"vector": share, "bm25": round(1.0 - share, 4)}
            fused, key = convex(lists, parts, share, q.unembedded), "fused"
        elif "vector" not in lists:  # every cosine was below the threshold
            r.fusion = "bm25 only: vectors below the threshold"
            fused = {c: parts[c]["bm25"] for c in lists.get("bm25", ())}  # as mode bm25
            key = None
        else:
            r.fusion = "rrf"
            fused = partial_rrf(lists, self.cfg.rrf_k, weights, r.fusion_coverage,
                                q.unembedded)
            key = "rrf"
        if "vector" in lists:
            self._cut_weak_tail(q, fused, r)
        for cid, s in fused.items() if key else ():
            parts[cid][key] = round(s, 6)
        order = sorted(fused, key=lambda c: -fused[c])
        return [Candidate(c, fused[c], parts[c]) for c in order], key

    def _in_slots(self, q: _Query, fused: dict, weights: dict) -> None:
        """BM25's candidates with their vectors, in their own places by both (fusion.in_slots)."""
        if q.query_vector is None:
            return
        space, qv = q.query_vector.space, q.query_vector.vector
        known = {c: q.parts[c]["vector"] for c in q.lists.get("bm25", ())
                 if "vector" in q.parts[c]}
        unembedded = set(q.unembedded)
        want = [c for c in store.indexed(q.lists.get("bm25", ()))
                if c not in known and c not in unembedded]
        if want:
            found, vecs = self.vectors.vectors_of(q.db, space, want)
            if found:
                for c, x in zip(found, unit(vecs) @ unit(qv)):
                    known[c] = q.parts[c]["vector"] = round(float(x), 6)  # (--explain shows it)
        share = effective_share(self.cfg.vector_share, weights["vector"])
        in_slots(q.lists, q.parts, fused, known, share)

    def _weigh_boilerplate(self, db, ranked: list[Candidate]) -> None:
        """A chunk whose text is in several notes of its source counts less (boilerplate.py)."""
        if not ranked:
            return
        common = boilerplate.shared(db, [c.chunk_id for c in ranked], self.boilerplate)
        for c in ranked:
            if c.chunk_id in common:
                c.score *= boilerplate.weight(common[c.chunk_id])
                c.parts["shared_by"] = common[c.chunk_id]
        if common:
            ranked.sort(key=lambda c: -c.score)

    def _note_evidence(self, q: _Query, r: Ranking, ranked: list[Candidate],
                       key: str | None) -> None:
        """What each note's whole text adds to its score (notes.note_evidence), on the scale
        of the ranking: the BM25 share of a convex fusion, BM25's own scores, nothing for RRF
        and vector search. Not while Milvus serves: its BM25 is not FTS5's, and the notes'
        own rows are not used."""
        if self.cfg.note_weight <= 0 or q.view is not None:
            return
        if key == "fused":
            weight = self.cfg.note_weight * r.weights["bm25"]
        elif key is None or r.mode == "bm25" or (r.fusion or "").startswith("bm25"):
            weight = self.cfg.note_weight * max(c.score for c in ranked)
        else:
            return
        if weight <= 0:
            return
        t = time.perf_counter()
        if q.notes is not None:
            got, ms = q.notes.result()
            r.note_evidence = {fid: (weight * add, x, rank) for fid, (add, x, rank)
                               in got.items()}
            r.timings["notes_bm25_ms"] = ms
            r.timings["notes_wait_ms"] = round((time.perf_counter() - t) * 1e3, 2)
            return
        r.note_evidence = notes.note_evidence(q.db, q.text, weight, q.dfs, self.buffers,
                                              q.bufs, q.filters.exclude_files,
                                              self._served(q))
        r.timings["notes_bm25_ms"] = round((time.perf_counter() - t) * 1e3, 2)

    def _notes_wanted(self, q: _Query) -> bool:
        """Is the whole-note BM25 computed beside the search (_start_notes)?"""
        return (self.reads is not None and q.by_note and self.cfg.note_weight > 0
                and q.view is None)

    def _count_words(self, q: _Query) -> bool:
        """When tantivy serves this snapshot (and no buffer is searched), the query words'
        chunk counts (q.dfs) read from its searcher before the BM25 ranking, which reuses
        them (q.terms): the notes' BM25, which needs them, then starts before the chunks'
        ranking instead of after it, and that ranking needs no SQLite connection (it can run
        on a thread). False when not counted here (the ranking counts them)."""
        served = self._served(q)
        if served is None:
            return False
        try:
            q.terms = self.text.terms(served[1], q.db, q.text, q.dfs)
        except Exception:  # (the ranking meets it again, falls back to FTS5 and says why)
            q.dfs.clear()
            q.terms = None
            return False
        return True

    def _start_notes(self, q: _Query) -> None:
        """Hybrid: start the whole-note BM25 on a thread of the pool, with a read connection
        of its own, as soon as the query's words are counted (q.dfs: by _count_words, else by
        the BM25 ranking). A core is free by then (an engine whose threads take every core is
        done with the query's embedding; any other leaves one): the notes' BM25 runs beside the
        BM25 ranking, the vector search, the feedback and the fusion instead of after them.
        tantivy's notes are this search's snapshot's (_served); FTS5's are read on a
        connection of its own, as of now: a commit in between can only change the score of a
        note no chunk of this search's snapshot brings, which adds nothing (notes.group).
        Once per search."""
        if q.notes is not None or not self._notes_wanted(q):
            return
        text, dfs, bufs, exclude = q.text, dict(q.dfs), q.bufs, q.filters.exclude_files
        served = self._served(q)

        def work():
            t = time.perf_counter()
            with self.reads.conn(snapshot=True) as db:
                got = notes.note_evidence(db, text, 1.0, dfs, self.buffers, bufs, exclude,
                                          served)
            return got, round((time.perf_counter() - t) * 1e3, 2)

        q.notes = self._notes_pool.submit(work)

    def _served(self, q: _Query):
        """(the tantivy index, the Searchers of this search's snapshot) when they serve it and
        no unsaved buffer is searched (their scores are on FTS5's scale), else None."""
        if q.bufs or q.text_view is None or q.text_view[0] is None or self.text is None:
            return None
        return self.text, q.text_view[0]

    def _anything_relevant(self, q: _Query, r: Ranking) -> bool:
        """'Nothing relevant' when neither signal has anything: no vector above the similarity
        threshold, and no chunk holding a content word or a symbol (q.signed) of the query
        (question and filler words alone do not count). Below the threshold the vector list
        is dropped and BM25 answers, flagged below_threshold. When no chunk holds a word of
        the query, meaning alone must clear a higher bar (meaning_bar): a word no note holds
        ("sourdough") is near the threshold to some chunk of any large vault."""
        thr = self.threshold()
        lists, filters = q.lists, q.filters
        best = 1.0 if r.best_similarity is None else r.best_similarity
        weak_vectors = "vector" in lists and best < thr
        if r.mode == "vector":
            if weak_vectors:
                # a chunk holding every word of the query is a literal match, relevant
                # whatever the cosine (rare names and identifiers embed poorly)
                if not self._all_terms(q):
                    return self._nothing(r, filters.narrowed, "vector", q.text)
                r.below_threshold = True
            return True
        keywords = bool(lists.get("bm25")) and (
            q.signed or self._content_match(q)
            or any(store.unsaved(c) for c in lists["bm25"]))  # (an unsaved buffer's chunk matched)
        if not keywords and "vector" in lists and not weak_vectors and thr > 0:
            r.meaning_bar = round(thr + MEANING_MARGIN, 4)
            if best < r.meaning_bar:
                return self._nothing(r, filters.narrowed, "meaning", q.text)
            if r.mode == "hybrid" and len(content_terms(q.text)) == 1:
                # One word no note holds is looked up, as grep would: the real words no note
                # holds rarely clear the bar (docs/quality.md), and what does is mostly a
                # made-up word whose word pieces match ("qwertyzap": Q Learning, qwik).
                # Meaning alone answers a question, or --mode vector.
                return self._nothing(r, filters.narrowed, "word", q.text)
        if weak_vectors:
            del lists["vector"]
            if not keywords:
                return self._nothing(r, filters.narrowed, "hybrid", q.text)
            # While vectors are still coming, no close match among the chunks embedded so far
            # is no finding (a source just added has none: best similarity -1): not flagged,
            # so it does not make the answer low-confidence
            if r.coverage >= 1.0:
                r.below_threshold = True
        elif r.mode == "bm25" and not keywords:
            return self._nothing(r, filters.narrowed, "bm25", q.text)
        elif (r.mode == "hybrid" and "vector" in lists and thr > 0 and r.coverage >= 1.0
              and best < thr + WEAK_MEANING):
            r.weak_meaning = True  # (while vectors are coming the best one may not be in yet)
        return True

    @staticmethod
    def _content_match(q: _Query) -> bool:
        """Does some chunk the filters let through hold a content word (or phrase, or symbol)
        of the query? From the words' chunk counts BM25 read (q.dfs) when it read every
        word's and no filter narrows the chunks, else asked of FTS5."""
        words = content_terms(q.text)
        counts = [q.dfs.get(f'"{w}"') for w in words]
        if q.filters.active or not words or any(w.startswith('"') for w in words) \
                or None in counts or symbols(q.text):
            return bm25.content_match(q.db, q.text, q.filters)
        return any(counts)

    def _all_terms(self, q: _Query) -> bool:
        """Does some chunk the filters let through hold every word, phrase and symbol of the
        query (bm25.all_terms_match)? Asked of tantivy when it serves this snapshot: FTS5
        walks the lists of every word of a question, "is" and "of" too (in a large index the
        slowest step of a long question's search), where tantivy skips through them. An editor's
        buffer is FTS5's to search (q.bufs), as the rankings do."""
        served = self._served(q)
        if served is not None:
            searcher = served[1]
            try:
                terms = q.terms if q.terms is not None else \
                    self.text.terms(searcher, q.db, q.text)
                return self.text.holds_all(searcher, terms, q.files)
            except Exception:  # (tantivy failing: FTS5 answers, as it does the ranking)
                pass
        return bm25.all_terms_match(q.db, q.text, q.filters)

    def _gap(self, q: _Query, first: int) -> float | None:
        """How far the cosine of `first` stands above the best chunk of another note in the
        vector list (None when the list holds no other note)."""
        ids = q.lists["vector"][:GAP_CHUNKS]
        files = notes.files_of(q.db, ids, self.buffers)
        mine = files.get(first)
        other = next((c for c in ids if files.get(c, mine) != mine), None)
        if other is None:
            return None
        return q.parts[first]["vector"] - q.parts[other]["vector"]

    def _trusted(self, first, mode: str, coverage: float = 1.0) -> Trusted | None:
        """The chunk the vectors rank first for the query itself (before dense feedback; not
        boilerplate) when its cosine clears the threshold by MEANING_MARGIN and the best chunk
        of any other note by MEANING_GAP: a match by meaning this clear is never buried under
        keyword matches of the question's words ("why is my indoor tree losing its foliage"
        put the only note that answers behind AVL trees). With every vector in (`coverage`),
        a lead of twice MEANING_GAP over the other notes stands in for a margin short of
        MEANING_MARGIN, though not in the weak band: the vectors single out that note however
        close the bar. While vectors are coming the other notes are only the few embedded so
        far, and such a lead says little. Hybrid only; its note is lifted to TRUSTED_RANK."""
        thr = self.threshold()
        if first is None or mode != "hybrid" or thr <= 0 or first[1] < thr + WEAK_MEANING:
            return None
        cid, cosine, gap = first
        if gap is not None and gap < MEANING_GAP:
            return None
        if cosine < thr + MEANING_MARGIN and (
                coverage < PARTIAL_FUSION_FROM or gap is None or gap < 2 * MEANING_GAP):
            return None
        return Trusted(cid, round(cosine, 4), TRUSTED_RANK,
                       gap=None if gap is None else round(gap, 4))

    def _cut_weak_tail(self, q: _Query, ranked: dict[int, float], r: Ranking) -> None:
        """Hybrid: drop from `ranked` the chunks found by meaning alone (no BM25 hit) whose
        cosine is below the similarity threshold (below meaning_bar when no chunk holds a word
        of the query): by the threshold's own measure they are not relevant, and a word found
        in one note came back with nine notes of similarity 0.25 after it. Not in vector
        search, where nothing else stands in. After dense feedback the cosine is the moved
        query's (what the fusion used), unless the query is a lookup, words some chunk holds
        every one of: then it is the query's own. The moved query is close to what BM25 found,
        and its neighbours are that note's, not the query's (a made-up word held by one note
        came back with unrelated notes after it). For a question, feedback's neighbours can be
        its answer, so it keeps them. A chunk only the moved query found is as far from the
        query as the first search's last, at most. A lookup of up to three words holds its
        chunks by meaning alone to meaning_bar's measure, as a search no chunk has a word of."""
        floor = r.meaning_bar or self.threshold()
        if floor <= 0:  # no threshold (0: off)
            return
        parts = q.parts
        alone = [c for c in ranked if "bm25" not in parts[c]]
        weak = [c for c in alone if parts[c].get("vector", floor) < floor]
        # A lookup of a few words: its chunks by meaning alone must be as close to the query
        # itself as a match by meaning alone must be (the threshold + MEANING_MARGIN): the
        # words answer a lookup, and a note beside it by a weak cosine is noise. (A few:
        # _all_terms is then cheap over FTS5 too, and asked of most searches' meaning-only
        # tails.)
        bar = floor if len(content_terms(q.text)) > 3 else \
            max(floor, round(self.threshold() + MEANING_MARGIN, 4))
        own = q.own if q.own is not None else {c: parts[c].get("vector", bar) for c in alone}
        last = min(own.values(), default=-1.0)
        far = [c for c in alone if parts[c].get("vector", floor) >= floor
               and own.get(c, last) < bar]
        if far and self._all_terms(q):  # (asked only then)
            weak += far
        for c in weak:
            del ranked[c]
        if weak:
            r.cut_below_threshold = len(weak)

    def _nothing(self, r: Ranking, filtered: bool, why: str, query: str = "") -> bool:
        """Say why nothing is relevant, with the evidence of the ranking that looked: `why`
        "bm25" (no chunk holds a content word), "vector" (no chunk is close enough in
        meaning), "hybrid" (neither), "meaning" (no chunk holds a word, and meaning alone is
        below meaning_bar), "word" (a query of one word that no chunk holds). `filtered`: the
        search was narrowed by filters, and the reason says so (a note left out by --since may
        hold the word). A query with no content word or sign to look up says that instead: a
        search for '-->' was told no note holds one, where grep finds it in every comment."""
        r.nothing_relevant = True
        none = "no note the filters let through" if filtered else "no note"
        words = f"{none} holds a content word of the query"
        if query and not content_terms(query) and not symbols(query):
            words = ("the query has no word to look up, only " + (
                "question and filler words" if WORD.search(query) else
                "punctuation (signs are searched as words when they are emoji, arrows, "
                "mathematical signs or operators such as := -> !=)"))
        partial = (f" (vectors cover {100 * r.coverage:.0f}% of the chunks so far: a note not "
                   f"embedded yet is not compared)" if r.coverage < 1.0 else "")
        if r.best_similarity is not None and r.best_similarity < 0:
            close = "no chunk has a vector to compare yet"
        elif r.best_similarity is not None:
            bar = r.meaning_bar if why == "meaning" else self.threshold()
            # (the threshold is the model's measured one unless the config sets it)
            named = "search.min_similarity" if self.cfg.min_similarity >= 0 else \
                "the model's; search.min_similarity sets another"
            close = (f"the best similarity {r.best_similarity:.3f} is below "
                     + (f"the {bar:.3f} a match by meaning alone needs (the threshold "
                        f"{self.threshold():.3f} + {MEANING_MARGIN}: {named})"
                        if why == "meaning" else f"the threshold {bar:.3f} ({named})"))
        else:
            close = None
        if why == "word":
            r.reason = (f"nothing relevant: {none} holds the word, and a single word is "
                        f"looked up as written: --mode vector searches by its meaning")
        elif why == "bm25" or close is None:
            r.reason = f"nothing relevant: {words}"
        elif why == "vector":
            r.reason = f"nothing relevant: {close}{partial}"
        else:
            r.reason = f"nothing relevant: {words}, and {close}{partial}"
        return False

    # -- the rankings -----------------------------------------------------------------------------

    def _embed_query(self, query: str) -> tuple[Future, bool]:
        """Start embedding the query (on a thread of the pool; the engine call waits on a
        socket, so BM25 can run meanwhile). Returns a future of an _Embedded or of why not (a
        str) — the thread writes nothing else — and whether the engine's threads take every
        core (then nothing should run beside them)."""
        engines = self.engines
        space = self.vectors.active
        if space is None:
            return _done(engines.unavailable("embedding")
                         or "the embedding engine is starting"), False
        # The query engine, when it runs: the main one may be busy with a bulk batch (or
        # restarting: then the query engine still answers, and the other way round).
        engine = engines.query_engine_ready(space.model)
        if engine is None:
            return _done(engines.unavailable("embedding")
                         or "the embedding engine is starting"), False

        def embed_in(space, engine):
            # a query past the model's context (an agent pasting a page) is cut to it, as
            # documents are: the engine would refuse it, and search say the engine is down
            limit = space.model.context - 4  # ([CLS]/[SEP] or BOS/EOS)

            def work(engine):
                text, n = engine.client.fit(space.model.query_prefix + query, limit)
                return engine.client.embed([text], timeout=10.0)[0], (
                    {"tokens": n, "kept": limit} if n is not None and n > limit else None)
            return engines.embed_waited(space.model, work, engine)

        def embed():
            t = time.perf_counter()
            used = space
            try:
                try:
                    qv, truncated = embed_in(space, engine)
                except (EngineUnavailable, EngineError):
                    used = self.vectors.active
                    if used is None or used is space:
                        raise
                    # a model switch was done meanwhile, and the old model's engines stopped:
                    # the query is embedded by the new model, and searched in its space
                    qv, truncated = embed_in(used, None)
            except (EngineUnavailable, EngineError) as e:
                return f"the embedding engine is unavailable: {e}"
            return _Embedded(used, qv, round((time.perf_counter() - t) * 1e3, 2), truncated)

        return self._pool.submit(embed), engine.takes_every_core

    @staticmethod
    def _coverage(db, vectors) -> float:
        """The share of the index's chunks these vectors cover (1.0 for an empty index)."""
        total = chunk_rows(db)
        return min(1.0, len(vectors) / total) if total else 1.0

    @staticmethod
    def _embedded_share(q: _Query, vectors) -> float | None:
        """The share of BM25's first CANDIDATES_COVERED candidates (of the index: not unsaved
        buffers') these vectors cover; None when BM25 found none."""
        found = store.indexed(q.lists.get("bm25", ()))[:CANDIDATES_COVERED]
        return sum(c in vectors for c in found) / len(found) if found else None

    def _bm25_ranking(self, q: _Query, r: Ranking, share: float = COMMON_SHARE,
                      side: tuple | None = None) -> None:
        """Fill q.lists['bm25']: from the Milvus collection q.view when given, else from the
        tantivy searcher of q.text_view when it holds this snapshot, else FTS5 (dropping query
        words in over `share` of the rows). q.dfs gets the query words' chunk counts (tantivy
        and FTS5 read them); q.signed whether a chunk holds a symbol of the query (only tantivy
        indexes them: symbols). `side`: what _tantivy_hits gave on a thread, when it ran
        there (its time is added to bm25_ms)."""
        t = time.perf_counter()
        aside = side[2] if side is not None else 0.0
        db, query, n, files = q.db, q.text, q.n, q.files
        hits = None
        if q.view is not None:
            try:
                hits = self.backend.bm25(q.view, db, query, n, files)
            except Exception as e:  # Milvus failing: this ranking from SQLite, said so
                r.store = f"sqlite (milvus failed: {type(e).__name__}: {e})"[:300]
        if hits is None and q.text_view is not None and q.view is None:
            if side is None:
                side = self._tantivy_hits(q, share)
            hits, r.bm25_index = side[0], side[1]
        if hits is None:
            hits = [(h.chunk_id, h.score) for h in bm25.search(
                db, query, n, q.filters, share, q.dfs)]
            if r.bm25_index is None:  # (bm25_index = "fts5": no tantivy index)
                r.bm25_index = "fts5"
        if q.bufs:
            hits = sorted(hits + self.buffers.bm25_hits(db, query, q.bufs, None, share),
                          key=lambda h: -h[1])[:n]
        for cid in q.lists.get("bm25", ()):  # a ranking made again replaces the first one
            q.parts[cid].pop("bm25", None)
        q.lists["bm25"] = [cid for cid, _ in hits]
        for cid, score in hits:
            q.parts.setdefault(cid, {})["bm25"] = round(score, 6)
        r.timings["bm25_ms"] = round((time.perf_counter() - t + aside) * 1e3, 2)

    def _tantivy_hits(self, q: _Query, share: float) -> tuple[list | None, str, float]:
        """(the top q.n chunks from the tantivy searcher of q.text_view, or None: FTS5
        answers; what answered, as bm25_index says it; the seconds this took). Touches no
        SQLite connection once q.terms are counted (a thread beside the vector search runs it,
        with the terms kept: the literal-match check reads them too); sets q.signed."""
        t = time.perf_counter()
        searcher, why = q.text_view
        if q.bufs:  # their scores are on FTS5's scale
            return None, "fts5 (unsaved editor buffers are searched)", 0.0
        if searcher is None:
            return None, why, 0.0
        try:
            if q.terms is None:
                q.terms = self.text.terms(searcher, q.db, q.text, q.dfs)
            hits = self.text.search(searcher, q.db, q.text, q.n, share, q.files, q.dfs,
                                    q.terms)
            signs = symbols(q.text)
            q.signed = bool(hits and signs and self.text.holds_any(searcher, signs, q.files))
        except Exception as e:  # tantivy failing: FTS5 answers, said so
            return (None, f"fts5 (tantivy failed: {type(e).__name__}: {e})"[:300],
                    time.perf_counter() - t)
        return hits, why, time.perf_counter() - t

    def _vector_ranking(self, q: _Query, r: Ranking, embedding: Future) -> str | None:
        """Fill q.lists['vector'] from the query's embedding (a future), from the Milvus
        collection q.view when given and of the query's space. Returns why vectors cannot
        be used, or None."""
        got = embedding.result()
        if isinstance(got, str):
            return got
        t = time.perf_counter()
        q.query_vector = got
        r.timings["embed_ms"] = got.ms
        r.query_truncated = got.truncated
        vi = got.space.vectors
        try:
            ids, cos = self._dense(q, r, got.space, got.vector)
        except VectorsElsewhere as e:
            return str(e)
        r.vector_space = vi.space
        r.vector_coverage = round(self._coverage(q.db, vi), 4)
        self._unembedded(q, r)
        r.best_similarity = round(float(cos[0]), 4) if len(cos) else -1.0
        self._set_vector_list(q, ids, cos)
        r.timings["vector_ms"] = round((time.perf_counter() - t) * 1e3, 2)
        return None

    def _unembedded(self, q: _Query, r: Ranking) -> None:
        """The BM25 hits with no vector yet (q.unembedded), and the share of the first ones
        that have one, when the vectors searched do not cover every chunk."""
        if r.vector_coverage is None or r.vector_coverage >= 1.0 or "bm25" not in q.lists \
                or q.query_vector is None:
            return
        vi = q.query_vector.space.vectors
        q.unembedded = [c for c in store.indexed(q.lists["bm25"]) if c not in vi]
        found = self._embedded_share(q, vi)
        r.candidate_coverage = None if found is None else round(found, 4)

    @staticmethod
    def _set_vector_list(q: _Query, ids, cos) -> None:
        for cid in q.lists.get("vector", ()):  # a list searched again replaces the first one
            q.parts[cid].pop("vector", None)
        q.lists["vector"] = [int(i) for i in ids]
        for cid, c in zip(q.lists["vector"], cos):
            q.parts.setdefault(cid, {})["vector"] = round(float(c), 6)

    def _dense(self, q: _Query, r: Ranking, space, qv):
        """(chunk ids, cosines) of the n chunks nearest to qv: from the Milvus collection
        q.view when it holds this space, else the local index; buffers' chunks merged in."""
        ids = None
        if q.view is not None and q.view[1] != space.id:
            # just after a model switch: the collection holds the other model's vectors
            r.store = "sqlite (milvus holds another vector space)"
        elif q.view is not None:
            try:
                ids, cos = self.backend.dense(q.view, qv, q.n, q.files)
                r.store_space = space.id  # the collection's, checked equal above
            except Exception as e:  # Milvus failing: this ranking from the local index
                r.store = f"sqlite (milvus failed: {type(e).__name__}: {e})"[:300]
        if ids is None and space.vectors.remote:
            # [store] local_vectors = false: no copy here to fall back on
            why = r.store.removeprefix("sqlite (").removesuffix(")") if r.store else \
                "milvus is not connected"
            raise VectorsElsewhere(f"the vectors are in Milvus alone, which cannot answer "
                                   f"({why})")
        if ids is None:
            ids, cos = space.vectors.search(qv, q.n, q.files)
            ids, cos = self.vectors.rescore(q.db, space, qv, ids, cos, q.stored)
        if q.bufs:
            pairs = sorted([*zip(ids.tolist(), cos.tolist()),
                            *self.buffers.vector_hits(qv, q.bufs, None)],
                           key=lambda p: -p[1])[:q.n]
            ids = np.array([p[0] for p in pairs], dtype=np.int64)
            cos = np.array([p[1] for p in pairs], dtype=np.float32)
        return ids, cos

    def _feedback(self, q: _Query, r: Ranking, weights: dict) -> None:
        """Pseudo-relevance feedback on the dense side (Rocchio): the vectors of the first
        fusion's best chunks, averaged and weighted, are added to the query's vector, and the
        dense ranking is searched again with it. The chunks both rankings put first pull the
        query towards the notes' own wording — a question's paraphrase moves towards the note
        that answers it, and BM25's exact matches inform the vector side."""
        m, beta = self.cfg.feedback_chunks, self.cfg.feedback_weight
        if m <= 0 or beta <= 0 or q.query_vector is None or "vector" not in q.lists:
            return
        t = time.perf_counter()
        space, qv = q.query_vector.space, q.query_vector.vector
        first = partial_rrf(q.lists, self.cfg.rrf_k, weights, r.fusion_coverage,
                            q.unembedded)
        top = sorted(first, key=lambda c: -first[c])[:m]
        # (an unsaved buffer's chunks give none: their vectors are not in the index)
        found, vecs = self.vectors.vectors_of(q.db, space, store.indexed(top))
        if not found:
            return
        q2 = unit(unit(qv) + beta * unit(vecs).mean(axis=0))
        try:
            ids, cos = self._dense(q, r, space, q2)
        except VectorsElsewhere:  # Milvus went away since the first search: keep its list
            return
        q.own = {c: q.parts[c]["vector"] for c in q.lists["vector"]}
        self._set_vector_list(q, ids, cos)
        r.feedback = {"chunks": len(found), "weight": beta}
        r.timings["feedback_ms"] = round((time.perf_counter() - t) * 1e3, 2)

    def _rerank(self, db, query: str, ranked: list[Candidate], top: list[Candidate],
                r: Ranking) -> None:
        """Rerank `top` (candidates of `ranked`): they go first, in the reranker's order; the
        rest follow in the fused order."""
        engines = self.engines
        eng = engines.rerank_engine
        if eng is None:
            r.rerank_reason = engines.unavailable("reranker") or "no reranker is configured"
            return
        if not eng.ready:
            r.rerank_reason = f"the reranker is {eng.state}" + (
                f": {eng.reason.splitlines()[0]}" if eng.reason else "")
            return
        ids = [c.chunk_id for c in top]
        texts = store.chunk_texts(db, ids)
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
            r.rerank_reason = (f"the reranker did not answer within its "
                               f"{self.cfg.rerank_budget_ms} ms budget" if
                               time.monotonic() >= deadline else f"the reranker failed: {e}")
            return
        for c, s in zip(top, scores):
            c.parts["rerank"] = round(s, 6)
            c.score = s
        chosen = {id(c) for c in top}
        ranked[:] = sorted(top, key=lambda c: -c.score) + [c for c in ranked
                                                             if id(c) not in chosen]
        r.reranked = True
