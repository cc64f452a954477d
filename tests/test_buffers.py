"""Editors' unsaved buffers and related notes, over the real socket with the real daemon."""

from __future__ import annotations

import sqlite3
import time

import pytest

from conftest import engine_config, small_vault, wait_embedded
from ragd import protocol as P


def words_in_index(tmp_path, word: str) -> int:
    db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
    return db.execute("SELECT COUNT(*) FROM chunks_fts WHERE chunks_fts MATCH ?",
                      (word,)).fetchone()[0]


def test_a_buffer_is_searched_instead_of_its_file_and_never_written(make_daemon, tmp_path):
    root = tmp_path / "n"
    root.mkdir()
    note = root / "plans.md"
    note.write_text("# Plans\n\nWe will visit the aquarium.\n")
    (root / "other.md").write_text("# Other\n\nNothing to see.\n")
    d = make_daemon(sources=[{"name": "n", "path": str(root)}],
                    extra='[embedding]\nmodel = ""\n[buffers]\nmax_per_client = 2\n'
                          '[index]\nmax_file_bytes = 100000\n')
    with d:
        d.wait_idle()
        with d.client() as editor:
            res = editor.call("buffer_set", path=str(note), version=3,
                              text="# Plans\n\nWe will visit the planetarium.\n\nAnd a zeppelin.\n")
            assert res["chunks"] == 1 and res["version"] == 3 and res["source"] == "n"
            # any client's search sees it at once (BM25), as unsaved, instead of the file
            hit = d.call("search", query="zeppelin")["results"]
            assert [h["path"] for h in hit] == [str(note)] and hit[0]["unsaved"] is True
            assert hit[0]["line_start"] == 3 and hit[0]["match_lines"] == [5]
            assert d.call("search", query="aquarium")["results"] == []
            assert words_in_index(tmp_path, "zeppelin") == 0  # nothing written
            # bounds: too large, too many
            big = "x" * 100001
            with pytest.raises(P.DaemonError) as e:
                editor.call("buffer_set", path=str(note), text=big)
            assert e.value.code == "bad_args" and "file size limit" in e.value.message
            editor.call("buffer_set", path=str(root / "other.md"), text="# Other\n\nmore.\n")
            with pytest.raises(P.DaemonError) as e:
                editor.call("buffer_set", path=str(root / "third.md"), text="# Third\n")
            assert e.value.code == "unavailable" and "max_per_client = 2" in e.value.message
            with pytest.raises(P.DaemonError) as e:
                editor.call("buffer_set", path=str(tmp_path / "elsewhere.md"), text="x")
            assert e.value.code == "not_found"
            # a relative path would be resolved against the daemon's folder, not the editor's
            for op, args in (("buffer_set", {"text": "x"}), ("buffer_drop", {}),
                             ("related", {})):
                with pytest.raises(P.DaemonError) as e:
                    editor.call(op, path=note.name, **args)
                assert e.value.code == "bad_args" and "must be absolute" in e.value.message
                # a NUL character: refused, as get refuses it (it was an internal error, or
                # "not a file ragd indexes")
                for bad in (f"{note}\0", "~\0/notes/a.md"):
                    with pytest.raises(P.DaemonError) as e:
                        editor.call(op, path=bad, **args)
                    assert (e.value.code, e.value.message) == (
                        "bad_args", f"{op}: path contains a NUL character"), (bad, e.value)
            # dropped: the file's text again
            assert editor.call("buffer_drop", path=str(root / "other.md")) == {"dropped": True}
            assert d.call("search", query="zeppelin")["results"]
        # the client hung up: its buffers are gone
        deadline = time.monotonic() + 5
        while d.call("search", query="zeppelin")["results"]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert d.call("search", query="aquarium")["results"][0].get("unsaved") is None
        # a buffer equal to the file is no buffer; a buffer saved to disk ends
        with d.client() as editor:
            same = editor.call("buffer_set", path=str(note), text=note.read_text())
            assert same["dropped"] is True
            editor.call("buffer_set", path=str(note), text="# Plans\n\nA trip to the bakery.\n")
            assert d.call("search", query="bakery")["results"][0]["unsaved"] is True
            note.write_text("# Plans\n\nA trip to the bakery.\n")  # the editor saved it
            d.wait_idle()
            hit = d.call("search", query="bakery")["results"]
            assert hit and "unsaved" not in hit[0]


def test_a_buffer_embeds_only_its_new_texts_and_related_notes(make_daemon, tmp_path):
    root = small_vault(tmp_path / "v")
    note = root / "How To" / "Set up custom statuses.md"
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    with d:
        st = wait_embedded(d)
        with d.client() as editor:
            assert editor.call("buffer_set", path=str(note),
                               text=note.read_text() + "\n")["to_embed"] == 0
            text = note.read_text() + ("\n## Gardening\n\nMy tomato seedlings need repotting "
                                       "before the frost, and the basil wants sun.\n")
            res = editor.call("buffer_set", path=str(note), text=text)
            assert res["to_embed"] == 1
            deadline = time.monotonic() + 30
            while True:  # vector-searchable once its new chunk is embedded
                hits = d.call("search", query="when to repot young tomato plants", mode="vector",
                              k=3)["results"]
                if hits and hits[0]["path"] == str(note) and hits[0].get("unsaved"):
                    break
                assert time.monotonic() < deadline, hits
                time.sleep(0.1)
            assert "tomato" in hits[0]["text"]
            # embedding the buffer wrote nothing: the cache has no new entry
            db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
            assert db.execute("SELECT COUNT(*) FROM embeddings").fetchone()[0] == \
                st["engines"]["embedding"]["embedded_texts"]
        # related: note-level, never the note itself, with the chunks that link them
        rel = d.call("related", path=str(note), k=5)
        assert rel["results"] and all(r["path"] != str(note) for r in rel["results"])
        assert len({r["path"] for r in rel["results"]}) == len(rel["results"])
        top = rel["results"][0]
        assert {"line_start", "line_end"} <= set(top["link"]["from"])
        assert top["link"]["to"] == {"line_start": top["line_start"], "line_end": top["line_end"]}
        assert "statuses" in (top["title"] + top["path"]).lower()
        scores = [r["score"] for r in rel["results"]]
        assert scores == sorted(scores, reverse=True)
        by_text = d.call("related", text="Kanban boards with lanes and cards", k=3)
        assert by_text["results"] and by_text["results"][0]["score"] > 0.3
        with pytest.raises(P.DaemonError) as e:
            d.call("related", k=3)
        assert e.value.code == "bad_args"


# A footer every note of a source ends with: word for word, or linking the note's own page
# (the Obsidian Hub's "Edit In GitHub": the same text as read, its address aside)
FOOTERS = {
    "copied": lambda name: ("\n## Copyright\n\nThis document has been placed in the public "
                            "domain. It may be copied and changed freely.\n"),
    "own address": lambda name: (
        "\n## This note in GitHub\n\n[Edit In GitHub](https://github.dev/example/hub/blob/"
        f"main/{name} \"edit-note\") | [Copy this note](https://raw.example.org/hub/main/"
        f"{name}) | [Download this vault](https://github.com/example/hub/archive/main.zip)\n"),
}


@pytest.mark.parametrize("footer_kind", list(FOOTERS))
def test_related_is_not_linked_by_a_section_copied_into_every_note(make_daemon, tmp_path,
                                                                    footer_kind):
    """A section held by many notes of a source (a licence footer, word for word; or a
    footer linking each note's own page, cosine 0.94-0.96 between two notes' copies) does not
    link them, however many notes other sources hold: related answers from the note's own
    sections, by topic."""
    root = tmp_path / "docs"
    root.mkdir()
    footer_of = FOOTERS[footer_kind]
    topics = {
        "roses.md": "# Pruning roses\n\nCut rose stems above an outward bud in late winter, "
                    "and feed the roses with compost in spring.\n",
        "tulips.md": "# Planting tulips\n\nPlant tulip bulbs in autumn, pointed end up, in "
                     "well drained soil of the flower bed.\n",
        "brakes.md": "# Brake pads\n\nReplace the car's brake pads when they squeal; check "
                     "the discs and the brake fluid level at the same time.\n",
        "tax.md": "# Tax return\n\nFile the income tax return before the deadline and keep "
                  "the receipts for deductions.\n",
    }
    for name, body in topics.items():
        (root / name).write_text(body + footer_of(name))
    other = tmp_path / "journal"  # a source beside it, without the footer
    other.mkdir()
    for i in range(40):  # (a tenth of them is more than the 3 stubs below)
        (other / f"day{i}.md").write_text(f"# Day {i}\n\nWalked to the harbour and back.\n")
    d = make_daemon(sources=[{"name": "docs", "path": str(root)},
                             {"name": "journal", "path": str(other)}], extra=engine_config())
    with d:
        wait_embedded(d)
        rel = d.call("related", path=str(root / "roses.md"), k=3)["results"]
        assert rel[0]["path"] == str(root / "tulips.md"), rel
        # linked from the note's own section (lines 1-3), not from the footer (lines 5-7)
        assert all(r["link"]["from"]["line_end"] <= 3 for r in rel), rel
        text = ("# The flower bed\n\nPlant the tulip bulbs in autumn, prune the roses in "
                "late winter, and feed the bed with compost in spring.\n" +
                footer_of("garden.md"))
        by_text = d.call("related", text=text, k=2)["results"]
        assert {r["path"] for r in by_text} == {str(root / "roses.md"),
                                                str(root / "tulips.md")}, by_text
        assert all(r["link"]["from"]["line_end"] <= 3 for r in by_text), by_text
        # a note of nothing but a title and the footer links by nothing: no note, and why
        # (the Obsidian Hub's stubs were linked to each other by their footers)
        (root / "stub.md").write_text("# Stub\n" + footer_of("stub.md"))
        # ... nor one of a placeholder line a few other stubs hold too, under the share that
        # makes a section boilerplate for related (a tenth of the notes; the hub's stubs)
        for name in ("stub2.md", "stub3.md", "stub4.md"):
            (other / name).write_text(f"# {name[:-3]}\n\nWrite a description of this note "
                                      "here, in a sentence or two.\n")
        d.wait_idle(vectors=True)
        for stub_path in (root / "stub.md", other / "stub2.md"):
            stub = d.call("related", path=str(stub_path), k=3)
            assert stub["results"] == [] and "every section of it is text many notes " \
                "share" in stub["reason"], stub


def test_a_buffer_is_scored_as_a_whole_note_as_its_file_would_be(make_daemon, tmp_path):
    """The whole-note BM25 (search.note_weight) of an unsaved buffer is computed as FTS5
    computes a note's: a buffer holding the same text as an indexed note (under a title of as
    many words) gets the same score, and the note it stands in for is not scored twice. (With
    a buffer searched, FTS5 scores every note: tantivy's scores are on another scale.)"""
    root = small_vault(tmp_path / "n")
    text = ("\n\n## Orchard\n\nThe quince tree and the medlar need pruning in winter.\n\n"
            "## Cellar\n\nStore the quince jelly beside the medlar wine.\n")
    (root / "alpha.md").write_text("# alpha" + text)
    d = make_daemon(sources=[{"name": "n", "path": str(root)}])
    query = "quince medlar pruning jelly"
    with d:
        d.wait_idle()
        with d.client() as editor:
            editor.call("buffer_set", path=str(root / "gamma.md"), text="# gamma" + text)
            res = d.call("search", query=query, mode="bm25")
            assert res["bm25_index"].startswith("fts5 (unsaved editor buffers"), res
            by = {r["path"].rsplit("/", 1)[1]: r["scores"] for r in res["results"]}
            top = {"scores": by["alpha.md"]}  # the indexed note, scored in the same search
            assert by["gamma.md"]["note_bm25"] == pytest.approx(top["scores"]["note_bm25"],
                                                                rel=1e-4)
            assert by["gamma.md"]["note_bm25_rank"] in (1, 2)
            # a buffer of alpha itself, with a word more: scored as a buffer, once
            editor.call("buffer_set", path=str(root / "alpha.md"),
                        text="# alpha" + text + "\nAnd a quince.\n")
            res = d.call("search", query=query, mode="bm25")
            alpha = [r for r in res["results"] if r["path"].endswith("alpha.md")]
            assert len(alpha) == 1 and alpha[0]["unsaved"] is True
            assert alpha[0]["scores"]["note_bm25"] > top["scores"]["note_bm25"]
            assert sorted(r["scores"]["note_bm25_rank"] for r in res["results"]
                          if "note_bm25_rank" in r["scores"])[:2] == [1, 2]


def test_a_named_note_open_with_unsaved_changes_is_shown_once_as_its_buffer(make_daemon,
                                                                            tmp_path):
    """A query that is a note's name puts that note first (search/names.py), but a note open
    in an editor with unsaved changes is searched as its buffer: the note is shown once, as
    the buffer, never a second time by its indexed (stale) text."""
    root = small_vault(tmp_path / "n")
    note = root / "Quince.md"
    note.write_text("# Quince\n\nThe quince tree needs pruning in winter.\n")
    (root / "Orchard.md").write_text("# Orchard\n\nQuince, quince and more quince: the quince "
                                     "jelly, the quince wine, the quince paste.\n")
    d = make_daemon(sources=[{"name": "n", "path": str(root)}],
                    extra='[embedding]\nmodel = ""\n')
    with d:
        d.wait_idle()
        for group in ("note", "chunk"):
            res = d.call("search", query="Quince", group=group)["results"]
            assert res[0]["path"] == str(note) and res[0]["scores"].get("named"), res
        with d.client() as editor:
            editor.call("buffer_set", path=str(note),
                        text="# Quince\n\nThe quince tree needs pruning in winter, and a "
                             "medlar beside it.\n")
            for group in ("note", "chunk"):
                res = d.call("search", query="Quince", group=group)["results"]
                mine = [r for r in res if r["path"] == str(note)]
                assert len(mine) == 1 and mine[0]["unsaved"] is True, res
                assert "medlar" in mine[0]["text"]


def test_a_dropped_buffers_texts_are_not_embedded(make_daemon, tmp_path):
    """A fresh-user walk sent a 500 KB buffer (391 texts to embed) and dropped it: its texts
    stayed queued, and the query engine embedded them for minutes (a core at 100% with status
    saying idle, every search 100x slower, the bulk embedding paused each time). A buffer
    dropped, replaced by a shorter version or left by its client takes its texts out of the
    queue, and status counts what is left (buffers.to_embed)."""
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "folder"}],
                    extra=engine_config())
    note = root / "How To" / "Long draft.md"
    words = "lantern quartz meadow falcon copper thistle orbit velvet canyon ember".split()
    big = "# Draft\n\n" + "\n\n".join(
        f"## Part {i}\n\n" + " ".join(f"{words[(i + j) % len(words)]}{i}" for j in range(60))
        for i in range(300))
    with d:
        wait_embedded(d)

        def queued() -> tuple[dict, float]:
            st = d.call("status")
            return st["buffers"], st["engines"]["embedding"]["query_engine"]["bulk_paused_s"]

        with d.client() as editor:
            assert editor.call("buffer_set", path=str(note), text=big)["to_embed"] >= 290
            assert queued()[0]["held"] == 1
            # its next version, a line: only that line's texts wait
            editor.call("buffer_set", path=str(note), text="# Draft\n\nOne line for now.\n")
            assert queued()[0]["to_embed"] <= 1
            editor.call("buffer_set", path=str(note), text=big)
            assert editor.call("buffer_drop", path=str(note)) == {"dropped": True}
            got, paused = queued()
            assert got == {"held": 0, "to_embed": 0}, got
            # the query engine at rest: the bulk engine no longer paused for it, once the
            # batch in the engine's hands (if one was) is done; before, it went on for minutes
            deadline = time.monotonic() + 30
            while True:
                time.sleep(2.0)
                before, paused = paused, queued()[1]
                if paused == before:
                    break
                assert time.monotonic() < deadline, (before, paused)
            assert d.call("status")["doing"] == "idle"
            editor.call("buffer_set", path=str(note), text=big)
        # its client gone: the same
        deadline = time.monotonic() + 5
        while (got := queued()[0]) != {"held": 0, "to_embed": 0}:
            assert time.monotonic() < deadline, got
            time.sleep(0.02)
