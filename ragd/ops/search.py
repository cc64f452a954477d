"""The search and ask ops: their arguments and filters checked, the ranking run in one
snapshot of the index (search/hybrid.py), its notes grouped (search/notes.py), and the reply
chosen from what was ranked.
"""

from __future__ import annotations

import datetime
import os
import re
import time

from ragd import dates
from ragd import protocol as P
from ragd.ops import args
from ragd.ops.parts import Parts
from ragd.ops.results import Results
from ragd.ops.status import StatusOps
from ragd.replies import OpError
from ragd.index import store
from ragd.search import ask, bm25, names, notes
from ragd.search.filters import Filters
from ragd.search.fusion import Candidate, lift
from ragd.search.hybrid import MODES

ECHO_CHARS = 1000  # of a search's query echoed in its reply (query_chars: the whole length)
# A search whose candidates gave fewer than k notes asks again for WIDEN times as many, up to
# MAX_CANDIDATES per ranking
WIDEN = 4
MAX_CANDIDATES = 1600


class SearchOps:
    def __init__(self, parts: Parts, status: StatusOps, results: Results):
        self.p = parts
        self.status = status  # its wait, for search --wait
        self.results = results

    def _named_first(self, db, query: str, filters: Filters, r, grouped: list,
                     group: str) -> None:
        """A query that is a note's name puts that note first (search/names.py): in grouped
        (notes), or in r.candidates (chunks). Its scores say `named`."""
        # (a note open in an editor with unsaved changes is searched as its buffer: its
        # indexed text is not shown)
        bufs = self.p.buffers.active() if self.p.buffers is not None else []
        key, ids = names.named(db, query, exclude={b.file_id for b in bufs})
        if ids and filters.active:
            cond, params = filters.where("f")
            marks = ",".join("?" * len(ids))
            passed = {row[0] for row in db.execute(
                f"SELECT f.id FROM files f WHERE f.id IN ({marks}) AND {cond}", [*ids, *params])}
            ids = [f for f in ids if f in passed]
        if not ids:
            return
        if r.nothing_relevant:  # (another reason, a degraded search's, still holds)
            r.nothing_relevant, r.reason = False, None

        def mark(c):
            c.parts["named"] = key
        if group == "note":
            for n in grouped:  # (before put_first marks them: the opening may be new)
                if n.file_id in ids:
                    names.show_opening(db, n)
            names.put_first(db, grouped, ids, lambda n: n.file_id,
                            lambda fid, cid, score: notes.Note(fid, score,
                                                               [Candidate(cid, score, {})]),
                            lambda n: [mark(c) for c in n.chunks])  # (any may be shown)
        else:
            files = store.chunk_files(db, [c.chunk_id for c in r.candidates])
            names.put_first(db, r.candidates, ids,
                            lambda c: files.get(c.chunk_id, (None,))[0],
                            lambda fid, cid, score: Candidate(cid, score, {}), mark)

    def cmd_search(self, query: str, k: int | None, mode: str | None, sources: list | None,
                   rerank: bool | None, wait: float, path: str | None = None,
                   tag: str | None = None, since=None, before=None,
                   group: str = "note", second: bool = False) -> dict:
        """second (not a wire argument: ask's): each note result also carries its second
        best passage (`second`), when it matched nearly as well."""
        t0 = time.perf_counter()
        cfg = self.p.cfg
        if not query.strip():
            raise OpError(P.BAD_ARGS, "search: empty query")
        args.bounded("search", "query", query)
        if group not in ("note", "chunk"):
            raise OpError(P.BAD_ARGS, f"search: 'group' must be note or chunk, got {group!r}")
        if not 0 <= wait <= 60:
            raise OpError(P.BAD_ARGS, f"search: 'wait' must be between 0 and 60 s, got {wait}")
        fresh = self.status.fresh(wait) if wait else None
        k = cfg.search_k if k is None else k
        mode = mode or cfg.search_mode
        if not 1 <= k <= P.MAX_K:
            raise OpError(P.BAD_ARGS, f"search: 'k' must be between 1 and {P.MAX_K}, got {k}")
        if mode not in MODES:
            raise OpError(P.BAD_ARGS, f"search: mode must be one of {', '.join(MODES)}, "
                          f"got {mode!r}")
        filters = self.filters("search", sources, path, tag, since, before)
        text = self.p.text
        with self.p.reads.conn(snapshot=True) as db:
            # the tantivy searcher holding exactly this snapshot's chunks, or why FTS5 answers
            text_view = text.view(db) if text is not None else None
            # the files not yet in this snapshot: a save the indexer takes in while the query
            # is embedded is in the index by the end of the search, not in what it read
            waiting = self._waiting()
            setup = round((time.perf_counter() - t0) * 1e3, 2)
            r = self.p.searcher.run(db, query, k, mode, filters, rerank, group, text_view)
            t = time.perf_counter()
            grouped = notes.group(db, r.candidates, r.reranked, self.p.buffers, r.note_evidence)
            first = grouped
            while group == "note" and len(grouped) < k and r.full and r.asked < MAX_CANDIDATES:
                # A few long notes can take every candidate, each with many matching chunks:
                # the rankings are asked for more, until k notes or no ranking has more to give
                r = self.p.searcher.run(db, query, k, mode, filters, rerank, group, text_view,
                                        min(r.asked * WIDEN, MAX_CANDIDATES))
                r.widened = r.asked
                t = time.perf_counter()
                grouped = notes.after(first, notes.group(db, r.candidates, r.reranked,
                                                         self.p.buffers, r.note_evidence))
            if r.trusted is not None and group == "note" and not r.reranked:
                cid = r.trusted.chunk_id
                r.trusted.lifted_from = lift(
                    grouped, lambda n: any(c.chunk_id == cid for c in n.chunks), r.trusted.rank)
            if not r.filtered_out:
                self._named_first(db, query, filters, r, grouped, group)
            served = (text, text_view[0]) if text_view and text_view[0] else None
            conf = notes.confidence(db, query, grouped, self.p.buffers, served) \
                if grouped else None
            unknown = bm25.unknown_names(db, query) if grouped else []
            # a weak best match by meaning, and a word no note holds: the notes likely do not
            # answer, however rare the words they do hold are (confidence weighs by rarity)
            unheld = bm25.unheld_words(db, query, served) if grouped and (
                r.weak_meaning or r.below_threshold) else []
            if group == "note":
                results = self.results.notes(db, grouped, k, query, r.note_evidence, second)
            else:
                results = self.results.chunks(
                    db, [(c.chunk_id, c.score, c.parts) for c in r.candidates], k, titled=True)
        if r.trusted is not None:  # which result it is: --explain names it
            cid = r.trusted.chunk_id
            at = next((i for i, x in enumerate(results, 1) if x.get("chunk_id") == cid), None) \
                if group != "note" else next((i for i, n in enumerate(grouped, 1) if any(
                    c.chunk_id == cid for c in n.chunks)), None)  # (results: grouped's order)
            r.trusted.result = at if at is not None and at <= len(results) else None
        matcher = bm25.LineMatcher(query)
        for res in results:
            res.pop("chunk_id", None)
            at = matcher.lines(res["text"], res["line_start"])
            if res["path"].lower().endswith(".pdf"):  # its range counts pages; a chunk is in one
                at = [res["line_start"]] if at else []  # (they were its lines: past its end)
            res["match_lines"] = at
        r.timings["fetch_ms"] = round((time.perf_counter() - t) * 1e3, 2)
        r.timings["setup_ms"] = setup  # (the filters, the snapshot and its tantivy view)
        reply = {"query": query if len(query) <= ECHO_CHARS else query[:ECHO_CHARS] + "…",
                 "mode": r.mode, "elapsed_ms": round((time.perf_counter() - t0) * 1e3, 3),
                 "results": results, **r.reply_fields()}
        if conf is not None:
            reply["confidence"] = conf
            # below the similarity threshold only keywords answer: then a literal match of
            # every distinctive word (a name, a made-up word) is sure, some of them are not
            # ("what is the capital of France" found "capital" and "Frances": confidence 0.55)
            reply["low_confidence"] = (conf < notes.LOW_CONFIDENCE and r.trusted is None) or (
                r.below_threshold and conf < 1.0) or (
                r.weak_meaning and conf < notes.WEAK_CONFIDENCE)
        if unknown:  # "Todoist", "OAuth2": a name no note mentions
            reply["unknown_names"] = unknown
            reply["low_confidence"] = True
        if unheld:
            reply["unheld_words"] = unheld
            reply["low_confidence"] = True
        reply["group"] = group
        thr = self.p.searcher.threshold()
        if r.mode == "vector" and thr > 0:
            # vector search lists the nearest, close or not (nothing else stands in): how many
            # of them are not close by the threshold's measure is said, not left to the scores
            under = sum(1 for x in results if x["scores"].get("vector", 1.0) < thr)
            if under:
                reply["under_threshold"] = under
                reply["threshold"] = round(thr, 4)
        if len(query) > ECHO_CHARS:  # a pasted page is not sent back whole with every reply
            reply["query_chars"] = len(query)
        if fresh is not None:
            reply["waited"] = {"fresh": fresh, "ms": round((time.perf_counter() - t0) * 1e3, 1)}
        waiting = max(waiting, self._waiting())  # (and those heard since it was taken)
        if waiting:  # then "nothing relevant" may only be "not indexed yet"
            reply["files_pending"] = waiting
        return reply

    def _waiting(self) -> int:
        """Files changed on disk (heard, or found by a scan) that the index does not hold
        yet."""
        watcher = self.p.watcher
        return self.p.indexer.pending + (watcher.pending if watcher is not None else 0)

    def cmd_ask(self, question: str, k: int | None, max_tokens: int | None,
                sources: list | None, path: str | None, tag: str | None):
        """A grounded answer from the notes: retrieval as search does, then the generator
        answers from the notes found alone, citing them (ragd/search/ask.py). Streams the
        notes used and the answer's text, then the answer with its citations."""
        args.bounded("ask", "question", question)
        if "generator" not in self.p.engines.configured and \
                "generator.model" in self.p.restart_needed:
            why = [p.split("; it cannot")[0].removeprefix("generator.model: ")
                   for p in self.p.config_problems if p.startswith("generator.model:")]
            raise OpError(P.UNAVAILABLE, "ask: the config's [generator] model takes effect at "
                          "the next start ('ragctl stop && ragctl start')" + (
                              f", and it cannot serve: {why[0]}" if why else ""))
        return ask.ask(self.cmd_search, self.p.cfg, self.p.engines, question, k, max_tokens,
                       sources, path, tag)

    def filters(self, op: str, sources: list | None, path: str | None = None,
                tag: str | None = None, since=None, before=None) -> Filters:
        """Check the filter arguments of a search-like op. Rows of a source no longer
        configured (being purged) are never answered from."""
        if sources is not None:
            if not all(isinstance(s, str) for s in sources):
                raise OpError(P.BAD_ARGS, f"{op}: 'sources' must be a list of source names")
            sources = [args.source(self.p.cfg, op, s).name for s in sources]
        elif self.p.indexer.unconfigured:
            sources = [s.name for s in self.p.cfg.sources]
        if path and os.path.isabs(os.path.expanduser(path)):
            sources, path = self._relative_filter(op, sources, path)
        if tag is not None and not tag.lstrip("#"):
            raise OpError(P.BAD_ARGS, f"{op}: 'tag' is empty")
        return Filters(sources=tuple(sources) if sources is not None else None,
                       path=path or None, tag=tag,
                       since=_when(op, "since", since), before=_when(op, "before", before))

    def _relative_filter(self, op: str, sources: list | None,
                         path: str) -> tuple[list, str | None]:
        """An absolute path filter (a folder or glob as search results write paths) made
        relative to the source whose folder holds it, the search kept to that source: the
        index holds paths relative to their source's folder, so '/home/me/Notes/Projects/*'
        matched nothing, silently. One outside every source searched is refused, saying so."""
        full = os.path.normpath(os.path.expanduser(path))  # ('~/Notes/../Docs': Docs)
        parts = full.split("/")
        fixed = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")),
                     len(parts))  # the folders before the first wildcard, through symlinks
        real = os.path.join(os.path.realpath("/".join(parts[:fixed]) or "/"), *parts[fixed:])
        searched = [s for s in self.p.cfg.sources if sources is None or s.name in sources]
        for s in sorted(searched, key=lambda s: -len(str(s.root))):  # the innermost first
            root = str(s.root).rstrip("/")
            for p in (full, real):
                if p == root or p.startswith(root + "/"):
                    return [s.name], p[len(root) + 1:] or None
        raise OpError(P.BAD_ARGS, f"{op}: path {path!r} is in no source's folder"
                      + (" searched" if sources is not None else "")
                      + f" ({', '.join(f'{s.name}: {s.root}' for s in searched) or 'none'}); "
                      f"a path filter is relative to its source's folder, e.g. 'Projects/*'")

TIME_LIMIT = 9.2e9  # Unix seconds; x 1e9 stays within SQLite's 64-bit integers


def _when(op: str, name: str, value) -> float | None:
    """A time filter: Unix seconds, an ISO date / date-time (local time), or a date relative
    to today ('today', 'yesterday', '7d', '2w', '3m', '1y': dates.relative). Read here, so
    that every client takes the same words."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            t = datetime.datetime.fromisoformat(value.strip()).timestamp()
        except (ValueError, OverflowError):
            t = None
        if t is None and re.fullmatch(r"[+-]?\d+(\.\d+)?", value.strip()):
            t = float(value)  # Unix seconds as text (ragctl search --since 1700000000)
        if t is None:
            t = dates.relative(value)
        if t is None:
            raise OpError(P.BAD_ARGS, f"{op}: '{name}' must be a date (YYYY-MM-DD), a date-time, "
                          f"today, yesterday, a time ago (7d, 2w, 3m, 1y) or Unix seconds, "
                          f"got {value!r}") from None
    else:
        t = float(value)
    if t != t:
        raise OpError(P.BAD_ARGS, f"{op}: '{name}' is not a number")
    # as far as a file's time in nanoseconds reaches (1678-2262): "before 9999-12-31" is "no
    # upper bound", where it overflowed SQLite's integer (an internal error and a traceback)
    return max(-TIME_LIMIT, min(TIME_LIMIT, t))


