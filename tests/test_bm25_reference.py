"""FTS5's bm25() is Okapi BM25: checked against rank_bm25 on the very tokens FTS5 stored.

rank_bm25 rebuilds its whole model on every change (seconds at 100k chunks), so ragd serves
BM25 from FTS5; this test keeps rank_bm25 as the reference ranking. FTS5 scores a row over all
its columns (each weight 1 here) and uses k1 = 1.2, b = 0.75; the reference is
given the same tokens and parameters (all three columns: heading, keywords, body).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import sqlite3
import time
from collections import defaultdict
from pathlib import Path

import pytest
from rank_bm25 import BM25Okapi

from conftest import SHARED, copy_vault
from ragd import config
from ragd.protocol import fold, operators
from ragd.index import schema, store
from ragd.index.indexer import Indexer
from ragd.search import bm25
from ragd.text import (HYBRID_COMMON_SHARE, WEIGHTS, content_terms, fts_query, index_tokens,
                       note_keywords, prune_common, query_parts, symbols)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bm25")
    root = copy_vault("obsidian-tasks-docs", tmp / "vault")
    cfg = config.from_dict({"daemon": {"data_dir": str(tmp / "data")},
                            "sources": [{"name": "v", "path": str(root), "kind": "obsidian"}]},
                           None)
    store.open_store(cfg.db_path).close()
    ix = Indexer(cfg, cfg.db_path)
    ix.start()
    ix.request_scan()
    assert ix.wait_idle(120)
    ix.stop()
    db = store.connect(cfg.db_path)
    yield db
    db.close()


def fts_tokens(db: sqlite3.Connection) -> dict[int, list[str]]:
    db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.vocab USING fts5vocab(main, chunks_fts, "
               "instance)")
    docs: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    for term, doc, col, offset in db.execute("SELECT term, doc, col, offset FROM temp.vocab"):
        docs[doc].append((("heading", "keywords", "body").index(col), offset, term))
    return {doc: [t for _, _, t in sorted(toks)] for doc, toks in docs.items()}


def query_tokens(db: sqlite3.Connection, query: str) -> list[str]:
    """Tokenize like FTS5 does: each distinct query word (as fts_query builds the OR-query)."""
    db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.q USING fts5(x, tokenize = 'porter "
               "unicode61 remove_diacritics 2')")
    db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.qv USING fts5vocab(temp, q, instance)")
    out = []
    for phrase in fts_query(query).split(" OR "):
        db.execute("DELETE FROM temp.q")
        db.execute("INSERT INTO temp.q (x) VALUES (?)", (phrase.strip('"'),))
        out += [r[0] for r in db.execute("SELECT term FROM temp.qv ORDER BY offset")]
    return out


QUERIES = ["recurring completion date", "custom sorting functions", "chrono library dates",
           "global filter tag", "dataview inline fields", "priority emoji signifiers",
           "query file defaults", "postponing scheduled dates"]


@pytest.mark.parametrize("query", QUERIES)
def test_fts5_bm25_matches_rank_bm25(indexed, query):
    docs = fts_tokens(indexed)
    ids = sorted(docs)
    ref = BM25Okapi([docs[i] for i in ids], k1=1.2, b=0.75)
    q = query_tokens(indexed, query)
    n = len(ids)
    # Terms in over half the rows have a non-positive IDF, clamped differently by the two
    # implementations; the chosen queries avoid them, and this checks they still do.
    for t in set(q):
        assert sum(t in set(d) for d in docs.values()) < n / 2, t
    scores = ref.get_scores(q)
    ref_top = sorted(((s, ids[i]) for i, s in enumerate(scores) if s > 0), reverse=True)[:10]

    rows = indexed.execute("SELECT rowid, -bm25(chunks_fts, 1.0, 1.0, 1.0) AS s FROM "
                           "chunks_fts WHERE chunks_fts MATCH ? ORDER BY "
                           "bm25(chunks_fts, 1.0, 1.0, 1.0) LIMIT 10",
                           (fts_query(query),)).fetchall()
    assert len(rows) == len(ref_top) == 10
    by_id = dict(zip(ids, scores))
    for (ref_score, _), (row_id, score) in zip(ref_top, rows):
        # The same score at each rank, and each row FTS5 returns scores the same in the
        # reference: the same top 10 in the same order, up to exact ties.
        assert score == pytest.approx(ref_score, rel=1e-6)
        assert by_id[row_id] == pytest.approx(score, rel=1e-6)


@pytest.mark.parametrize("query", ["recurring task completion", "the task in the filter",
                                   "postponing a scheduled task"])
def test_pruning_common_words_keeps_the_ranking(indexed, query):
    """BM25 alone drops words in over half the rows (here 'task', 'the'): FTS5 scores them at
    IDF 1e-6, so the top 10 keep their scores to within that."""
    from ragd.search import bm25
    n = indexed.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    parts = query_parts(query)
    assert len(prune_common(indexed, parts)) < len(parts)  # something was pruned
    full = indexed.execute(
        f"SELECT -bm25(chunks_fts, {WEIGHTS}) FROM chunks_fts WHERE chunks_fts MATCH ? "
        f"ORDER BY bm25(chunks_fts, {WEIGHTS}) LIMIT 10", (" OR ".join(parts),)).fetchall()
    pruned = bm25.search(indexed, query, 10)
    assert len(pruned) == 10 and n > 1000
    for (s_full,), hit in zip(full, pruned):
        assert hit.score == pytest.approx(s_full, abs=1e-4)


def test_bm25_search_keeps_the_callers_read_transaction(tmp_path):
    """A search reads one snapshot (ops: reads.conn(snapshot=True)); preparing BM25's temp
    tables once used executescript, which commits the caller's transaction."""
    from ragd.search import bm25
    db = store.open_store(tmp_path / "index.sqlite3")
    db.execute("BEGIN")
    db.execute("SELECT COUNT(*) FROM chunks").fetchone()
    bm25.search(db, "what is a recurring task and how does it repeat", 10)
    index_tokens(db, ["Cats were running"])
    assert db.in_transaction
    db.execute("COMMIT")


@pytest.mark.parametrize("query", ["recurring task completion", "the task in the filter",
                                   "postponing a scheduled task",
                                   "how do I make my tasks show up in the daily note"])
def test_hybrid_pruning_keeps_most_of_the_top_10(indexed, query):
    """Inside hybrid search BM25 also drops words in over a quarter of the rows (IDF at most
    ln 3): the BM25 list moves a little, most of its top 10 stays."""
    from ragd.search import bm25
    parts = query_parts(query)
    full = [r[0] for r in indexed.execute(
        f"SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ? "
        f"ORDER BY bm25(chunks_fts, {WEIGHTS}) LIMIT 10", (" OR ".join(parts),))]
    pruned = [h.chunk_id for h in bm25.search(indexed, query, 10,
                                              share=HYBRID_COMMON_SHARE)]
    assert len(set(full) & set(pruned)) >= 7, (query, prune_common(indexed, parts))


class LuceneBM25(BM25Okapi):
    """rank_bm25's Okapi BM25 with the IDF of Lucene and tantivy, ln(1 + (N - n + .5)/(n + .5)),
    which stays positive for words in over half the rows."""

    def _calc_idf(self, nd):
        for word, freq in nd.items():
            self.idf[word] = math.log(1 + (self.corpus_size - freq + 0.5) / (freq + 0.5))


@pytest.fixture(scope="module")
def tantivy_index(indexed, tmp_path_factory):
    """The tantivy index of the same chunks, filled by its own sync thread."""
    from ragd.index import textindex
    db_path = Path(indexed.execute("PRAGMA database_list").fetchone()[2])
    textindex.install(indexed)
    ti = textindex.TextIndex(db_path, tmp_path_factory.mktemp("text"))
    ti.start()
    deadline = time.monotonic() + 120
    while not ti.serving:
        assert time.monotonic() < deadline, ti.status()
        ti.wait_synced(1.0)
    assert ti.wait_synced(60)
    yield ti
    ti.stop()


@pytest.mark.parametrize("query", QUERIES + ["🔁 every week", "⛔ blocked by"])
def test_tantivy_bm25_matches_rank_bm25(indexed, tantivy_index, query):
    """The tantivy index ranks as BM25 (k1 1.2, b 0.75) on the tokens it was given: each
    chunk's text as FTS5 tokenizes it (textindex.search_text: heading and keywords twice),
    then its symbols (emoji: FTS5 drops them). tantivy stores a document's length in one byte
    (exact below 40 tokens, within ~1/16 above), so its scores are the reference's to within a
    few percent, not exactly."""
    rows = [(i, h, note_keywords(h, k, b), b) for i, h, k, b in indexed.execute(
        "SELECT id, heading, keywords, body FROM chunks ORDER BY id")]  # (symbols as such)
    ids = [r[0] for r in rows]
    docs = [index_tokens(indexed, [f"{r[1]}\n{r[2]}\n{r[1]}\n{r[2]}\n{r[3]}"])[0].split()
            + symbols(f"{r[1]}{r[2]}{r[1]}{r[2]}{r[3]}") for r in rows]
    ref = LuceneBM25(docs, k1=1.2, b=0.75)
    q = [t for p in query_parts(query) for t in index_tokens(indexed, [p])[0].split()]
    q += symbols(query)
    if q[-1] in ("🔁", "⛔"):  # symbols are searchable: the chunks holding one come first
        assert sum(q[-1] in d for d in docs) >= 3
    scores = dict(zip(ids, ref.get_scores(q)))
    ref_top = sorted(scores, key=lambda i: -scores[i])[:10]
    searcher, why = tantivy_index.view(indexed)
    assert why == "tantivy"
    got = tantivy_index.search(searcher, indexed, query, 10, share=1.0)
    assert len(got) == 10 and tantivy_index.status()["pending"] == 0
    for cid, score in got:  # each hit scores as the reference scores it
        assert score == pytest.approx(scores[cid], rel=0.05), cid
    # the same top 10, up to the length rounding: ranks may swap among near ties
    assert len({c for c, _ in got} & set(ref_top)) >= 8, (got, ref_top)
    kth = scores[ref_top[-1]]
    assert all(scores[c] >= kth * 0.95 for c, _ in got)


@pytest.mark.parametrize("query", QUERIES + ["⛔ blocked by", "recurrence rule parsing"])
def test_the_notes_tantivy_index_ranks_whole_notes_as_bm25_and_as_notes_fts(
        indexed, tantivy_index, query):
    """The notes' index (one document a note: its notes_fts row, textindex.note_text) ranks
    as BM25 on those tokens, for the parts the note-level BM25 keeps (text.note_terms; a
    symbol as the word notes_fts holds it by). Its order is notes_fts's own, up to the column
    weights FTS5 gives the title, tags and headings: the same best notes."""
    from ragd.index.textindex import note_text
    from ragd.text import note_terms, word_tokens
    rows = indexed.execute("SELECT rowid, title, keywords, headings, body FROM notes_fts "
                           "ORDER BY rowid").fetchall()
    ids = [r[0] for r in rows]
    ref = LuceneBM25([t.split() for t in index_tokens(indexed, [note_text(*r[1:])
                                                                 for r in rows])],
                     k1=1.2, b=0.75)
    parts = note_terms(indexed, query)
    assert parts, query
    toks = [word_tokens(indexed, [p.strip('"')])[0].split() for p in parts]
    if query.startswith("⛔"):  # (the symbol's word: notes_fts holds ⛔ as sym26d4)
        assert ["sym26d4"] in toks
    scores = dict(zip(ids, ref.get_scores([t for ts in toks for t in ts])))
    searcher, why = tantivy_index.view(indexed)
    assert why == "tantivy"
    got = tantivy_index.note_search(searcher, toks, 10)
    assert got and len(got) == min(10, sum(s > 0 for s in scores.values()))
    for fid, score in got.items():  # as the reference scores it (lengths in one byte)
        assert score == pytest.approx(scores[fid], rel=0.05), fid
    ref_top = [i for i in sorted(scores, key=lambda i: -scores[i])[:10] if scores[i] > 0]
    assert len(set(got) & set(ref_top)) >= 0.8 * len(ref_top), (got, ref_top)
    fts = bm25.note_search(indexed, parts, 10)
    assert len(set(list(got)[:5]) & set(list(fts)[:5])) >= 3, (got, fts)


def test_tantivy_answers_only_for_the_snapshot_it_holds(tmp_path):
    """Never stale, never ahead: a search's snapshot with a commit the tantivy index has not
    taken yet (the sync thread stopped here) is answered by FTS5, which finds the new word;
    once synced, tantivy answers and finds it too. A snapshot taken before that sync keeps
    reading the searcher of its own generation."""
    from conftest import small_vault
    from ragd.index import textindex
    root = small_vault(tmp_path / "vault")
    cfg = config.from_dict({"daemon": {"data_dir": str(tmp_path / "data")},
                            "sources": [{"name": "v", "path": str(root)}]}, None)
    store.open_store(cfg.db_path).close()
    db = store.connect(cfg.db_path)
    textindex.install(db)
    ix = Indexer(cfg, cfg.db_path)
    ix.start()
    ix.request_scan()
    assert ix.wait_idle(60)
    ix.stop()

    def synced_index() -> textindex.TextIndex:
        ti = textindex.TextIndex(cfg.db_path, cfg.data_dir)
        ti.start()
        deadline = time.monotonic() + 60
        while not (ti.serving and ti.wait_synced(1.0)):
            assert time.monotonic() < deadline, ti.status()
        return ti

    ti = synced_index()
    old_gen = ti._gen
    ti.stop()  # no sync from here on
    with store.transaction(db):  # (as the indexer writes: its notes' rows rebuilt)
        db.execute("UPDATE chunks SET body = body || ' zyzzogeton' WHERE id = "
                   "(SELECT MIN(id) FROM chunks)")
        schema.refresh_notes(db)
    first_file = db.execute("SELECT file_id FROM chunks WHERE id = "
                            "(SELECT MIN(id) FROM chunks)").fetchone()[0]
    searcher, why = ti.view(db)
    assert searcher is None and why.startswith("fts5 (") and "catching up" in why
    assert [h.chunk_id for h in bm25.search(db, "zyzzogeton", 5)] == \
        [db.execute("SELECT MIN(id) FROM chunks").fetchone()[0]]

    reader = store.connect(cfg.db_path)  # a snapshot taken before the sync below
    reader.execute("BEGIN")
    # the chunk, and its note (its file id negated)
    assert sorted(r[0] for r in reader.execute("SELECT chunk_id FROM text_outbox")) == \
        [-first_file, db.execute("SELECT MIN(id) FROM chunks").fetchone()[0]]
    ti2 = synced_index()  # takes the commit: a new generation
    try:
        searcher, why = ti2.view(db)
        assert why == "tantivy" and ti2._gen > old_gen
        hits = ti2.search(searcher, db, "zyzzogeton", 5)
        assert [c for c, _ in hits] == [db.execute("SELECT MIN(id) FROM chunks").fetchone()[0]]
        # the notes' index of the same generation holds the new word: in its note alone
        assert list(ti2.note_search(searcher, [["zyzzogeton"]], 5)) == [first_file]
        # the old snapshot still sees its outbox entry: FTS5 for it, not the newer searcher
        assert ti2.view(reader)[0] is None
    finally:
        reader.rollback()
        reader.close()
        ti2.stop()
        db.close()


def test_a_stop_right_after_the_start_is_not_slept_through(tmp_path):
    """The sync thread clears its wake at the start of each look at the outbox; a stop that
    came just before must still end it at once, not after its idle sleep (60 s: the daemon's
    own stop timed out on it once in CI)."""
    from ragd.index import textindex
    db_path = tmp_path / "index.sqlite3"
    db = store.open_store(db_path)
    textindex.install(db)
    db.close()
    for i in range(10):
        ti = textindex.TextIndex(db_path, tmp_path / f"data{i % 2}")
        ti.start()
        time.sleep(0.01 * i)  # the stop at a later moment of the start each time
        t = time.monotonic()
        ti.stop()
        assert time.monotonic() - t < 5, f"stop {i} waited {time.monotonic() - t:.1f} s"
        assert not ti.worker.alive


@pytest.mark.slow
def test_tantivy_is_filled_anew_before_deleted_chunks_skew_its_statistics(tmp_path):
    """tantivy counts a deleted document in its BM25 statistics until a merge drops it: with a
    third of the notes gone, a word only they held still had its document frequency, and N
    and the average length were the old ones. Past textindex.REFILL_SHARE deleted (since the
    fill) the index is filled anew; below it, it is kept. A chunk updated in place (a renamed
    note's) leaves a deleted document too."""
    from ragd.index import textindex
    root = copy_vault("obsidian-tasks-docs", tmp_path / "vault")
    cfg = config.from_dict({"daemon": {"data_dir": str(tmp_path / "data")},
                            "sources": [{"name": "v", "path": str(root), "kind": "obsidian"}]},
                           None)
    store.open_store(cfg.db_path).close()

    def index() -> None:
        ix = Indexer(cfg, cfg.db_path)
        ix.start()
        ix.request_scan()
        assert ix.wait_idle(120)
        ix.stop()

    index()
    db = store.connect(cfg.db_path)
    textindex.install(db)
    ti = textindex.TextIndex(cfg.db_path, tmp_path / "text")
    ti.start()
    try:
        # while it fills, status counts what is left (the chunks and notes, up to 8192), not
        # the 1 of "not looked yet" all through the first batch
        deadline = time.monotonic() + 60
        while ti.status()["state"] != "filling":
            assert time.monotonic() < deadline, ti.status()
            time.sleep(0.002)
        assert ti.status()["pending"] == min(8192, db.execute(
            "SELECT COUNT(*) FROM chunks").fetchone()[0] + db.execute(
            "SELECT COUNT(*) FROM files").fetchone()[0])
        def synced():
            deadline = time.monotonic() + 120
            # (wait_synced first: it sleeps; the loop must not spin while the fill runs)
            while not (ti.wait_synced(1.0) and ti.serving and ti.state == "in sync"):
                assert time.monotonic() < deadline, ti.status()
            searcher, why = ti.view(db)
            assert why == "tantivy"
            return searcher

        synced()
        chunks = db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
        assert ti.pushed == chunks
        # a few notes gone: fewer than REFILL_SHARE of the chunks, the index is kept
        kanban = db.execute("SELECT COUNT(*) FROM chunks JOIN files f ON f.id = file_id "
                            "WHERE f.relpath = 'Other Plugins/Kanban Plugin.md'").fetchone()[0]
        (root / "Other Plugins" / "Kanban Plugin.md").unlink()
        index()
        synced()
        assert ti.pushed < 2 * chunks
        # a word of "Queries" notes only; a third of the chunks deleted with them
        word = "delimiter"
        before = synced().chunks.doc_freq("text", index_tokens(db, [word])[0])
        assert before > 0
        # those notes renamed: their chunks are updated in place (same ids, new headings), and
        # each update leaves a deleted document behind as a delete does
        for p in list((root / "Queries").rglob("*.md")):
            p.rename(p.with_name("Renamed " + p.name))
        index()
        assert db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0] == chunks - kanban
        searcher = synced()
        assert searcher.chunks.doc_freq("text", index_tokens(db, [word])[0]) == before
        assert searcher.chunks.num_docs == chunks - kanban
        shutil.move(str(root / "Queries"), tmp_path / "Queries")
        index()
        assert db.execute("SELECT COUNT(*) FROM chunks_fts WHERE chunks_fts MATCH ?",
                          (word,)).fetchone()[0] == 0
        left = db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
        assert chunks - left >= 0.25 * left  # (over REFILL_SHARE)
        searcher = synced()
        assert searcher.chunks.num_docs == left
        assert searcher.chunks.doc_freq("text", index_tokens(db, [word])[0]) == 0
        # the notes' index with them: one document a note, none holding the word
        assert searcher.notes.num_docs == db.execute(
            "SELECT COUNT(DISTINCT file_id) FROM chunks").fetchone()[0]
        assert searcher.notes.doc_freq("text", index_tokens(db, [word])[0]) == 0
        assert ti.pushed >= chunks + left  # filled anew
    finally:
        ti.stop()
        db.close()


def _lines_read_line_by_line(text: str, query: str) -> list[int]:
    """The lines shown for a match, as their definition reads (bm25.LineMatcher's docstring):
    each line split into words (diacritics folded, as the index folds them: protocol.fold),
    a word standing for a content word of the query when its stem
    starts with the query word's stem or is a prefix of it of 4 letters or more, or is the
    query word itself when that has under 3 letters (bm25._same),
    or holding a symbol of the query (an operator as a whole run of signs: '::' is not in
    ':::'). The matcher finds the same without splitting every line."""
    stems = {bm25._stem(fold(w)) for w in content_terms(query) if not w.startswith('"')}
    signs = set(symbols(query))

    def stands(word: str) -> bool:
        stem = bm25._stem(fold(word))
        return any(bm25._same(stem, s) for s in stems)

    def holding(lines):
        return [i + 1 for i, line in enumerate(lines)
                if any(stands(w) for w in bm25.TOKEN.findall(line))
                or any(ch in line for ch in signs if len(ch) == 1)
                or any(op in operators(line) for op in signs if len(op) > 1)]

    # ... outside links' targets (a Markdown link's "(url)", a bare URL) when any line does
    outside = [re.sub(r"\]\([^)]*\)", "]", line) for line in text.split("\n")]
    outside = [re.sub(r"<?\b[A-Za-z][A-Za-z0-9+.-]*://[^\s)>]*>?", " ", line) for line in outside]
    return holding(outside) or holding(text.split("\n"))


def test_the_lines_shown_are_those_that_hold_a_query_word(indexed):
    """On every chunk of the Tasks docs, for the dev set's questions and queries of names,
    short stems, symbols, capitals and words joined by '_': LineMatcher.lines is the reading
    line by line. (It looks only where a word starts with one of the query's stems.)"""
    questions = [json.loads(ln)["question"] for ln in open(
        SHARED / "eval" / "obsidian-tasks" / "obsidian-tasks-questions.jsonl")]
    queries = questions + QUERIES + ["CSS snippets", "due ⏫ tasks", "📅 scheduled", "a -> b",
                                     "x == y && z", "key:: value",
                                     "filter_by_function", "is:recurring", "URL api API",
                                     "day days daily", "ÉTÉ été", "resume cafe naive",
                                     "résumé café", "ÿ", "x y go"]
    texts = [t for (t,) in indexed.execute("SELECT body FROM chunks ORDER BY id")][::4]
    assert len(texts) > 300
    shown = 0
    for query in queries:
        if '"' in query:  # (phrases: read as before, word by word)
            continue
        matcher = bm25.LineMatcher(query)
        for text in texts:
            want = _lines_read_line_by_line(text, query)
            assert matcher.lines(text, 1) == want, (query, text[:200])
            shown += bool(want)
    assert shown > 300  # (the queries do match: not a comparison of empty lists)


def test_a_query_word_of_one_or_two_letters_is_matched_whole():
    """The index matches a query word as a whole word; the lines shown did so only for words
    long enough to be cut to a stem. A one-letter query ('ÿ', folded to 'y') marked every line
    holding a word that starts with y."""
    m = bm25.LineMatcher("ÿ")
    assert m.lines("you and me\nfrom x to y\nyes, yearly", 1) == [2]
    assert bm25.LineMatcher("go").lines("going on\ngood\nwe go", 1) == [3]
    assert bm25.LineMatcher('"x y"').lines("x yes\nx y", 1) == [2]
    assert bm25.LineMatcher("yak").lines("yaks\nyes", 1) == [1]  # (3 letters: as before)


def test_a_line_whose_match_is_only_in_a_link_target_is_no_jump_line():
    """"onboarding new engineers" jumped to `![](assets/labs---new-member-onboarding-2023.webp)`
    (a fresh-user walk): a match only inside a link's target or a URL does not make a line a
    match while another line holds the words; a link's own text does; with no other line,
    the target's line is still the match (something to jump to)."""
    m = bm25.LineMatcher("onboarding new engineers")
    text = ("# Team\n![](assets/labs---new-member-onboarding-2023.webp)\n"
            "How we run onboarding for new engineers.\n"
            "[Onboarding guide](https://example.com/onboarding)\n"
            "see <https://example.com/new-engineers> and https://example.com/onboarding")
    assert m.lines(text, 10) == [12, 13]
    assert m.lines("intro\n![](assets/new-member-onboarding.webp)", 5) == [6]
    assert m.lines("[[Onboarding]] checklist (for new engineers)", 1) == [1]


def test_held_agrees_with_the_word_counts(indexed):
    """bm25.held (a one-row match per token) says a word is held exactly when its count over
    the chunks (doc_freqs, a walk of its whole list) is above 0: stemmed, folded, split."""
    from ragd.text import doc_freqs
    words = ["recurrence", "recurring", "Recurring", "filters", "sourdough", "giraffe",
             "due-date", "café", "zzqx", "done_date", "e-mail", "réunion", "x", "12"]
    counts = doc_freqs(indexed, [f'"{w}"' for w in words])
    got = bm25.held(indexed, words)
    assert got == [df > 0 for df in counts], list(zip(words, counts, got))
    assert True in got and False in got  # the words were chosen to give both


def test_held_from_tantivy_agrees_with_fts5(indexed, tantivy_index):
    """Where tantivy serves, bm25.held reads its document frequencies of the words' index
    tokens instead of matching FTS5 (search's unheld words): the same answers."""
    words = ["recurrence", "recurring", "Recurring", "filters", "sourdough", "giraffe",
             "due-date", "café", "zzqx", "done_date", "e-mail", "réunion", "x", "12",
             "starter", "Dataview"]
    searcher, why = tantivy_index.view(indexed)
    assert why == "tantivy"
    fts5 = bm25.held(indexed, words)
    assert bm25.held(indexed, words, (tantivy_index, searcher)) == fts5
    assert True in fts5 and False in fts5
    query = "how do I bake sourdough bread with recurring filters"
    assert bm25.unheld_words(indexed, query, (tantivy_index, searcher)) == \
        bm25.unheld_words(indexed, query) == ["bake", "sourdough"]


@pytest.mark.parametrize("query", QUERIES + ["sync tasks with google calendar",
                                             "recurring tasks recurring dates 🔁"])
def test_confidence_is_the_best_notes_share_of_the_weighted_words(indexed, tantivy_index,
                                                                  query):
    """notes.confidence gives up on a note once it cannot beat the best so far and skips the
    words no chunk holds; the figure is still, word by word, the largest IDF-weighted share of
    the query's words one of the first notes holds (FTS5 and tantivy alike)."""
    from ragd.search import notes
    from ragd.search.fusion import Candidate
    from ragd.text import chunk_rows, doc_freq, sign_word
    words = list(dict.fromkeys(
        [w for w in content_terms(query) if not w.startswith('"')]
        + [sign_word(s) for s in dict.fromkeys(symbols(query))]))
    rows = chunk_rows(indexed)
    weight = {}
    for w in words:
        df = doc_freq(indexed, f'"{w}"')
        weight[w] = math.log((rows + 1) / (df + 0.5)) if df else math.log(rows + 1)
    # the notes: the files of the chunks BM25 ranks first, and one holding none of the words
    hits = bm25.search(indexed, query, 60)
    fids = list(dict.fromkeys(indexed.execute(
        "SELECT file_id FROM chunks WHERE id = ?", (h.chunk_id,)).fetchone()[0] for h in hits))
    assert len(fids) >= 3
    for order in (fids[:3], fids[2::-1], [fids[5], fids[1], fids[0]]):
        ns = [notes.Note(f, 1.0, [Candidate(indexed.execute(
            "SELECT MIN(id) FROM chunks WHERE file_id = ?", (f,)).fetchone()[0], 1.0, {})])
            for f in order]
        shares = []
        for f in order:
            have = sum(weight[w] for w in words if indexed.execute(
                "SELECT 1 FROM chunks_fts WHERE chunks_fts MATCH ? AND rowid IN "
                "(SELECT id FROM chunks WHERE file_id = ?)", (f'"{w}"', f)).fetchone())
            shares.append(have / sum(weight.values()))
        want = round(max(shares), 3)
        assert notes.confidence(indexed, query, ns) == want, (order, shares)
        searcher, why = tantivy_index.view(indexed)
        assert abs(notes.confidence(indexed, query, ns, None, (tantivy_index, searcher))
                   - want) <= 0.002, (order, shares)
