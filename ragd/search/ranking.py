"""What a search ranked, and why: the typed result of Searcher.run (hybrid.py), from which
the search op (ops/search.py) chooses its reply's fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ragd.search.fusion import Candidate


@dataclass
class Trusted:
    """The chunk the vectors rank first for the query itself, clear of the threshold and of
    the other notes."""
    chunk_id: int
    cosine: float
    rank: int
    gap: float | None = None  # above the best chunk of another note (None: none listed)
    lifted_from: int | None = None
    result: int | None = None  # the result (1-based) it is, or its note; None: not shown

    def reply(self) -> dict:  # (its chunk id is the index's own: not in the reply)
        out = {"cosine": self.cosine, "rank": self.rank}
        if self.result is not None:
            out["result"] = self.result
        if self.gap is not None:
            out["gap"] = self.gap
        if self.lifted_from is not None:
            out["lifted_from"] = self.lifted_from
        return out


# The Ranking fields a reply carries when they are set (None or False: absent), in the order
# docs/protocol.md lists them; `reranked`, `degraded` and `timings` are always there.
REPLY_FIELDS = ("requested_mode", "reason", "filtered_out", "store", "store_space",
                "bm25_index", "vector_space", "vector_coverage", "candidate_coverage",
                "best_similarity",
                "query_truncated", "fusion", "weights", "feedback", "cut_below_threshold",
                "below_threshold", "weak_meaning", "meaning_bar", "rerank_reason", "widened")


@dataclass
class Ranking:
    """What a search ranked, and why (docs/protocol.md, search: each field)."""
    mode: str
    candidates: list[Candidate] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    reranked: bool = False
    degraded: bool = False
    nothing_relevant: bool = False
    requested_mode: str | None = None
    reason: str | None = None
    filtered_out: bool = False
    store: str | None = None
    store_space: int | None = None
    bm25_index: str | None = None
    vector_space: int | None = None
    vector_coverage: float | None = None
    # while vectors are coming: the share of BM25's first candidates that have theirs (None:
    # every chunk has one, or BM25 found none; hybrid.CANDIDATES_COVERED). What the fusion is
    # fair over: a source added since, still being embedded, does not send the notes found,
    # all embedded, back to BM25's order
    candidate_coverage: float | None = None
    best_similarity: float | None = None
    query_truncated: dict | None = None
    fusion: str | None = None
    weights: dict | None = None
    feedback: dict | None = None
    cut_below_threshold: int | None = None
    below_threshold: bool = False
    # the best chunk by meaning clears the threshold by less than hybrid.WEAK_MEANING: with
    # few of the query's distinctive words found, the answer is low-confidence (ops/search.py)
    weak_meaning: bool = False
    meaning_bar: float | None = None
    rerank_reason: str | None = None
    trusted: Trusted | None = None
    # file id -> (what its whole text adds, its BM25 score, its rank): notes.group's
    note_evidence: dict | None = None
    # candidates per ranking this search asked for, and whether a ranking had more to give
    # (its list was full): then fewer than k notes may only be the candidates' doing
    asked: int = 0
    full: bool = False
    widened: int | None = None  # the candidates asked for when the first ones gave < k notes

    @property
    def coverage(self) -> float:
        """Of the index: how far a missing match by meaning may be only not embedded yet."""
        return 1.0 if self.vector_coverage is None else self.vector_coverage

    @property
    def fusion_coverage(self) -> float:
        """Of the chunks being fused: whether the two rankings can be fused fairly."""
        return self.coverage if self.candidate_coverage is None else self.candidate_coverage

    def reply_fields(self) -> dict:
        out: dict = {"reranked": self.reranked, "degraded": self.degraded,
                     "timings": self.timings}
        for name in REPLY_FIELDS:
            value = getattr(self, name)
            if value is not None and value is not False:
                out[name] = value
        if self.trusted is not None:
            out["trusted"] = self.trusted.reply()
        return out
