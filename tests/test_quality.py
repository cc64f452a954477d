"""Answers, not fragments: note-level results, filters, --explain, confidence and ragctl eval,
through the real daemon and the real socket."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
import unicodedata
from pathlib import Path

import pytest

from ragd import protocol as P
from ragd.index import store

from conftest import (bulk_embedding_stopped, engine_config, ragctl, small_vault,
                      wait_embedded)


def test_results_are_notes_and_chunks_on_request(make_daemon):
    d = make_daemon(vaults=("obsidian-tasks-docs",))
    with d:
        d.wait_idle()
        res = d.call("search", query="recurring task recurrence rule", k=10, mode="bm25")
        paths = [r["path"] for r in res["results"]]
        assert len(paths) == len(set(paths)) == 10 and res["group"] == "note"
        top = res["results"][0]
        assert top["title"] and top["more"] > 0 and len(top["chunks"]) == min(10, top["more"] + 1)
        assert top["chunks"][0]["line_start"] == top["line_start"]
        assert all(c["line_start"] <= c["line_end"] for c in top["chunks"])
        chunks = d.call("search", query="recurring task recurrence rule", k=10, mode="bm25",
                        group="chunk")["results"]
        assert len({r["path"] for r in chunks}) < len(chunks)  # one note, several parts
        assert "more" not in chunks[0]


def _note(root: Path, name: str, tags: list[str], mtime: float, text: str) -> None:
    p = root / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(f"---\ntags: [{', '.join(tags)}]\n---\n# {Path(name).stem}\n\n{text}\n")
    os.utime(p, (mtime, mtime))


def test_filters_by_tag_date_and_path(make_daemon, tmp_path):
    root = tmp_path / "v"
    (root / ".obsidian").mkdir(parents=True)
    day = 86400
    t0 = time.mktime(time.strptime("2026-06-01", "%Y-%m-%d"))
    _note(root, "Projects/alpha.md", ["project/alpha"], t0, "The meeting about budgets.")
    _note(root, "Projects/beta.md", ["project/beta", "urgent"], t0 + 10 * day,
          "The meeting about hiring.")
    _note(root, "Journal/day.md", ["journal"], t0 + 20 * day, "A meeting with a friend.")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}])
    with d:
        d.wait_idle()

        def names(**kw):
            res = d.call("search", query="meeting", mode="bm25", **kw)
            return sorted(Path(r["path"]).name for r in res["results"])

        assert names() == ["alpha.md", "beta.md", "day.md"]
        assert names(tag="project") == ["alpha.md", "beta.md"]  # nested tags match
        assert names(tag="#project/alpha") == ["alpha.md"]
        assert names(tag="Urgent") == ["beta.md"]  # tags ignore case
        assert names(since="2026-06-05") == ["beta.md", "day.md"]
        assert names(before="2026-06-05") == ["alpha.md"]
        assert names(since=t0 + 5 * day, before=t0 + 15 * day) == ["beta.md"]
        # Unix seconds as text, as ragctl search --since sends them
        assert names(since=str(int(t0 + 5 * day)), before=str(t0 + 15 * day)) == ["beta.md"]
        assert names(path="Projects/*") == ["alpha.md", "beta.md"]
        assert names(since="2000-01-01") == names()  # a filter every file passes
        # far bounds are bounds, not an internal error (they overflowed SQLite's integers)
        assert names(before="9999-12-31") == names(since=-1e12) == names()
        assert names(since=1e300) == names(since="2300-01-01") == []
        with pytest.raises(P.DaemonError, match="list of source names"):
            d.call("search", query="meeting", sources=[["v"]])
        assert names(path="Nowhere/*") == []
        assert names(path="Projects") == names(path="Projects/") == ["alpha.md", "beta.md"]
        assert names(path="Journal/day.md") == ["day.md"]  # a file by its path
        assert names(path="Proj") == []  # a folder, not a prefix
        # a word only a note left out holds: nothing relevant, and the reason names the filters
        res = d.call("search", query="budgets", mode="bm25", since="2026-06-05")
        assert res["results"] == [] and res["reason"] == (
            "nothing relevant: no note the filters let through holds a content word of the query")
        res = d.call("search", query="zeppelins", mode="bm25")
        assert res["reason"] == "nothing relevant: no note holds a content word of the query"
        for mode in ("bm25", "hybrid"):  # not "nothing relevant": nothing was let through
            res = d.call("search", query="meeting", mode=mode, tag="nosuchtag")
            assert res["results"] == [] and res["filtered_out"] is True
            assert res["reason"] == "no indexed note passes the filters"
        r = ragctl("--config", d.config, "search", "meeting", "--tag", "journal", "--mode", "bm25")
        assert r.returncode == 0 and "day.md" in r.stdout and "alpha.md" not in r.stdout
        r = ragctl("--config", d.config, "search", "meeting", "--since", "June first")
        assert r.returncode == 2 and "must be a date" in r.stderr


def test_a_name_in_either_unicode_form_is_found_typed_in_the_other(make_daemon, tmp_path):
    """macOS and its sync tools write "café" decomposed (NFD: e + a combining accent); a user
    types it composed (NFC). The file system compares bytes, so neither --path nor get found
    such a file. Both now take either form for the other."""
    t0 = time.mktime(time.strptime("2026-06-01", "%Y-%m-%d"))
    v = tmp_path / "v"
    nfd = unicodedata.normalize("NFD", "Café/crème.md")
    nfc_named = unicodedata.normalize("NFC", "Résumé.md")
    _note(v, nfd, ["a"], t0, "The meeting about budgets.")
    _note(v, nfc_named, ["a"], t0, "The meeting about hiring.")
    _note(v, "plain.md", ["a"], t0, "The meeting about gardens.")
    d = make_daemon(sources=[{"name": "v", "path": str(v)}])
    with d:
        d.wait_idle()

        def names(**kw):
            res = d.call("search", query="meeting", mode="bm25", **kw)
            return sorted(unicodedata.normalize("NFC", Path(r["path"]).name)
                          for r in res["results"])

        for form in ("NFC", "NFD"):
            def typed(text):
                return unicodedata.normalize(form, text)
            assert names(path=typed("Café")) == names(path=typed("café/*")) == ["crème.md"]
            assert names(path=typed("Café/crème.md")) == ["crème.md"]
            assert names(path=typed(f"{v}/Café")) == ["crème.md"]  # absolute, too
            assert names(path=typed("résumé.md")) == ["Résumé.md"]
            got = d.call("get", path=typed(str(v / "Café" / "crème.md")))
            assert "budgets" in got["text"] and got["path"] == str(v / nfd)
            got = d.call("get", path=typed(str(v / "Résumé.md")))
            assert "hiring" in got["text"] and got["path"] == str(v / nfc_named)
        with pytest.raises(P.DaemonError, match="no file"):  # still none for what is not there
            d.call("get", path=str(v / "Café" / "crèmes.md"))


def test_an_absolute_path_filter_is_taken_relative_to_its_source(make_daemon, tmp_path):
    """Paths in the index are relative to their source's folder: an absolute --path (as
    results print paths) matched nothing and said nothing. Inside a source's folder it is now
    taken relative to it, that source only (the other's Projects is not let through); inside
    none it is refused, naming the folders."""
    t0 = time.mktime(time.strptime("2026-06-01", "%Y-%m-%d"))
    v, w = tmp_path / "v", tmp_path / "w"
    _note(v, "Projects/alpha.md", ["a"], t0, "The meeting about budgets.")
    _note(v, "Journal/day.md", ["a"], t0, "A meeting with a friend.")
    _note(w, "Projects/gamma.md", ["a"], t0, "The meeting about gardens.")
    d = make_daemon(sources=[{"name": "v", "path": str(v)}, {"name": "w", "path": str(w)}])
    with d:
        d.wait_idle()

        def names(**kw):
            res = d.call("search", query="meeting", mode="bm25", **kw)
            return sorted(Path(r["path"]).name for r in res["results"])

        assert names(path="Projects/*") == ["alpha.md", "gamma.md"]  # (relative: both)
        assert names(path="projects") == names(path="*/ALPHA.MD") + ["gamma.md"] == \
            ["alpha.md", "gamma.md"]  # (case ignored: a document folder's REPORT.PDF)
        assert names(path=f"{v}/Projects/*") == ["alpha.md"]
        assert names(path=f"{v}/Projects") == names(path=f"{v}/Projects/") == ["alpha.md"]
        assert names(path=f"{v}/Journal/day.md") == ["day.md"]
        assert names(path=str(v)) == names(path=f"{v}/*") == ["alpha.md", "day.md"]
        assert names(path=f"{w}/Projects/*", sources=["v", "w"]) == ["gamma.md"]
        # written with '..' or '.' (a shell's "$HOME/Notes/./x"): taken as the path it names
        assert names(path=f"{v}/../w/Projects") == names(path=f"{w}/./Projects") == ["gamma.md"]
        for path, sources in ((f"{tmp_path}/elsewhere/*", None), (f"{w}/Projects", ["v"])):
            with pytest.raises(P.DaemonError) as e:
                d.call("search", query="meeting", path=path, sources=sources)
            assert e.value.code == P.BAD_ARGS and "is in no source's folder" in e.value.message
            assert f"v: {v}" in e.value.message and "relative to its source" in e.value.message
        r = ragctl("--config", d.config, "search", "meeting", "--mode", "bm25", "--path",
                   f"{v}/Projects/*")
        assert r.returncode == 0 and "alpha.md" in r.stdout and "gamma.md" not in r.stdout, \
            r.stdout + r.stderr
        r = ragctl("--config", d.config, "search", "meeting", "--path", "/nowhere/*")
        assert r.returncode == 2 and "is in no source's folder" in r.stderr, r.stderr


def test_explain_says_why(make_daemon):
    d = make_daemon(vaults=("obsidian-tasks-docs",))
    with d:
        d.wait_idle()
        r = ragctl("--config", d.config, "search", "--explain", "-k", "2", "recurrence rule")
        assert r.returncode == 0
        why = [ln for ln in r.stdout.splitlines() if ln.strip().startswith("why:")]
        assert len(why) == 2 and all("bm25 rank" in w for w in why), r.stdout


def test_eval_measures_by_note(make_daemon, tmp_path):
    root = tmp_path / "n"
    root.mkdir()
    (root / "apples.md").write_text("# Apples\n\nApples grow on trees in orchards.\n")
    (root / "pears.md").write_text("# Pears\n\nPears are sweet and grow on trees too.\n")
    (root / "bread.md").write_text("# Bread\n\nKnead the dough and bake it.\n")
    qfile = tmp_path / "q.jsonl"
    qfile.write_text("\n".join(json.dumps(q) for q in [
        {"id": "a", "question": "orchards", "relevant": ["apples.md"], "kind": "keyword"},
        # a whole path, as search -l prints it, is the same note
        {"id": "b", "question": "sweet trees", "relevant": [str(root / "pears.md")],
         "kind": "keyword"},
        {"id": "c", "question": "dough", "relevant": ["apples.md"], "kind": "other"},
        {"id": "o", "question": "quantum chromodynamics"},
    ]) + "\n")
    d = make_daemon(sources=[{"name": "n", "path": str(root)}])
    with d:
        d.wait_idle()
        r = ragctl("--config", d.config, "--json", "eval", qfile)
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        assert res["questions"] == 3
        assert res["overall"]["hit@1"] == round(2 / 3, 4)  # a and b first; c never
        assert res["by_kind"]["other"]["mrr@10"] == 0.0
        assert res["out_of_scope"] == {"n": 1, "nothing_relevant": 1, "flagged": 1}
        assert res["vector_coverage"] is None and res["vectors_partial"] is False  # BM25 only
        r = ragctl("--config", d.config, "eval", "--misses", qfile)
        assert "miss" in r.stdout and "dough" in r.stdout and "hit@1" in r.stdout
        assert "not final" not in r.stdout
        assert r.stderr == "" and "default" not in r.stdout  # rows name the mode used
        # hybrid asked of a daemon with no embedding model: every search was BM25's, said so
        r = ragctl("--config", d.config, "--json", "eval", "--mode", "hybrid", qfile)
        assert json.loads(r.stdout)["answered_as"] == {"bm25": 4}, r.stdout
        r = ragctl("--config", d.config, "eval", "--mode", "hybrid", qfile)
        assert "note: hybrid: 4 of 4 searches were answered as bm25: these are not hybrid's " \
               "figures" in r.stdout, r.stdout
        (root / "pears.md").rename(root / "pear.md")  # the questions file now names a ghost
        r = ragctl("--config", d.config, "eval", qfile)
        assert r.returncode == 0 and "1 relevant path in no source" in r.stderr \
            and "pears.md" in r.stderr, r.stderr
        outside = tmp_path / "elsewhere.md"  # a whole path in no source is named too
        outside.write_text("# Elsewhere\n\nOrchards.\n")
        (tmp_path / "q2.jsonl").write_text(json.dumps(
            {"question": "orchards", "relevant": [str(outside)]}) + "\n")
        r = ragctl("--config", d.config, "eval", tmp_path / "q2.jsonl")
        assert "1 relevant path in no source" in r.stderr and str(outside) in r.stderr, \
            r.stderr
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"question": "x"}\n{not json\n')
        r = ragctl("--config", d.config, "eval", bad)
        assert r.returncode == 2 and f"{bad}:2" in r.stderr


def test_eval_while_vectors_are_still_coming_says_its_figures_are_not_final(make_daemon,
                                                                             tmp_path):
    """ragctl eval run while embedding was still in progress gave figures for a partial index
    (hybrid ranks by keywords below 95% coverage) and said nothing of it. The bulk engine is
    stopped (SIGSTOP) once the first vectors are in; the query engine still embeds questions."""
    root = small_vault(tmp_path / "vault")
    qfile = tmp_path / "q.jsonl"
    qfile.write_text(json.dumps({"question": "show my tasks on a kanban board",
                                 "relevant": ["Other Plugins/Kanban Plugin.md"]}) + "\n")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    with d:
        d.wait_idle()
        with bulk_embedding_stopped(d):
            r = ragctl("--config", d.config, "--json", "eval", "--mode", "all", qfile)
            assert r.returncode == 0, r.stderr
            bm25, vector, hybrid = json.loads(r.stdout)
            assert bm25["vector_coverage"] is None and bm25["vectors_partial"] is False
            for res in (vector, hybrid):
                assert 0 < res["vector_coverage"] < 1 and res["vectors_partial"] is True, res
            r = ragctl("--config", d.config, "eval", "--mode", "hybrid", qfile)
            assert r.returncode == 0, r.stderr
            note = [ln for ln in r.stdout.splitlines() if ln.startswith("note: hybrid:")]
            assert len(note) == 1 and "not final" in note[0], r.stdout
            assert "vectors covered only " in note[0] and "% of the chunks" in note[0], note


def test_a_source_without_vectors_yet_is_not_judged_far_in_meaning(make_daemon, tmp_path):
    """A source just added has no vectors: its best similarity was -1, "below the threshold",
    so a question every word of which its note holds was flagged low-confidence ("no close
    meaning match") and `ask` refused it. While vectors are coming that is no finding."""
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    other = tmp_path / "Docs2"
    other.mkdir()
    (other / "light.txt").write_text("Notes on the lighthouse keeper schedule.\n\n"
                                     "The lamp is cleaned every Tuesday.\n")
    with d:
        d.wait_idle()
        with bulk_embedding_stopped(d) as e:  # (texts wait: the new source's join them)
            assert e["pending_texts"] > 0, e
            r = ragctl("--config", d.config, "sources", "add", str(other))
            assert r.returncode == 0, r.stderr
            d.wait_idle()
            res = d.call("search", query="How often does the lighthouse keeper clean the lamp?",
                         sources=["Docs2"])
            assert res["results"] and res["vector_coverage"] < 1, res
            assert "below_threshold" not in res and res["low_confidence"] is False, res
            res = d.call("search", query="xylophone", sources=["Docs2"])
            assert res["results"] == [] and "no chunk has a vector to compare yet" in \
                res["reason"], res


def test_confidence_flags_what_the_notes_do_not_answer(make_daemon, tmp_path):
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    with d:
        wait_embedded(d)
        ok = d.call("search", query="how do I set up a custom status for my tasks")
        assert ok["results"] and ok["low_confidence"] is False and ok["confidence"] > 0.5
        off = d.call("search", query="How do I sync my Obsidian tasks with Google Calendar "
                                     "so they show up in my phone's calendar app?")
        assert off["low_confidence"] is True and off["confidence"] < 0.25


def test_fusion_while_vectors_are_coming_does_not_bury_the_unembedded():
    """At partial coverage the vector list knows only the embedded chunks: a chunk BM25 ranks
    first but not yet embedded must not fall below one BM25 ranks fifth that happens to be
    embedded; at full coverage the fusion is plain weighted RRF."""
    from ragd.search.fusion import partial_rrf, rrf
    bm25 = [1, 2, 3, 4, 5]
    vector = [5, 9]  # 1-4 have no vector yet; 9 is found by vectors alone
    w = {"vector": 1.0, "bm25": 1.0}
    for cov in (0.1, 0.5):
        fused = partial_rrf({"bm25": bm25, "vector": vector}, 60, w, cov, [1, 2, 3, 4])
        order = sorted(fused, key=lambda c: -fused[c])
        assert order.index(1) < order.index(5), (cov, order)
        assert order[:4] == [1, 2, 3, 4] or cov >= 0.5, order
    full = {"bm25": bm25, "vector": [5, 1, 2, 3, 4, 9]}
    assert partial_rrf(full, 60, w, 1.0, []) == rrf(full, 60, w)


def test_convex_fusion_counts_an_unembedded_chunk_as_bm25_does():
    """Convex fusion near full coverage: a chunk BM25 ranks first whose vector is still being
    made scores on the vector side what it scores on BM25's (scaled), not 0; once embedded it is
    scored by its cosine."""
    from ragd.search.fusion import convex
    parts = {1: {"bm25": 9.0}, 2: {"bm25": 5.0, "vector": 0.8}, 3: {"bm25": 1.0, "vector": 0.5},
             4: {"vector": 0.7}}
    lists = {"bm25": [1, 2, 3], "vector": [2, 4, 3]}
    fused = convex(lists, parts, 0.6, unembedded=[1])
    assert fused == pytest.approx({1: 1.0, 2: 0.4 * 0.5 + 0.6, 3: 0.0, 4: 0.6 * (0.2 / 0.3)})
    assert convex(lists, parts, 0.6)[1] == 0.4  # without the rule: last but one
    assert convex({"bm25": [1], "vector": [4]}, parts, 0.6) == {1: 0.4, 4: 0.6}  # single hits


def test_while_vectors_are_coming_embedded_candidates_are_ordered_in_their_own_places():
    """At partial coverage BM25's candidates that have their vectors are ordered by both
    signals, but only among the places they hold: one without a vector keeps its place and
    score, and each place keeps its score (scores still read in rank order)."""
    from ragd.search.fusion import bm25_order, in_slots
    parts = {1: {"bm25": 9.0}, 2: {"bm25": 5.0}, 3: {"bm25": 4.0}, 4: {"bm25": 1.0},
             5: {"vector": 0.9}}
    lists = {"bm25": [1, 2, 3, 4], "vector": [5]}
    fused = bm25_order(lists, parts)
    # 1 has no vector; 2 is far from the query, 4 close to it
    in_slots(lists, parts, fused, {2: 0.1, 3: 0.5, 4: 0.85}, 0.6)
    order = sorted(fused, key=lambda c: -fused[c])
    assert order == [1, 4, 3, 2, 5]
    assert [fused[c] for c in order[:4]] == [9.0, 5.0, 4.0, 1.0]
    assert parts[4]["place_of_bm25_rank"] == 2 and parts[2]["place_of_bm25_rank"] == 4
    assert "place_of_bm25_rank" not in parts[3]  # (it kept its own)
    # one candidate with a vector: nothing to order
    fused = bm25_order(lists, parts)
    in_slots(lists, parts, fused, {4: 0.85}, 0.6)
    assert sorted(fused, key=lambda c: -fused[c]) == [1, 2, 3, 4, 5]


def test_feedback_searches_again_from_the_first_fusions_best_chunks(make_daemon, tmp_path):
    """Hybrid search's dense feedback, checked against the stored vectors: the second vector
    search's cosines are exactly those of unit(q + 0.5 x mean of the first fusion's 5 best
    chunks' vectors). Everything that needs is in a reply without feedback (q . v is the
    vector score of v) and in SQLite: no engine call of the test's own."""
    import sqlite3

    import numpy as np

    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config(extra="[search]\ncandidates = 300\nfeedback_chunks = 0\n"
                                              "fusion = \"rrf\"\n"  # the first fusion's
                                              # every candidate in the reply: none cut
                                              "min_similarity = 0\n"))
    query = "I'd like done items to disappear from the list once they are ticked"
    with d:
        wait_embedded(d)
        off = d.call("search", query=query, k=300, group="chunk")
        assert off["mode"] == "hybrid" and "feedback" not in off
        d.config.write_text(d.config.read_text().replace("feedback_chunks = 0",
                                                         "feedback_chunks = 5"))
        assert d.call("reload")["applied"] == ["search.feedback_chunks"]
        on = d.call("search", query=query, k=300, group="chunk")
        assert on["feedback"] == {"chunks": 5, "weight": 0.5}
        assert on["best_similarity"] == off["best_similarity"]  # the query's own
        assert "feedback_ms" in on["timings"]

    db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
    ids = {(str(root / rel), a, b): cid for cid, rel, a, b in db.execute(
        "SELECT c.id, f.relpath, c.line_start, c.line_end FROM chunks c JOIN files f "
        "ON f.id = c.file_id")}
    assert len(ids) == db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]  # unique keys

    def chunk(r):
        return ids[(r["path"], r["line_start"], r["line_end"])]

    first = [chunk(r) for r in off["results"][:5]]
    cos = {chunk(r): r["scores"]["vector"] for r in off["results"]}
    space = db.execute("SELECT value FROM meta WHERE key = 'active_space'").fetchone()[0]
    vec = {cid: np.frombuffer(blob, "<f4") for cid, blob in db.execute(
        "SELECT c.id, e.vector FROM chunks c JOIN embeddings e ON e.space = ? "
        "AND e.text_hash = c.embed_hash", (int(space),))}
    assert set(cos) == set(vec)  # every chunk has a vector and was a candidate
    unit = {c: v / np.linalg.norm(v) for c, v in vec.items()}
    f = 0.5 * np.mean([unit[c] for c in first], axis=0)
    norm = np.sqrt(1 + f @ f + 2 * 0.5 * np.mean([cos[c] for c in first]))  # |q + f|
    want = {c: (cos[c] + unit[c] @ f) / norm for c in vec}
    got = {chunk(r): r["scores"]["vector"] for r in on["results"]}
    assert set(got) == set(want)
    assert max(abs(got[c] - want[c]) for c in got) < 1e-3, query
    ranks = {chunk(r): r["scores"]["vector_rank"] for r in on["results"]}
    order = sorted(got, key=lambda c: ranks[c])  # ranked by those cosines (ties aside)
    assert all(want[a] >= want[b] - 1e-3 for a, b in zip(order, order[1:]))
    assert [chunk(r) for r in on["results"]] != [chunk(r) for r in off["results"]]  # it moved


def test_convex_fusion_is_the_scaled_scores_mixed(make_daemon, tmp_path):
    """Hybrid's default fusion, recomputed from a reply that holds every candidate of both
    rankings: vector_share x the cosine + the rest x the BM25 score, each scaled min-max over
    its own list; a short query gives the vectors half the odds. fusion = "rrf" (live on
    reload) gives weight / (60 + rank) summed."""
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config(extra="[search]\ncandidates = 300\n"
                                              # every candidate in the reply: none cut
                                              "min_similarity = 0\n"))

    def scaled(rs, key):
        xs = {id(r): r["scores"][key] for r in rs if key in r["scores"]}
        lo, hi = min(xs.values()), max(xs.values())
        return {i: (x - lo) / (hi - lo) for i, x in xs.items()}

    with d:
        wait_embedded(d)
        for query, share in (("I'd like done items to disappear from the list once ticked", 0.6),
                             ("recurring weekly task", 0.3 / 0.7)):
            res = d.call("search", query=query, k=300, group="chunk")
            assert res["fusion"] == "convex" and len(res["results"]) < 300, res.get("reason")
            assert res["weights"] == {"vector": round(share, 4), "bm25": round(1 - share, 4)}
            rs = res["results"]
            vec, bm = scaled(rs, "vector"), scaled(rs, "bm25")
            assert len(vec) == len(rs) and 0 < len(bm) < len(rs)  # both rankings count
            want = [share * vec[id(r)] + (1 - share) * bm.get(id(r), 0.0) for r in rs]
            assert max(abs(r["scores"]["fused"] - w) for r, w in zip(rs, want)) < 1e-4, query
            assert want == sorted(want, reverse=True)
        d.config.write_text(d.config.read_text().replace("candidates = 300",
                                                         "candidates = 300\nfusion = \"rrf\""))
        assert d.call("reload")["applied"] == ["search.fusion"]
        res = d.call("search", query="recurring weekly task", k=300, group="chunk")
        assert res["fusion"] == "rrf" and res["weights"] == {"vector": 0.5, "bm25": 1.0}
        for r in res["results"]:
            sc = r["scores"]
            want = sum(w / (60 + sc[f"{name}_rank"]) for name, w in res["weights"].items()
                       if f"{name}_rank" in sc)
            assert abs(sc["rrf"] - want) < 1e-5 and "fused" not in sc


@pytest.mark.parametrize("index", ["tantivy", "fts5"])
def test_a_symbol_is_found_as_grep_finds_it(make_daemon, tmp_path, index):
    """Emoji and other symbols (⛔ 📅 of a task line) are words to the user: FTS5's tokenizer
    drops them, so `ragctl search ⛔` answered "nothing relevant" while grep found the lines.
    The tantivy index keeps them as such; FTS5 (bm25_index = "fts5", while tantivy fills, and
    for an editor's unsaved buffers) as words in a chunk's keywords (with_symbols).
    Hybrid and BM25 search find the notes holding one, in files and in unsaved buffers, the
    lines are marked, and a symbol nothing holds still gets "nothing relevant"."""
    root = tmp_path / "v"
    root.mkdir()
    (root / "errands.md").write_text("# Errands\n\n- [ ] Buy milk 📅 2026-12-01\n"
                                     "- [ ] Post the parcel ⛔ abc123\n")
    (root / "garden.md").write_text("# Garden\n\nPrune the roses in March. 🌹\n")
    (root / "reading.md").write_text("# Reading\n\nBooks to read this winter.\n")
    (root / "keys.md").write_text("# Keys\n\nAlt → moves right; a limit x ≤ 3.\n")
    (root / "launch.md").write_text('---\naliases: ["🌋 eruption log"]\n---\n'
                                    "# Release 🚀 checklist\n\nCheck the fuel.\n")
    # ASCII operators (loader.PARSER 5): ':=' and '->' are found; a comment's '-->', a rule's
    # '---' are not '->'
    (root / "walrus.md").write_text("# Assignment expressions\n\nBind a name in a test:\n\n"
                                    "    if (n := len(items)) > 10:\n\n"
                                    "A typed one: def area(r: float) -> float.\n")
    (root / "comment.md").write_text("# Comment\n\n<!-- hidden -->\n\n---\n\nPlain text.\n")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "folder"}],
                    extra=engine_config(extra=f'[search]\nbm25_index = "{index}"\n'))
    served = index  # (the reply names the index that answered)

    def found(res) -> list[str]:
        return [Path(r["path"]).name for r in res["results"]]

    with d:
        wait_embedded(d)
        d.wait_idle()
        for mode in ("hybrid", "bm25"):
            res = d.call("search", query="⛔", mode=mode, wait=10)
            assert res.get("bm25_index") == served, res
            # (hybrid adds what the vectors find: in three notes, every note)
            assert found(res)[0] == "errands.md" and (mode == "hybrid" or
                                                      found(res) == ["errands.md"]), res
            assert res["results"][0]["match_lines"] == [4]
            assert res["confidence"] == 1.0 and res["low_confidence"] is False
            assert res["results"][0]["scores"]["note_bm25_rank"] == 1  # the note's words too
        res = d.call("search", query="🌹 roses", mode="bm25")
        assert found(res)[0] == "garden.md"
        for sign in ("→", "≤"):  # arrows and mathematical signs too
            for mode in ("hybrid", "bm25"):
                res = d.call("search", query=sign, mode=mode)
                assert found(res)[0] == "keys.md" and (mode == "hybrid" or found(res) == [
                    "keys.md"]), (sign, mode, res)
                assert res["results"][0]["match_lines"] == [3], res
        for sign, line in ((":=", 5), ("->", 7)):
            for mode in ("hybrid", "bm25"):
                res = d.call("search", query=sign, mode=mode)
                assert found(res)[0] == "walrus.md" and (mode == "hybrid" or found(res) == [
                    "walrus.md"]), (sign, mode, res)
                assert res["results"][0]["match_lines"] == [line], res
        for sign in ("🚀", "🌋"):  # in a title, in an alias
            assert found(d.call("search", query=sign, mode="bm25")) == ["launch.md"], sign
        res = d.call("search", query="⚓", mode="bm25")
        assert res["results"] == [] and "nothing relevant" in res["reason"]
        with d.client() as editor:  # an unsaved buffer holding a symbol no file holds
            editor.call("buffer_set", path=str(root / "reading.md"),
                        text="# Reading\n\nBooks to read this winter. ⚓ Moby-Dick\n")
            res = editor.call("search", query="⚓", mode="bm25")
            assert found(res) == ["reading.md"] and res["results"][0].get("unsaved"), res
    # an index from before (schema 6: no symbol words) gets them at the next start (store.m007)
    db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
    with db:
        db.execute("UPDATE chunks SET keywords = ''")
    db.execute("PRAGMA user_version = 6")
    db.close()
    with d:
        d.wait_idle()
        assert found(d.call("search", query="⛔", mode="bm25", wait=10)) == ["errands.md"]
    # an index read by an older parser (4: ASCII operators were no words; 3: arrows and signs)
    # reads every file again at the next start (loader.PARSER): FTS5 then finds them too
    db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
    with db:
        db.execute("UPDATE chunks SET keywords = '' WHERE file_id IN "
                   "(SELECT id FROM files WHERE relpath IN ('keys.md', 'walrus.md'))")
        reading = json.loads(db.execute("SELECT value FROM meta WHERE key = 'reading'"
                                        ).fetchone()[0])
        reading["v"]["parser"] = 4
        db.execute("UPDATE meta SET value = ? WHERE key = 'reading'", (json.dumps(reading),))
    ids = chunk_ids(db)
    db.close()
    with d:
        d.wait_idle()
        assert found(d.call("search", query="≤", mode="bm25", wait=10)) == ["keys.md"]
        assert found(d.call("search", query=":=", mode="bm25")) == ["walrus.md"]
        totals = d.call("status")["totals"]
    # every file was read again; only those whose chunks came out otherwise were rewritten:
    # the two blanked here, and launch.md, whose alias the step above blanked (m007 gives
    # back symbol words, not aliases). The others keep their rows: nothing is pushed through
    # the text index and the vectors again.
    db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
    now = chunk_ids(db)
    db.close()
    rewritten = ("keys.md", "walrus.md", "launch.md")
    assert totals["files_indexed"] == len(ids) and totals["chunks_written"] == sum(
        len(ids[f]) for f in rewritten), totals
    assert {f: c for f, c in now.items() if f not in rewritten} == {
        f: c for f, c in ids.items() if f not in rewritten}


@pytest.mark.parametrize("index", ["tantivy", "fts5"])
def test_a_literal_match_is_every_word_in_one_chunk(make_daemon, tmp_path, index):
    """Below the similarity threshold, a query whose every word, phrase and symbol one chunk
    holds is a literal match, answered; one whose words are held only apart, or not at all,
    is not. tantivy answers it when it serves (FTS5 walks every word's whole list: over
    100 ms for a question of ten words at a million chunks); both give the same answers."""
    root = tmp_path / "v"
    root.mkdir()
    (root / "boat.md").write_text("# Boat\n\nThe kayak paddle is under the stairs.\n")
    (root / "bike.md").write_text("# Bike\n\nThe bicycle pump is in the shed. ⛔\n")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "folder"}],
                    extra=engine_config(extra=f'[search]\nbm25_index = "{index}"\n'
                                              'min_similarity = 0.99\n'))
    with d:
        wait_embedded(d)
        d.wait_idle()
        deadline = time.monotonic() + 30  # (tantivy fills after the first index)
        while d.call("search", query="kayak", mode="bm25").get("bm25_index") != index:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        for query, answered in (("kayak paddle stairs", "boat.md"),
                                ('"kayak paddle" under', "boat.md"),
                                ("the bicycle pump ⛔", "bike.md"),
                                ("kayak pump", None), ("the kayak ⛔", None),
                                ("kayak zeppelin", None)):
            res = d.call("search", query=query, mode="vector", k=5)
            if answered:
                assert res["below_threshold"] is True and \
                    Path(res["results"][0]["path"]).name == answered, (query, res)
            else:
                assert res["results"] == [] and res["reason"].startswith(
                    "nothing relevant"), (query, res)


def chunk_ids(db) -> dict[str, list[int]]:
    """Each indexed file's chunk ids, in order."""
    out: dict[str, list[int]] = {}
    for rel, cid in db.execute("SELECT f.relpath, c.id FROM chunks c JOIN files f "
                               "ON f.id = c.file_id ORDER BY f.relpath, c.ordinal"):
        out.setdefault(rel, []).append(cid)
    return out


def test_a_shown_line_holds_its_match():
    """ragctl shows a long line around its first match, cut with "…" (a match past the 160th
    character was cut off), and marks symbols as it marks words."""
    from ragctl.render import _excerpt, _mark, _terms
    terms = _terms("what does ⛔ mean for dependencies")
    assert "⛔" in terms and "dependenci" in terms
    assert "→" in _terms("what does → mean")
    assert ":=" in _terms("what does := mean") and not {"->", "-->"} & set(_terms("a --> b"))
    line = "a" * 300 + " - [ ] Post the parcel ⛔ abc123 " + "b" * 300
    shown = _excerpt(line, terms)
    assert "⛔ abc123" in shown and shown.startswith("…") and shown.endswith("…")
    assert len(shown) == 162
    assert _excerpt("short ⛔", terms) == "short ⛔"
    assert _mark("x ⛔ y dependencies", terms, True) == \
        "x \033[1;31m⛔\033[0m y \033[1;31mdependencies\033[0m"


def test_a_query_past_the_models_context_is_cut_not_degraded(make_daemon, tmp_path):
    """An agent pastes a page into search: the query is cut to the model's context (as
    documents are), not refused by the engine and answered from BM25 as if the engine were
    down; the reply echoes its first 1,000 characters."""
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    with d:
        wait_embedded(d)
        long = "recurring task due date weekly " * 120  # about 600 tokens
        for mode in ("hybrid", "vector"):
            res = d.call("search", query=long, mode=mode, k=3)
            assert res["mode"] == mode and res["degraded"] is False, res.get("reason")
            cut = res["query_truncated"]
            assert cut["tokens"] > cut["kept"] and cut["kept"] <= 512 and res["results"]
            # and the page is not echoed back whole
            assert res["query"] == long[:1000] + "…" and res["query_chars"] == len(long)
        res = d.call("search", query="recurring task", k=1)
        assert "query_truncated" not in res and "query_chars" not in res
        assert res["query"] == "recurring task"


def test_a_note_scores_its_whole_text_too(make_daemon, tmp_path):
    """A note's score is its best chunk's (length-damped) plus its whole text's BM25, scaled
    0..1 over the notes and weighted (search.note_weight, live on reload): a note whose
    sections each hold one word of the question passes a note holding one of them twice. The
    whole-note rows follow edits, renames and deletes."""
    root = small_vault(tmp_path / "vault")
    filler = "Some plain words about the weather and the garden, written down for later."
    (root / "spread.md").write_text(
        f"# Spread\n\n## One\n\nA zephyr came. {filler}\n\n## Two\n\nA quasar shone. {filler}\n"
        f"\n## Three\n\nA fjord froze. {filler}\n")
    (root / "dense.md").write_text(f"# Dense\n\nA zephyr and a zephyr again. {filler}\n")
    (root / "third.md").write_text(f"# Third\n\n{filler}\n\n## Later\n\nOne zephyr. {filler}\n")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "folder"}],
                    extra="[embedding]\nmodel = \"\"\n[search]\nnote_weight = 0\n")
    query = "zephyr quasar fjord"

    def search():
        res = d.call("search", query=query, mode="bm25", k=20)
        return res, [Path(r["path"]).name for r in res["results"]]

    with d:
        d.wait_idle()
        res, names = search()
        assert names[0] == "dense.md" and "note_bm25" not in res["results"][0]["scores"]
        d.config.write_text(d.config.read_text().replace("note_weight = 0", ""))
        assert d.call("reload")["applied"] == ["search.note_weight"]
        res, names = search()
        assert names[:3] == ["spread.md", "dense.md", "third.md"], res["results"]
        rs = res["results"]
        top = max(r["scores"]["bm25"] for r in rs)  # BM25's scale: its best chunk
        lo, hi = min(r["scores"]["note_bm25"] for r in rs), max(r["scores"]["note_bm25"]
                                                              for r in rs)
        chunks = {f["path"]: f["chunks"] for f in d.call("files", limit=1000)["files"]}
        for r in rs:  # best chunk / length damping + weight x top x scaled whole-note score
            sc = r["scores"]
            added = 0.25 * top * (sc["note_bm25"] - lo) / (hi - lo)
            assert abs(sc["note_bm25_added"] - added) < 1e-4
            damping = 1 + 0.03 * math.log(chunks[r["path"]])
            assert abs(sc["note"] - (sc["bm25"] / damping + added)) < 1e-4
        spread = rs[0]["scores"]
        assert spread["note_bm25_rank"] == 1 and spread["note"] > rs[1]["scores"]["note"]
        assert spread["note_bm25_added"] > 0 and rs[-1]["scores"]["note_bm25_added"] == 0
        why = ragctl("--config", d.config, "search", "--explain", "--mode", "bm25", query)
        assert "whole note bm25 rank 1" in why.stdout, why.stdout

        # the rows follow the notes: an edit, a rename and a delete
        (root / "spread.md").write_text(f"# Spread\n\n## One\n\nA zephyr came. {filler}\n")
        (root / "dense.md").rename(root / "moved.md")
        (root / "third.md").unlink()
        d.wait_idle()
        res, names = search()
        assert sorted(names) == ["moved.md", "spread.md"]
        db = sqlite3.connect(f"file:{tmp_path / 'data' / 'index.sqlite3'}?mode=ro", uri=True)
        try:
            rows = {r[0]: r[1:] for r in db.execute(
                "SELECT rowid, title, keywords, headings, body FROM notes_fts")}
            want: dict[int, list[tuple[str, str, str]]] = {}
            for fid, *chunk in db.execute("SELECT file_id, heading, keywords, body FROM chunks "
                                          "ORDER BY file_id, ordinal"):
                want.setdefault(fid, []).append(tuple(chunk))
            assert rows == {fid: store.note_row(cs) for fid, cs in want.items()}
            assert any("\nsym" in body for *_, body in rows.values())  # ✅ and the like
            assert db.execute("SELECT COUNT(*) FROM notes_dirty").fetchone()[0] == 0
            assert [r[0] for r in db.execute(
                "SELECT rowid FROM notes_fts WHERE notes_fts MATCH 'quasar OR fjord'")] == []
        finally:
            db.close()


def test_an_index_from_before_whole_notes_gets_them_at_start(make_daemon, tmp_path):
    """Schema 5 -> 6 (store.m006): the first start after the upgrade builds the notes' rows from
    the chunks already indexed, and search uses them at once; so does a start that finds them
    of an older format (store.NOTES_FORMAT)."""
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "folder"}])
    with d:
        d.wait_idle()
        first = d.call("search", query="recurrence rule", mode="bm25")

    def notes_ranked(res) -> list:
        return [(r["path"], r["scores"].get("note_bm25_rank")) for r in res["results"]]
    assert notes_ranked(first)[0][1] is not None
    path = tmp_path / "data" / "index.sqlite3"
    db = sqlite3.connect(path)
    with db:
        for trigger in ("notes_chunks_ai", "notes_chunks_ad", "notes_chunks_au"):
            db.execute(f"DROP TRIGGER {trigger}")
        db.execute("DROP TABLE notes_fts")
        db.execute("DROP TABLE notes_dirty")
        # what the later migrations made goes too, so this is an index of schema 5
        db.execute("DROP TABLE removed_files")
        db.execute("DROP TABLE removed_sources")
    db.execute("PRAGMA user_version = 5")
    db.close()
    with d:
        d.wait_idle()
        res = d.call("search", query="recurrence rule", mode="bm25")
        assert res["results"] and all("note_bm25" in r["scores"] for r in res["results"][:3])
    log = tmp_path / "data" / "ragd.log"
    assert log.read_text().count("note index built") == 1  # (the first start had no notes)
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == store.SCHEMA_VERSION
        assert db.execute("SELECT COUNT(*) FROM notes_fts").fetchone()[0] == db.execute(
            "SELECT COUNT(DISTINCT file_id) FROM chunks").fetchone()[0] > 10
        with db:  # rows of an older format are rebuilt at the next start
            db.execute("UPDATE meta SET value = '1' WHERE key = 'notes_format'")
            db.execute("DELETE FROM notes_fts")
    finally:
        db.close()
    with d:
        d.wait_idle()
        res = d.call("search", query="recurrence rule", mode="bm25", wait=30)
        assert notes_ranked(res) == notes_ranked(first)  # (rows rebuilt as they were)
    assert log.read_text().count("note index built") == 2
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT COUNT(*) FROM notes_fts").fetchone()[0] == db.execute(
            "SELECT COUNT(DISTINCT file_id) FROM chunks").fetchone()[0]
    finally:
        db.close()


def test_one_long_note_does_not_turn_the_whole_note_score_off(make_daemon, tmp_path):
    """A word is left out of the whole-note score when it is common; one long note holding it in
    80 sections made it common among the chunks while two notes hold it: the notes count."""
    root = small_vault(tmp_path / "vault")
    (root / "log.md").write_text("# Log\n\n" + "".join(
        f"## Day {i}\n\nThe quokka came by on day {i}.\n\n" for i in range(80)))
    (root / "island.md").write_text("# Island\n\nA quokka lives on Rottnest island.\n")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "folder"}])
    with d:
        d.wait_idle()
        res = d.call("search", query="quokka", mode="bm25", group="chunk", k=200)
        assert len(res["results"]) == 81  # over 10% of the chunks, and over 50
        res = d.call("search", query="quokka", mode="bm25")
        by = {r["path"].rsplit("/", 1)[1]: r["scores"] for r in res["results"]}
        assert by.keys() == {"log.md", "island.md"}
        assert all("note_bm25_rank" in sc for sc in by.values()), by
