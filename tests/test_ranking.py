"""The ranking's single cases, without engines: real notes indexed in a temporary folder, the
vectors scripted (fake_embedder.py), the search op's reply checked. Fast tier."""

from __future__ import annotations

import pytest

from fake_embedder import MIN_SIMILARITY, FakeEmbedder, RankedStore, axis, towards
from ragd.search import fusion, notes, passages
from ragd.search.fusion import Candidate
from ragd.search.hybrid import MEANING_GAP, MEANING_MARGIN, TRUSTED_RANK, WEAK_MEANING

# Notes that hold the query's words ("tree", "leaves") and say nothing of a house plant, and
# the one note that answers it in other words.
KEYWORD_NOTES = {
    f"cs/{name}.md": f"# {name}\n\n{text}\n" for name, text in [
        ("avl", "An AVL tree keeps itself balanced: after each insert a rotation fixes "
                "the heights, and every tree leaf sits at most one level from the others."),
        ("btree", "A B-tree holds many keys per node; its leaves are all at the same depth, "
                  "which keeps a tree of a million keys four levels deep."),
        ("trie", "A trie is a tree of characters: a word is a path from the root to one of "
                 "its leaves, and shared prefixes share their nodes."),
        ("heap", "A binary heap is a complete tree stored in an array: the leaves fill the "
                 "last level from the left, the smallest key at the root."),
        ("redblack", "A red-black tree colours its nodes so that no path from the root to "
                     "the leaves is twice as long as another one."),
    ]}
ANSWER = {"plants/ficus.md": "# Ficus\n\nA ficus sheds foliage when moved to a darker corner "
                             "or watered too often; a bright window suits the plant.\n"}
QUERY = "why is my indoor tree losing its leaves"
# notes nothing is asked about (the query's words are rare, as in a vault): without vectors
# yet, they make the coverage partial
ERRANDS = {f"misc/n{i}.md": f"# Errand {i}\n\nBuy {i} kilos of flour and a bag of oranges "
                            f"at the market on day {i}.\n" for i in range(30)}


def answer_script(cosine: float) -> dict:
    """The ficus note on its own axis, the query `cosine` from it; each tree note on an axis
    of its own, unlike the query (cosine 0)."""
    script = {"ficus sheds": axis(0), QUERY: towards(axis(0), cosine)}
    for i, rel in enumerate(KEYWORD_NOTES):
        key = KEYWORD_NOTES[rel].split("\n")[2][:24]
        script[key] = axis(1 + i)
    return script


def still_coming(script: dict, keep: tuple[int, ...] = (0, 1)) -> dict:
    """While vectors are coming: of the keyword notes, BM25's candidates, only those of
    `keep` have a vector yet (a first embedding covers them as thinly as the rest; the
    fusion looks at how many of BM25's candidates have theirs)."""
    for i, rel in enumerate(KEYWORD_NOTES):
        if i not in keep:
            del script[KEYWORD_NOTES[rel].split("\n")[2][:24]]
    return script


def built(tmp_path, cosine: float, partial: bool, **search) -> RankedStore:
    script = answer_script(cosine)
    if partial:
        still_coming(script)
    else:
        script["kilos of flour"] = axis(6)
    notes = {**KEYWORD_NOTES, **ANSWER, **ERRANDS}
    return RankedStore(tmp_path, notes, FakeEmbedder(script), **search)


def paths(reply: dict) -> list[str]:
    return [r["path"] for r in reply["results"]]


@pytest.mark.parametrize("partial", [True, False], ids=["partial coverage", "full coverage"])
def test_a_clear_match_by_meaning_is_in_the_top_3(tmp_path, partial):
    """The vectors rank the ficus note first, clear of the threshold by more than the margin;
    BM25 ranks the five notes holding "tree" and "leaves" above it (it holds neither word).
    It is lifted into the top 3, and scores still read in rank order."""
    s = built(tmp_path, 0.8, partial)
    assert (s.coverage < fusion.PARTIAL_FUSION_FROM) == partial, s.coverage
    reply = s.search(QUERY)
    answer = s.path("plants/ficus.md")
    assert answer in paths(reply)[:3], paths(reply)
    assert reply["trusted"]["cosine"] == pytest.approx(0.8, abs=1e-3)
    # which result it is (ragctl --explain named none of them)
    assert reply["trusted"]["result"] == paths(reply).index(answer) + 1, reply["trusted"]
    assert "result" not in s.search(QUERY, k=1)["trusted"] or paths(reply)[0] == answer
    if partial:  # lifted from below every BM25 hit, to its rank while vectors are coming
        assert reply["trusted"]["lifted_from"] == len(KEYWORD_NOTES) + 1, reply["trusted"]
        assert paths(reply).index(answer) + 1 == TRUSTED_RANK
    scores = [r["score"] for r in reply["results"]]
    assert scores == sorted(scores, reverse=True), scores


def test_a_match_by_meaning_within_the_margin_is_not_lifted(tmp_path):
    """The same notes, the ficus note's cosine above the threshold but within the margin: not
    trusted, and BM25's five notes stay above it while vectors are coming."""
    cosine = MIN_SIMILARITY + MEANING_MARGIN / 2
    s = built(tmp_path, cosine, True)
    reply = s.search(QUERY)
    assert "trusted" not in reply
    assert paths(reply).index(s.path("plants/ficus.md")) == len(KEYWORD_NOTES), paths(reply)


@pytest.mark.parametrize("rival", [0.78, 0.7], ids=["a rival note close by", "clear of it"])
def test_a_match_by_meaning_must_stand_clear_of_every_other_note(tmp_path, rival):
    """The ficus note at cosine 0.8 and one of the tree notes (it holds "tree" and "leaves")
    close in meaning too: within MEANING_GAP the vectors do not single out one note, and the
    ficus note is not lifted over BM25's hits; clear of it by more, it is."""
    script = still_coming(answer_script(0.8))
    query = script[QUERY]
    script["A B-tree holds many keys"] = towards(query, rival, other=5)
    s = RankedStore(tmp_path, {**KEYWORD_NOTES, **ANSWER, **ERRANDS}, FakeEmbedder(script))
    assert s.coverage < fusion.PARTIAL_FUSION_FROM
    reply = s.search(QUERY)
    at = paths(reply).index(s.path("plants/ficus.md")) + 1
    if 0.8 - rival < MEANING_GAP:
        assert "trusted" not in reply
        assert at == len(KEYWORD_NOTES) + 1, paths(reply)  # after every BM25 hit
    else:
        assert reply["trusted"]["gap"] == pytest.approx(0.8 - rival, abs=1e-3)
        assert at == TRUSTED_RANK, paths(reply)


def test_lift_keeps_scores_in_rank_order():
    ranked = [Candidate(i, s) for i, s in enumerate([0.9, 0.7, 0.6, 0.5, 0.2])]
    assert fusion.lift(ranked, lambda c: c.chunk_id == 4, 2) == 5
    assert [c.chunk_id for c in ranked] == [0, 4, 1, 2, 3]
    assert [c.score for c in ranked] == [0.9, 0.7, 0.7, 0.6, 0.5]
    # already at or above the rank: left where it is
    assert fusion.lift(ranked, lambda c: c.chunk_id == 0, 2) is None
    assert fusion.lift(ranked, lambda c: c.chunk_id == 99, 2) is None
    assert [c.chunk_id for c in ranked] == [0, 4, 1, 2, 3]


SOURDOUGH = "sourdough starter hydration"


@pytest.mark.parametrize("cosine", [MIN_SIMILARITY - 0.1, MIN_SIMILARITY + MEANING_MARGIN / 2],
                         ids=["below the threshold", "below the bar for meaning alone"])
def test_nothing_relevant_gives_no_results(tmp_path, cosine):
    """No note holds a content word of the query, and the best similarity is weak: no results,
    and the reply says why. (Above the threshold, a match by meaning alone needs the margin.)"""
    script = answer_script(0.8)
    script[SOURDOUGH] = towards(axis(0), cosine)
    script["kilos of flour"] = axis(6)
    s = RankedStore(tmp_path, {**KEYWORD_NOTES, **ANSWER, **ERRANDS}, FakeEmbedder(script))
    reply = s.search(SOURDOUGH)
    assert reply["results"] == []
    assert reply["reason"].startswith("nothing relevant: no note holds a content word"), reply
    assert reply["best_similarity"] == pytest.approx(cosine, abs=1e-3)
    # the threshold is the config's here, and named so
    assert reply["reason"].endswith(
        "(search.min_similarity)" if cosine < MIN_SIMILARITY else
        f"(the threshold {MIN_SIMILARITY:.3f} + {MEANING_MARGIN}: search.min_similarity)"), reply
    # the same question close enough in meaning is answered, by meaning alone
    s.embedder.say(SOURDOUGH, towards(axis(0), MIN_SIMILARITY + 2 * MEANING_MARGIN))
    reply = s.search(SOURDOUGH)
    assert paths(reply) == [s.path("plants/ficus.md")], reply


SHORT_NOTES = {
    # the short chunk matches best; another chunk of its note matches nearly as well
    "faq/sync.md": "# Sync\n\n## Calendar sync\n\nCurrently, no.\n\n## About calendar sync\n\n"
                   "Calendar sync would need an account with an outside service, and the "
                   "plugin keeps everything in your vault.\n",
    # the short chunk is its note's only match
    "faq/export.md": "# Export\n\n## Calendar export\n\nNot yet.\n\n## Formats\n\nThe notes "
                     "are plain Markdown files that any other editor opens as they are.\n",
}


def test_a_chunk_under_60_chars_never_stands_alone_for_a_note(tmp_path):
    """The vectors and BM25 rank two short chunks ("Currently, no.", "Not yet.") first of
    their notes: each note is shown by a passage of at least MIN_PASSAGE characters — its
    other matching chunk, or the section around the short one."""
    query = "calendar sync"
    script = {query: axis(0), "Currently, no.": axis(0), "Not yet.": towards(axis(0), 0.9),
              "Calendar sync would": towards(axis(0), 0.7), "Markdown": axis(2)}
    s = RankedStore(tmp_path, SHORT_NOTES, FakeEmbedder(script), note_weight=0.0)
    chunks = s.search(query, group="chunk")
    # the premise: each note's best chunk is a short one
    firsts = {}
    for r in chunks["results"]:
        firsts.setdefault(r["path"], r["text"])
    assert firsts == {s.path("faq/sync.md"): "Currently, no.",
                      s.path("faq/export.md"): "Not yet."}, chunks["results"]
    reply = s.search(query)
    assert sorted(paths(reply)) == sorted(firsts), reply["results"]
    for r in reply["results"]:
        assert len(r["text"]) >= passages.MIN_PASSAGE, r
    by_path = {r["path"]: r["text"] for r in reply["results"]}
    assert by_path[s.path("faq/sync.md")].startswith("Calendar sync would need")
    assert by_path[s.path("faq/export.md")].startswith("Not yet.")  # and what follows it
    assert "plain Markdown" in by_path[s.path("faq/export.md")]


def test_rrf_adds_weight_over_60_plus_rank():
    lists = {"bm25": [1, 2, 3], "vector": [2, 4, 1]}
    got = fusion.rrf(lists, 60, {"bm25": 1.0, "vector": 0.5})
    assert got == pytest.approx({1: 1 / 61 + 0.5 / 63, 2: 1 / 62 + 0.5 / 61, 3: 1 / 63,
                                 4: 0.5 / 62})


def test_a_short_question_weighs_the_vectors_as_a_long_one():
    """A few typed keywords weigh the vectors half; a question does not, however few its
    content words. "how do I sync my vault between devices" (three content words) was fused as
    keywords on obsidian-hub, where "do" and "my" are as rare as "sync": a note asking "what do
    I do?" came first, and the sync plugins the vectors put first were 6th and below."""
    assert fusion.vector_weight("sync vault devices") == 0.5
    assert fusion.vector_weight('"obsidian sync" devices') == 0.5
    assert fusion.vector_weight("how do I sync my vault between devices") == 1.0
    assert fusion.vector_weight("what is a canvas") == 1.0
    assert fusion.vector_weight("tasks due before the weekend") == 1.0
    assert fusion.vector_weight("recurring tasks due weekly review") == 1.0  # (four)


def test_search_with_rrf_scores_each_chunk_by_its_ranks(tmp_path):
    """search.fusion = "rrf": each result's score is the weighted sum of 1 / (60 + rank) over
    the rankings that hold it, as the reply's own ranks and weights compute by hand."""
    s = built(tmp_path, 0.8, False, fusion="rrf", feedback_chunks=0)
    reply = s.search(QUERY, group="chunk", k=20)
    assert reply["fusion"] == "rrf"
    w = reply["weights"]
    assert w == {"vector": 1.0, "bm25": 1.0}  # (a question of four content words or more)
    assert len(reply["results"]) == len(KEYWORD_NOTES) + 1
    for r in reply["results"]:
        sc = r["scores"]
        hand = sum(w[name] / (60 + sc[f"{name}_rank"]) for name in ("bm25", "vector")
                   if f"{name}_rank" in sc)
        assert sc["rrf"] == pytest.approx(hand, abs=1e-6), sc
        # (the result's score is its fused one, but for the ficus chunk, trusted and lifted:
        # it takes the score of the one it now stands before)
        assert r["score"] >= sc["rrf"] - 1e-6
    scores = [r["score"] for r in reply["results"]]
    assert scores == sorted(scores, reverse=True)
    assert reply["trusted"]["lifted_from"] > reply["trusted"]["rank"]


def test_convex_fusion_mixes_scores_scaled_over_their_lists():
    lists = {"bm25": [1, 2, 3], "vector": [3, 1]}
    parts = {1: {"bm25": 8.0, "vector": 0.5}, 2: {"bm25": 5.0}, 3: {"bm25": 2.0, "vector": 0.9}}
    got = fusion.convex(lists, parts, 0.25)
    # bm25 scaled: 1, 0.5, 0; vector scaled: 3 -> 1, 1 -> 0; chunk 2 has no vector: 0
    assert got == pytest.approx({1: 0.75 * 1.0 + 0.25 * 0.0, 2: 0.75 * 0.5,
                                 3: 0.75 * 0.0 + 0.25 * 1.0})
    # chunk 2 still waiting for its vector: its BM25 value stands on the vector side too
    got = fusion.convex(lists, parts, 0.25, unembedded=[2])
    assert got[2] == pytest.approx(0.75 * 0.5 + 0.25 * 0.5)


def test_search_with_convex_fusion_mixes_the_reply_s_own_scores(tmp_path):
    """The default fusion: a result's fused score is the vector share of its cosine and the
    rest of its BM25 score, each scaled min-max over the candidates, as computed by hand from
    the reply's parts."""
    s = built(tmp_path, 0.8, False, feedback_chunks=0)
    reply = s.search(QUERY, group="chunk", k=20)
    assert reply["fusion"] == "convex"
    share = reply["weights"]["vector"]
    assert share == pytest.approx(fusion.effective_share(s.cfg.vector_share, 1.0), abs=1e-4)
    res = reply["results"]
    assert len(res) == len(KEYWORD_NOTES) + 1  # every candidate: the scaling is over them all

    def scaled(name):
        xs = {r["path"]: r["scores"][name] for r in res if name in r["scores"]}
        lo, hi = min(xs.values()), max(xs.values())
        return {p: (x - lo) / (hi - lo) for p, x in xs.items()}

    bm, vec = scaled("bm25"), scaled("vector")
    for r in res:
        hand = share * vec.get(r["path"], 0.0) + (1 - share) * bm.get(r["path"], 0.0)
        assert r["scores"]["fused"] == pytest.approx(hand, abs=1e-4), r["scores"]
    assert res[0]["path"] == s.path("plants/ficus.md")  # the clear match by meaning


@pytest.mark.parametrize("written", ["pg_upgrade", "pg and an upgrade"],
                         ids=["a note holds it", "only its words apart"])
def test_an_identifier_no_note_holds_is_an_unknown_name(tmp_path, written):
    """A question naming an identifier ("pg_upgrade") that no note holds, though notes hold
    its words apart ("pg", "upgrade"), is about something the notes do not mention: flagged
    as for a name no note mentions ("Todoist"). A note that holds it answers as usual."""
    notes = {"db/postgres.md": f"# Postgres\n\nTo move the cluster we ran {written} on the "
                               "old server, then checked the new major version.\n",
             "db/upgrade.md": "# Upgrade\n\nAn upgrade of pg means a dump and a restore.\n"}
    s = RankedStore(tmp_path, notes, FakeEmbedder({}, default=axis(0)))
    reply = s.search("how do I run pg_upgrade without downtime")
    if written == "pg_upgrade":
        assert "unknown_names" not in reply, reply
    else:
        assert reply["unknown_names"] == ["pg_upgrade"] and reply["low_confidence"] is True


ROTATION = {
    f"team/{name}.md": f"# {name.title()}\n\n{text}\n" for name, text in [
        ("rotation", "Pairing rotation: every sprint each engineer pairs with someone new."),
        ("hiring", "Hiring: two interviews, a take-home exercise and a call with a founder."),
        ("roadmap", "Roadmap: the quarter's goals are set in the planning meeting."),
        ("laptops", "Laptops are ordered by the office manager and arrive within a week."),
        ("reviews", "Code reviews: a second reviewer signs off before anything is merged."),
        ("deploys", "Deploys go out on Tuesdays after the staging checks pass."),
        ("retro", "Retrospectives close every sprint with three things to change."),
        ("docs", "Design documents live in the wiki, one per feature."),
    ]}
ROTATION_QUERY = "what stipend is paid for the rotation"


@pytest.mark.parametrize("cosine,weak", [(MIN_SIMILARITY + 0.02, True),
                                         (MIN_SIMILARITY + 0.2, False)],
                         ids=["weak meaning", "clear meaning"])
def test_few_words_found_and_a_weak_match_by_meaning_is_low_confidence(tmp_path, cosine, weak):
    """A question in the vault's own domain that it does not answer: one of its distinctive
    words is in the notes ("rotation"), the others not; its best chunk by meaning just clears
    the threshold. Weak on both counts: low-confidence (results still shown). The same words
    with a clear match by meaning are not flagged."""
    script = {"Pairing rotation": axis(0), ROTATION_QUERY: towards(axis(0), cosine)}
    s = RankedStore(tmp_path, ROTATION, FakeEmbedder(script, default=axis(5)))
    reply = s.search(ROTATION_QUERY)
    assert reply["results"] and reply["best_similarity"] == pytest.approx(cosine, abs=1e-3)
    assert notes.LOW_CONFIDENCE <= reply["confidence"] < notes.WEAK_CONFIDENCE, reply
    assert MIN_SIMILARITY + 0.02 < MIN_SIMILARITY + WEAK_MEANING < MIN_SIMILARITY + 0.2
    assert reply.get("weak_meaning", False) is weak
    assert reply["low_confidence"] is weak


def test_shared_text_counts_only_texts_held_by_enough_files(tmp_path):
    """Boilerplate counts (store.shared_text_counts): a text in 4 notes counts 4 for each of
    its chunks, one in 2 notes is not boilerplate at 3, a note's own text is left out; the
    cheap pre-check (a text held by fewer chunks than at_least) changes none of it."""
    footer = "## Footer\n\nThis note is part of the shared household binder, kept on the shelf."
    pair = "## Pair\n\nBoth of these notes mention the blue bicycle parked by the gate."
    docs = {f"b/n{i}.md": f"# Note {i}\n\nA line of its own about topic number {i}.\n\n"
                          f"{footer}\n" + (f"\n{pair}\n" if i < 2 else "") for i in range(4)}
    rs = RankedStore(tmp_path, docs, FakeEmbedder({}))
    from ragd.index import store
    db = store.connect(rs.cfg.db_path)
    try:
        rows = db.execute("SELECT id, heading FROM chunks").fetchall()
        ids = [cid for cid, _ in rows]
        for at_least in (1, 3):
            counts = store.shared_text_counts(db, ids, at_least)
            for cid, heading in rows:
                want = 4 if "Footer" in heading else 2 if "Pair" in heading else 1
                assert counts.get(cid) == (want if want >= at_least else None), \
                    (at_least, heading, counts.get(cid))
    finally:
        db.close()


def test_boilerplate_counts_kept_until_a_chunk_changes(tmp_path):
    """boilerplate.Known keeps the counts a search made (the next search of the same notes
    does not count them again) and forgets them when a chunk changes: a note holding the
    footer removed, the footer is in 3 notes, no longer 4."""
    from ragd.index import store
    from ragd.search import boilerplate
    footer = "## Footer\n\nThis note is part of the shared household binder, kept on the shelf."
    docs = {f"b/n{i}.md": f"# Note {i}\n\nA line of its own about topic number {i}.\n\n"
                          f"{footer}\n" for i in range(4)}
    rs = RankedStore(tmp_path, docs, FakeEmbedder({}))
    db = store.connect(rs.cfg.db_path)
    try:
        ids = [cid for cid, in db.execute("SELECT id FROM chunks")]
        footers = {cid for cid, h in db.execute("SELECT id, heading FROM chunks")
                   if "Footer" in h}
        known = boilerplate.Known()
        assert known.shared(db, ids) == dict.fromkeys(footers, 4)
        calls = []
        counted = store.shared_text_counts
        store.shared_text_counts = lambda *a: calls.append(a) or counted(*a)
        try:
            assert known.shared(db, ids) == dict.fromkeys(footers, 4)
            assert calls == []  # every count was known
            fid = db.execute("SELECT file_id FROM chunks WHERE id = ?", (min(footers),)).fetchone()[0]
            with store.transaction(db):
                db.execute("DELETE FROM chunks WHERE file_id = ?", (fid,))
            left = {c for c in footers if db.execute("SELECT 1 FROM chunks WHERE id = ?",
                                                     (c,)).fetchone()}
            assert known.shared(db, ids) == dict.fromkeys(left, 3) and len(calls) == 1
            assert known.shared(db, ids) == boilerplate.shared(db, ids)
        finally:
            store.shared_text_counts = counted
    finally:
        db.close()


def test_a_long_note_taking_every_candidate_still_gives_k_notes(tmp_path):
    """One long note holds the words in 150 sections and takes every one of the 100
    candidates: `-k 10 exception groups` gave 2 notes (a fresh-user walk on the PEPs). The
    rankings are asked again for more candidates until k notes (or nothing more to give)."""
    sections = "\n\n".join(f"## Part {i}\n\nException groups wrap exception groups, part {i}."
                           for i in range(150))
    docs = {"big.md": f"---\ntitle: Exception groups\n---\n# Exception groups\n\n{sections}\n"}
    docs.update({f"small/n{i}.md": f"# Note {i}\n\nA long note about topic {i} of many words "
                 f"that go on and on about other things, and once about Exception Groups.\n"
                 for i in range(12)})
    # (the vectors too put the long note's 150 sections first)
    rs = RankedStore(tmp_path, docs, FakeEmbedder(
        {"exception groups": axis(0), "other things": towards(axis(0), 0.6)}, default=axis(5)))
    for mode in ("bm25", "hybrid"):
        reply = rs.search("exception groups", k=10, mode=mode)
        assert len(reply["results"]) == 10, (mode, [r["path"] for r in reply["results"]])
        assert reply["results"][0]["path"].endswith("big.md") and reply["widened"] == 400
        chunks = rs.search("exception groups", k=10, mode=mode, group="chunk")
        assert "widened" not in chunks  # (chunks: the first 100 were k already)
        # a chunk result names its note's title, as a note result does (it showed the file's
        # name: "pep-0622")
        assert {r["title"] for r in chunks["results"]} == {"Exception groups"}, chunks


def test_a_larger_k_shows_more_notes_never_another_order(tmp_path):
    """`-k 10 "GIL removal"` gave PEPs 684 445 703 371 and `-k 20` gave 684 445 371 703 (a
    fresh-user walk): k = 20 asked the rankings for more candidates, and each ranking scales
    its scores over its own, longer list. The notes a smaller k shows come first in a larger
    k's, in the same order and with the same scores."""
    sections = "\n\n".join(f"## Part {i}\n\nException Groups wrap Exception Groups, part {i}."
                            for i in range(150))
    docs = {"big.md": f"# Exception Groups\n\n{sections}\n",
            "words.md": "# Words\n\nException Groups, Exception Groups: Exception Groups.\n",
            "meaning.md": "# Meaning\n\nA long note about raising many errors at once, which "
                          "the runtime puts together; it goes on about other things and "
                          "mentions Exception Groups once.\n"}
    docs.update({f"small/n{i}.md": f"# Note {i}\n\nA long note about topic {i} of many words "
                 f"that go on and on about other matters, and once about Exception Groups.\n"
                 for i in range(12)})
    rs = RankedStore(tmp_path, docs, FakeEmbedder(
        {"exception groups": axis(0), "wrap": towards(axis(0), 0.6),
         "raising many errors": towards(axis(0), 0.95)}, default=axis(5)))
    for mode in ("hybrid", "bm25"):
        shown = {}
        for k in (1, 2, 3, 5, 10):
            res = rs.search("exception groups", k=k, mode=mode)["results"]
            shown[k] = [(r["path"].rsplit("/", 1)[1], r["score"]) for r in res]
        assert any(rs.search("exception groups", k=k, mode=mode).get("widened")
                   for k in (3, 5, 10)), mode  # (the case: a larger k asked for more)
        for a, b in zip(shown, list(shown)[1:]):
            assert shown[b][:len(shown[a])] == shown[a], (mode, a, b, shown)
        assert len(shown[10]) == 10, shown[10]


# A PEP named by its number, among PEPs that say "8" more often than it does ("3.8",
# "UTF-8") and that all say "PEP"
PEPS = {
    "peps/pep-0008.rst": "PEP: 8\nTitle: Style Guide for Python Code\nStatus: Active\n\n"
                         "Introduction\n============\n\nThis document gives coding "
                         "conventions for the code in the standard library.\n",
    **{f"peps/pep-{n:04d}.rst": f"PEP: {n}\nTitle: Python 3.8 topic {n}\nStatus: Final\n\n"
                                f"Abstract\n========\n\nIn Python 3.8 (see PEP 8) the UTF-8 "
                                f"mode, 3.8.0 and 3.8.1: 8 changes, UTF-8 again.\n"
       for n in (569, 540, 686, 3120, 606, 578)},
    **{f"{d}/index.md": f"# index\n\nThe {d} folder's index of notes.\n" for d in "abcd"},
}


def test_a_query_that_is_a_notes_name_finds_that_note_first(tmp_path):
    """"PEP 8" is PEP 8's name (its header's number), and "pep-0008" its file's: the note
    comes first, although every PEP says "PEP" and the others say "8" more often. Before,
    the PEPs repeating "3.8" and "UTF-8" came first. A name that more than three notes share
    names none of them, and a filter still applies."""
    s = RankedStore(tmp_path, PEPS, FakeEmbedder({}, default=axis(0)))
    pep8 = s.path("peps/pep-0008.rst")
    for query in ("PEP 8", "pep-0008", "pep 0008", "style guide for python code"):
        for mode in ("hybrid", "bm25"):
            res = s.search(query, k=3, mode=mode)
            assert res["results"][0]["path"] == pep8, (query, mode, res["results"])
            assert res["results"][0]["scores"]["named"], res["results"][0]
            assert all("named" not in r["scores"] for r in res["results"][1:])
        res = s.search(query, k=3, mode="bm25", group="chunk")
        assert res["results"][0]["path"] == pep8, (query, res["results"])
    res = s.search("PEP 8", k=3, mode="bm25", path="peps/pep-0569.rst")
    assert [r["path"] for r in res["results"]] == [s.path("peps/pep-0569.rst")]
    res = s.search("index", k=5, mode="bm25")
    assert len(res["results"]) == 4 and all("named" not in r["scores"]
                                            for r in res["results"])


def test_a_note_asked_for_by_its_name_is_shown_by_its_opening(tmp_path):
    """Asked for by its name, a note is shown by where it begins (its first chunk that says
    something, past a header of fields), not by the chunk its name's words happen to fill:
    "Type Hints" showed a two-line tip on None in a type hint, "The Zen of Python" the PEP's
    header."""
    notes = {
        "peps/pep-0484.rst": "PEP: 484\nTitle: Type Hints\nAuthor: Guido van Rossum\n"
                             "Status: Final\nPost-History: 16-Jan-2015,\n"
                             "              20-Mar-2015\n\n"
                             "Abstract\n========\n\nThis PEP introduces a standard syntax "
                             "for the annotations of functions, so that tools can check a "
                             "program before it runs.\n\n"
                             "Using None\n==========\n\nIn a type hint, None: type hints.\n",
        **{f"peps/pep-{n:04d}.rst": f"PEP: {n}\nTitle: Topic {n}\nStatus: Final\n\n"
                                    f"Abstract\n========\n\nType hints and more type hints "
                                    f"for topic {n}.\n" for n in (526, 544, 612)},
    }
    s = RankedStore(tmp_path, notes, FakeEmbedder({}, default=axis(0)))
    pep = s.path("peps/pep-0484.rst")
    for mode in ("hybrid", "bm25"):
        res = s.search("type hints", k=3, mode=mode)
        top = res["results"][0]
        assert top["path"] == pep and top["scores"]["named"], res["results"]
        assert top["heading"] == "Type Hints > Abstract", top
        assert top["text"].startswith("This PEP introduces") and top["line_start"] == 11, top
        # its other matching chunks are still listed
        assert any(c["heading"].endswith("Using None") for c in top["chunks"]), top["chunks"]
    # a query that names no note: the chunk that carries the match stands
    res = s.search("type hint none", k=3, mode="bm25")
    assert res["results"][0]["path"] == pep
    assert res["results"][0]["heading"].endswith("Using None"), res["results"][0]


def test_a_footer_linking_each_notes_own_page_is_boilerplate(tmp_path):
    """A footer that links each note's own page ("Edit In GitHub", the Obsidian Hub's) is one
    text as read: counted as boilerplate in every note that holds it, though no two copies are
    equal. A named stub of a note, its placeholder line and that footer, is shown by its
    placeholder: the footer (the first chunk long enough to say something; then the one that
    stood in for the placeholder, too short to stand alone) showed before."""
    from ragd.index import store

    def footer(name):
        name = name.replace(" ", "%20")
        return ("\n## This note in GitHub\n\n<span class=\"git-footer\">[Edit In GitHub]("
                f"https://github.dev/example/hub/blob/main/{name} \"edit-note\") | [Copy this "
                f"note](https://raw.example.org/hub/main/{name})</span>\n")
    docs = {f"c/{t}.md": f"# {t}\n\nA note of its own about {t.lower()}, with some words.\n"
            + footer(f"{t}.md") for t in ("Canvas", "Graph view", "Backlinks")}
    stubs = ("Obsidian Sync", "Obsidian Publish", "Workspaces")  # (the hub has hundreds)
    docs.update({f"c/{t}.md": f"# {t}\n\n#placeholder/description\n" + footer(f"{t}.md")
                 for t in stubs})
    s = RankedStore(tmp_path, docs, FakeEmbedder({}, default=axis(0)))
    db = store.connect(s.cfg.db_path)
    try:
        rows = db.execute("SELECT id, heading FROM chunks").fetchall()
        counts = store.shared_text_counts(db, [cid for cid, _ in rows], 3)
        footers = {cid for cid, h in rows if h.endswith("This note in GitHub")}
        assert len(footers) == 6 and {counts[c] for c in footers} == {6}, counts
        assert {counts[c] for c, h in rows if h in stubs} == {3}  # the placeholder line
        # an index of schema 11 held the hashes of the exact texts: migrated (m012), the
        # footers are one text again
        from ragd.ingest.chunker import text_hash
        with store.transaction(db):
            db.executemany("UPDATE chunks SET text_hash = ? WHERE id = ?",
                           [(text_hash(t), cid) for cid, t in
                            db.execute("SELECT id, text FROM chunks").fetchall()])
        assert not footers & set(store.shared_text_counts(db, [cid for cid, _ in rows], 3))
        db.execute("PRAGMA user_version = 11")
        assert store.migrate(db) == 11
        assert store.shared_text_counts(db, [cid for cid, _ in rows], 3) == counts
    finally:
        db.close()
    for mode in ("hybrid", "bm25"):
        top = s.search("Obsidian Sync", k=3, mode=mode)["results"][0]
        assert top["path"] == s.path("c/Obsidian Sync.md") and top["scores"]["named"], top
        assert top["heading"] == "Obsidian Sync" and "placeholder" in top["text"], top
        # too short to stand alone, it is not widened by the footer either (ragctl then showed
        # the footer's line holding the note's own address)
        assert "git-footer" not in top["text"] and top["line_end"] == 3, top
