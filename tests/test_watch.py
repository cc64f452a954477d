"""Live freshness with the real daemon, the real engine and a copy of a real vault."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

import pytest

from conftest import engine_config, ragctl, small_vault, wait_embedded
from ragd.protocol import DaemonError, ProtocolError
from ragd.ingest import chunker, markdown


def find(d, query, timeout=15.0, mode="bm25"):
    """Search until the query finds something (or time runs out); return the results."""
    deadline = time.monotonic() + timeout
    while True:
        res = d.call("search", query=query, k=5, mode=mode)["results"]
        if res or time.monotonic() > deadline:
            return res
        time.sleep(0.05)


def gone(d, query, timeout=15.0):
    deadline = time.monotonic() + timeout
    while d.call("search", query=query, k=5, mode="bm25")["results"]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def embedded(d) -> int:
    return wait_embedded(d)["engines"]["embedding"]["embedded_texts"]


def test_create_edit_delete_rename_move(make_daemon, tmp_path):
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    with d:
        base = embedded(d)
        note = root / "Fresh note.md"
        note.write_text("# Fresh\n\nThe word xylophonist appears here.\n")
        hits = find(d, "xylophonist")
        assert hits and hits[0]["path"] == str(note) and hits[0]["line_start"] == 3
        after_create = embedded(d)
        assert after_create == base + 1

        note.write_text("# Fresh\n\nNow the word quokkaberry appears instead.\n")
        assert find(d, "quokkaberry") and gone(d, "xylophonist")

        renamed = root / "Renamed note.md"
        os.rename(note, renamed)
        hits = find(d, "quokkaberry")
        deadline = time.monotonic() + 10
        while hits and hits[0]["path"] != str(renamed) and time.monotonic() < deadline:
            time.sleep(0.05)
            hits = find(d, "quokkaberry")
        assert hits[0]["path"] == str(renamed)
        assert hits[0]["heading"] == "Renamed note > Fresh"
        st = wait_embedded(d)
        assert st["totals"]["files_moved"] == 1
        n_embedded = st["engines"]["embedding"]["embedded_texts"]
        assert n_embedded == after_create + 1  # the edit, and nothing for the rename

        # a folder moved: every note under it follows, nothing embedded
        shutil.move(str(root / "Other Plugins"), str(root / "Plugins elsewhere"))
        hits = find(d, "QuickAdd")
        deadline = time.monotonic() + 10
        while not all("Plugins elsewhere" in h["path"] for h in hits) and time.monotonic() < deadline:
            time.sleep(0.05)
            hits = d.call("search", query="QuickAdd", k=5, mode="bm25")["results"]
        assert hits and all("Plugins elsewhere" in h["path"] for h in hits)
        st = wait_embedded(d)
        assert st["totals"]["files_moved"] >= 1 + 5
        assert st["engines"]["embedding"]["embedded_texts"] == n_embedded
        assert st["sources"][0]["files"] == 16  # 15 notes + the fresh one

        os.remove(renamed)
        assert gone(d, "quokkaberry")
        assert wait_embedded(d)["sources"][0]["files"] == 15


def test_ignore_rules_edited_while_running_apply_at_once(make_daemon, tmp_path):
    """.ragignore (and a vault's Excluded files) were read at start only: a pattern added while
    ragd ran changed nothing, and a 'ragctl reindex' that applied it was undone by the next
    save. Edited, the rules are read again and the source scanned with them; a file they
    now leave out is not indexed again when it is saved."""
    root = tmp_path / "docs"
    (root / "drafts").mkdir(parents=True)
    (root / "final.md").write_text("# Final\n\nThe report on quokka habitats.\n")
    (root / "drafts" / "early.md").write_text("# Early\n\nA draft on quokka diets.\n")
    d = make_daemon(sources=[{"name": "docs", "path": str(root)}])
    with d:
        d.wait_idle()

        def names():
            return sorted(Path(r["path"]).name for r in d.call(
                "search", query="quokka", mode="bm25", wait=5)["results"])

        assert names() == ["early.md", "final.md"]
        (root / ".ragignore").write_text("drafts/\n")
        deadline = time.monotonic() + 15
        while names() != ["final.md"]:
            assert time.monotonic() < deadline, names()
            time.sleep(0.1)
        (root / "drafts" / "early.md").write_text("# Early\n\nA second draft on quokkas.\n")
        (root / "final.md").write_text("# Final\n\nThe report on quokka habitats, v2.\n")
        assert d.call("search", query="v2", mode="bm25", wait=5)["results"]  # (saves heard)
        assert names() == ["final.md"]
        (root / ".ragignore").unlink()  # and let in again
        deadline = time.monotonic() + 15
        while names() != ["early.md", "final.md"]:
            assert time.monotonic() < deadline, names()
            time.sleep(0.1)


def test_a_folder_with_subfolders_moved_writes_nothing_and_keeps_vectors_equal_to_chunks(
        make_daemon, tmp_path):
    """watchdog tells a folder's move once for the folder and once for each file and subfolder
    under it. Each file moves once: no file is indexed again, no chunk written, and the vectors
    stay one per chunk (a file written twice in one transaction left the vectors of its first
    write's chunks behind: 87 extra per rename of a folder of the Tasks docs)."""
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    with d:
        wait_embedded(d)
        shutil.move(str(root / "Other Plugins"), str(root / "How To" / "Other Plugins"))
        assert find(d, "QuickAdd") and wait_settled(d, "How To/Other Plugins", "QuickAdd")
        st = wait_embedded(d)
        before = st["totals"]
        for i, name in enumerate(("Guides", "Guides again", "How To")):
            old = root / ("How To" if i == 0 else ("Guides", "Guides again")[i - 1])
            shutil.move(str(old), str(root / name))
            assert wait_settled(d, f"{name}/Other Plugins", "QuickAdd")
        st = wait_embedded(d)
        after = st["totals"]
        assert after["files_moved"] - before["files_moved"] == 3 * 15
        assert after["files_indexed"] == before["files_indexed"]
        assert after["chunks_written"] == before["chunks_written"]
        chunks = st["sources"][0]["chunks"]
        assert st["engines"]["embedding"]["vectors"] == chunks
        # there and back and there again within one quiet period: where it ends is what counts
        a, b = root / "How To", root / "Elsewhere"
        for src, dst in ((a, b), (b, a), (a, b)):
            os.rename(src, dst)
        assert wait_settled(d, "Elsewhere/Other Plugins", "QuickAdd")
        st = wait_embedded(d)
        assert st["sources"][0]["files"] == 15 and st["sources"][0]["chunks"] == chunks
        assert st["engines"]["embedding"]["vectors"] == chunks
        assert st["totals"]["chunks_written"] == before["chunks_written"]
        paths = {r["path"] for r in d.call("files")["files"]}
        assert paths and all("/Elsewhere/" in p for p in paths), sorted(paths)[:3]


def test_a_folder_moved_out_and_back_logs_no_library_warning(make_daemon, tmp_path):
    """A folder moved back to where it was is watched again under its old inotify watch:
    watchdog warns (a RuntimeWarning of ~9 KB, the whole watch table, on the daemon's stderr,
    which is its log) that it replaces its own callback. Harmless, and not the log's to say."""
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    with d:
        wait_embedded(d)
        here, away = root / "Other Plugins", tmp_path / "away"
        for there in (away, root / "Plugins elsewhere", away):
            shutil.move(str(here), str(there))
            # moved back only once the daemon has seen it go (out of the vault or within it)
            if there == away:
                assert wait_gone(d, "QuickAdd")
            else:
                assert wait_settled(d, there.name, "QuickAdd")
            shutil.move(str(there), str(here))
            assert wait_settled(d, "Other Plugins", "QuickAdd")
        wait_embedded(d)
        assert "Warning" not in d.log.read_text(errors="replace")


def wait_gone(d, query, timeout=15.0):
    """Until no note holds the query's word and nothing waits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not d.call("search", query=query, k=5, mode="bm25")["results"] and \
                d.call("status")["idle"]:
            return True
        time.sleep(0.05)
    return False


def wait_settled(d, folder, query, timeout=15.0):
    """Until every hit of the query is under the folder and nothing waits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hits = d.call("search", query=query, k=5, mode="bm25")["results"]
        if hits and all(f"/{folder}/" in h["path"] for h in hits) and \
                d.call("status")["idle"]:
            return True
        time.sleep(0.05)
    return False


def test_save_burst_is_one_update_and_one_paragraph_embeds_its_chunks(make_daemon, tmp_path):
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    note = root / "How To" / "Set up custom statuses.md"
    with d:
        st = wait_embedded(d)
        indexed, before = st["totals"]["files_indexed"], st["engines"]["embedding"]["embedded_texts"]
        old_text = note.read_text()
        lines = old_text.split("\n")
        i = next(k for k, ln in enumerate(lines) if len(ln.split()) > 12 and k > 40)
        lines[i] = lines[i] + " Zanzibar marmalade."
        new_text = "\n".join(lines)
        # an editor's save: write a temp file, rename it over the note, touch it
        tmp = note.with_name(".Set up custom statuses.md.tmp")
        tmp.write_text(new_text)
        os.replace(tmp, note)
        os.utime(note)
        assert find(d, "zanzibar marmalade")
        st = wait_embedded(d)
        assert st["totals"]["files_indexed"] == indexed + 1  # one update for the burst

        def hashes(text):
            doc = markdown.parse(text, note.stem)
            return {c.embed_hash for c in chunker.chunk_doc(doc, 256, 48)}

        changed = len(hashes(new_text) - hashes(old_text))
        assert 1 <= changed <= 2  # the chunk holding the line (and its overlap neighbour)
        assert st["engines"]["embedding"]["embedded_texts"] == before + changed


def test_an_edit_commits_its_chunks_and_their_vectors_together(make_daemon, tmp_path):
    import sqlite3
    import threading
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    note = root / "How To" / "Set up custom statuses.md"
    rel = "How To/Set up custom statuses.md"
    with d:
        wait_embedded(d)
        stop, seen, bare = threading.Event(), [], []

        def watch_db():  # every read is one snapshot: never a chunk of the note without vector
            db = sqlite3.connect(f"file:{tmp_path / 'data' / 'index.sqlite3'}?mode=ro", uri=True)
            while not stop.is_set():
                n, missing = db.execute(
                    "SELECT COUNT(*), SUM(NOT EXISTS (SELECT 1 FROM embeddings e WHERE "
                    "e.text_hash = c.embed_hash)) FROM chunks c JOIN files f ON f.id = c.file_id "
                    "WHERE f.relpath = ?", (rel,)).fetchone()
                seen.append(n)
                if missing:
                    bare.append(missing)
            db.close()

        t = threading.Thread(target=watch_db)
        t.start()
        try:
            for i in range(5):
                with open(note, "a") as f:
                    f.write(f"\nA paragraph about the okapi{i} herd, new in this edit.\n")
                hits = find(d, f"okapi{i}")
                assert hits and hits[0]["path"] == str(note)
                # and at once, by meaning alone: its vector came with it
                hits = d.call("search", query=f"okapi{i} herd paragraph", k=3,
                              mode="vector")["results"]
                assert any(h["path"] == str(note) for h in hits)
        finally:
            stop.set()
            t.join()
        assert len(seen) > 100 and not bare, f"chunks without a vector seen {len(bare)} times"


def test_gc_deletes_only_unused_entries_after_the_grace_period(make_daemon, tmp_path):
    import json
    import sqlite3

    from conftest import ragctl
    root = tmp_path / "notes"
    root.mkdir()
    (root / "a.md").write_text("# A\n\nAardvarks dig burrows at night.\n")
    (root / "b.md").write_text("# B\n\nBonobos share their food.\n")
    d = make_daemon(sources=[{"name": "n", "path": str(root)}],
                    extra=engine_config(extra="[watch]\nquiet_ms = 50\n"))
    def entries():
        return db.execute("SELECT COUNT(*) FROM embeddings").fetchone()[0]

    def gc(*args):
        r = ragctl("--config", d.config, "--json", "gc", *args)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    with d:
        db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
        assert embedded(d) == 2 and entries() == 2
        b_text = (root / "b.md").read_text()
        (root / "b.md").unlink()
        assert gone(d, "bonobos")
        res = gc()  # within the grace period: marked, kept
        assert (res["deleted"], res["marked"], res["waiting"]) == (0, 1, 1) and entries() == 2
        (root / "b.md").write_text(b_text)  # undo: the cache answers, nothing is embedded
        assert find(d, "bonobos")
        assert embedded(d) == 2
        assert gc()["waiting"] == 0  # in use again: unmarked
        (root / "b.md").unlink()
        assert gone(d, "bonobos")
        gc()
        res = gc("--grace-hours", "0")
        assert res["deleted"] == 1 and res["bytes_freed"] > 384 * 4 and entries() == 1
        assert find(d, "aardvarks burrows", mode="vector")  # what is used stays
        r = ragctl("--config", d.config, "gc")
        assert r.returncode == 0 and "0 unused cache entries deleted" in r.stdout


def test_search_can_wait_for_its_own_edit_and_results_say_when_stale(make_daemon, tmp_path):
    import json

    from conftest import ragctl
    root = small_vault(tmp_path / "vault")
    # a 2 s quiet window: long enough to look at a result before the change is re-indexed
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config(extra="[watch]\nquiet_ms = 2000\n"))
    note = root / "How To" / "Set up custom statuses.md"
    with d:
        wait_embedded(d)
        hit = d.call("search", query="custom statuses", k=1, mode="bm25")["results"][0]
        assert hit["stale"] is False and hit["indexed_at"] > 0
        for i in range(3):  # save, then search at once: the reply includes the edit
            with open(note, "a") as f:
                f.write(f"\nA new line about the wombat{i} colony.\n")
            r = ragctl("--config", d.config, "--json", "search", f"wombat{i}", "--wait", "10")
            res = json.loads(r.stdout)
            assert res["waited"]["fresh"] is True
            assert res["results"] and res["results"][0]["path"] == str(note), res
            assert res["results"][0]["stale"] is False
        # changed on disk, not re-indexed yet (the change is still settling): results say so
        os.utime(note, ns=(1, 1))
        hit = d.call("search", query="wombat0", k=1, mode="bm25")["results"][0]
        assert hit["stale"] is True
        hit = d.call("search", query="wombat0", k=1, mode="bm25", wait=10)["results"][0]
        assert hit["stale"] is False
        with pytest.raises(DaemonError, match="between 0 and 60"):
            d.call("search", query="x", wait=100)


def test_search_wait_after_mkdir_and_move_shows_the_note_once(make_daemon, tmp_path):
    """`mkdir X && mv note X/`: the kernel reports the note leaving its folder before X is
    watched, and watchdog holds that event 0.5 s for a pair that never comes. search --wait
    answered with the note at both paths until the watcher waited that out."""
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}])
    with d:
        d.wait_idle()
        for i in range(3):
            note = next((root / "How To").glob("*.md"))
            with open(note, "a") as f:
                f.write(f"\nThe numbat{i} burrow.\n")
            d.call("search", query=f"numbat{i}", k=3, mode="bm25", wait=10)
            dest = root / f"Moved{i}"
            dest.mkdir()
            shutil.move(str(note), dest / note.name)
            res = d.call("search", query=f"numbat{i}", k=3, mode="bm25", wait=10)
            assert [r["path"] for r in res["results"]] == [str(dest / note.name)], res
            shutil.move(str(dest / note.name), note)


def test_event_stream_and_a_vanished_root_keeps_its_files(make_daemon, tmp_path):
    root = tmp_path / "notes"
    root.mkdir()
    for name in ("a", "b", "c"):
        (root / f"{name}.md").write_text(f"# {name}\n\nNote {name} about lemurs.\n")
    d = make_daemon(sources=[{"name": "n", "path": str(root)}],
                    extra='[embedding]\nmodel = ""\n[watch]\nquiet_ms = 50\n'
                          'unwatched_scan_interval = 1\n')
    with d:
        d.wait_idle()
        with d.client(timeout=20) as c:
            events = c.replies(c.send("events"))
            assert next(events)["result"]["event"] == "subscribed"

            def next_event(kind):
                while True:
                    e = next(events)["result"]
                    if e["event"] == kind:
                        return e

            (root / "new.md").write_text("# New\n\nFresh words.\n")
            e = next_event("indexed")
            assert e["path"] == str(root / "new.md") and e["chunks"] == 1 and e["source"] == "n"
            os.rename(root / "new.md", root / "moved.md")
            e = next_event("moved")
            assert e["path"] == str(root / "moved.md") and e["from_path"] == str(root / "new.md")
            os.remove(root / "moved.md")
            assert next_event("removed")["path"] == str(root / "moved.md")

            # the whole folder moves away (a renamed folder, an unmounted disk): the watcher
            # sees it (inotify follows the folder, silently), its files are kept and flagged
            os.rename(root, tmp_path / "away")
            e = next_event("error")
            assert "is missing; its files are kept" in e["message"]
        st = d.wait_idle()
        src = st["sources"][0]
        assert src["files"] == 3 and "is missing" in src["last_error"]
        assert src["watched"] is False and "is not there" in src["watch_error"]
        assert d.call("search", query="lemurs", k=5)["results"]
        r = ragctl("--config", d.config, "search", "lemurs")
        assert "(gone from disk since indexed)" in r.stdout, r.stdout
        # -l lists no file that is not there, as grep -l (`| xargs` would fail on it)
        r = ragctl("--config", d.config, "search", "-l", "lemurs")
        assert r.stdout == "" and "gone from disk since indexed: not listed" in r.stderr, \
            (r.stdout, r.stderr)
        r = ragctl("--config", d.config, "status")  # said once, not as a second error
        assert r.stdout.count("is not there") == 1 and "last error" not in r.stdout, r.stdout
        # an edit made meanwhile, in the folder where it went, is not taken for the source's
        (tmp_path / "away" / "a.md").write_text("# a\n\nNote a about tapirs now.\n")
        # time passing on purpose (the check is that nothing happens): two more looks at the
        # folder (every 1 s), and the edit in it is not taken, nor the folder said gone again
        time.sleep(2.5)
        assert d.call("search", query="tapirs", k=5, mode="bm25")["results"] == []
        os.rename(tmp_path / "away", root)
        deadline = time.monotonic() + 15
        while not (src := d.call("status")["sources"][0])["watched"]:
            assert time.monotonic() < deadline, src
            time.sleep(0.1)
        assert find(d, "tapirs")  # the scan on its return read the edit
        (root / "d.md").write_text("# d\n\nNote d about okapis.\n")
        assert find(d, "okapis", timeout=5)
        st = d.wait_idle()
        assert st["sources"][0]["files"] == 4 and st["sources"][0]["last_error"] is None
        assert st["totals"]["files_removed"] == 1  # only moved.md, ever
    log = d.log.read_text()
    assert log.count("is not there (moved") == 1 and log.count("is missing; its files are kept") == 1


def test_an_edit_in_a_folder_moved_away_removes_nothing(make_daemon, tmp_path):
    """Before the watcher sees that a source's folder went away (it looks every 30 s), inotify
    still reports what happens in it, under the old path: the file is not there, but that is no
    sign it is gone (a fresh-user walk lost a note so). Kept; the scan says why."""
    root = tmp_path / "notes"
    root.mkdir()
    for name in ("a", "b"):
        (root / f"{name}.md").write_text(f"# {name}\n\nNote {name} about lemurs.\n")
    d = make_daemon(sources=[{"name": "n", "path": str(root)}],
                    extra='[embedding]\nmodel = ""\n[watch]\nquiet_ms = 50\n'
                          'unwatched_scan_interval = 10\n')
    with d:
        d.wait_idle()
        away = tmp_path / "away"
        os.rename(root, away)
        (away / "a.md").write_text("# a\n\nNote a about tapirs now.\n")
        os.remove(away / "b.md")
        deadline = time.monotonic() + 10
        while not (src := d.call("status")["sources"][0])["last_error"]:
            assert time.monotonic() < deadline, src  # the events' scan found the folder gone
            time.sleep(0.05)
        st = d.wait_idle()
        assert "is missing" in st["sources"][0]["last_error"]
        assert st["sources"][0]["files"] == 2 and st["totals"]["files_removed"] == 0
        assert len(d.call("search", query="lemurs", k=5, mode="bm25")["results"]) == 2
        # Back before the watcher's next look (every 10 s here): what was done while it was
        # away is indexed all the same. Its events made the watcher look at once, see the
        # folder gone, and so scan it when it came back (before, nothing did until the
        # 10-minute scan).
        os.rename(away, root)
        assert find(d, "tapirs", timeout=20)
        st = d.wait_idle()
        assert st["sources"][0]["files"] == 1 and st["sources"][0]["last_error"] is None


def test_a_folder_moved_away_and_back_is_taken_up_within_seconds(make_daemon, tmp_path):
    """`mv Docs Docs-away`, a note written there, `mv Docs-away Docs`: seen gone at once (its
    events come from a folder not there), and back within seconds, the note written meanwhile
    indexed (a fresh-user walk: it waited for the next look, every 30 s by default)."""
    root = tmp_path / "Docs"
    root.mkdir()
    for name in ("a", "b"):
        (root / f"{name}.md").write_text(f"# {name}\n\nNote {name} about lemurs.\n")
    d = make_daemon(sources=[{"name": "n", "path": str(root)}])  # the default intervals
    with d:
        d.wait_idle()
        away = tmp_path / "Docs-away"
        os.rename(root, away)
        (away / "new.md").write_text("# New\n\nNewfile zappowidget.\n")
        deadline = time.monotonic() + 10
        while d.call("status")["sources"][0]["watched"]:
            assert time.monotonic() < deadline, "the folder moved away was not seen gone"
            time.sleep(0.05)
        os.rename(away, root)
        assert find(d, "zappowidget", timeout=8)
        st = d.wait_idle()
        assert st["sources"][0]["watched"] and st["sources"][0]["files"] == 3, st["sources"]
        (root / "c.md").write_text("# c\n\nNote c about okapis.\n")
        assert find(d, "okapis", timeout=5)  # watched again


def test_a_folder_moved_away_is_flagged_within_seconds_without_an_event(make_daemon, tmp_path):
    """`mv ~/Docs ~/Docs.away` and nothing written after: status said 'watched' and search
    showed paths under ~/Docs for up to 30 s (the next look, unwatched_scan_interval; a
    fresh-user walk saw 20 s). Each source's folder is looked up every second."""
    root = tmp_path / "Docs"
    root.mkdir()
    (root / "a.md").write_text("# a\n\nNote a about lemurs.\n")
    d = make_daemon(sources=[{"name": "n", "path": str(root)}],
                    extra='[embedding]\nmodel = ""\n')  # the default intervals
    with d:
        d.wait_idle()
        os.rename(root, tmp_path / "Docs.away")
        deadline = time.monotonic() + 5
        while d.call("status")["sources"][0]["watched"]:
            assert time.monotonic() < deadline, "the folder moved away was not seen gone"
            time.sleep(0.05)
        r = ragctl("--config", d.config, "search", "lemurs")
        assert "(gone from disk since indexed)" in r.stdout, r.stdout


def test_a_source_whose_folder_is_not_there_yet_is_watched_once_it_is(make_daemon, tmp_path):
    """A vault on a disk not mounted at login: the daemon starts anyway, serves the other
    sources, reports this one, and takes it up once the folder exists."""
    here, later = tmp_path / "here", tmp_path / "disk" / "vault"
    here.mkdir()
    (here / "a.md").write_text("# A\n\nNote about lemurs.\n")
    d = make_daemon(sources=[{"name": "here", "path": str(here)},
                             {"name": "disk", "path": str(later)}],
                    extra='[embedding]\nmodel = ""\n[watch]\nunwatched_scan_interval = 1\n')
    with d:
        st = d.wait_idle()
        disk = next(s for s in st["sources"] if s["name"] == "disk")
        assert disk["watched"] is False and "is not there" in disk["watch_error"]
        assert disk["files"] == 0 and "is missing" in disk["last_error"]
        assert d.call("search", query="lemurs", k=5)["results"]
        later.mkdir(parents=True)
        (later / "b.md").write_text("# B\n\nNote about okapis.\n")
        hit = find(d, "okapis")
        assert hit and hit[0]["source"] == "disk"
        (later / "c.md").write_text("# C\n\nNote about tapirs.\n")
        assert find(d, "tapirs", timeout=5)
        disk = next(s for s in d.call("status")["sources"] if s["name"] == "disk")
        assert disk["watched"] is True and disk["last_error"] is None
        # another folder put in its place (restored, cloned again): what it holds is the source
        os.rename(later, tmp_path / "disk" / "old")
        later.mkdir()
        (later / "w.md").write_text("# W\n\nNote about wombats.\n")
        assert find(d, "wombats", timeout=10) and gone(d, "okapis", timeout=10)
        (later / "x.md").write_text("# X\n\nNote about quolls.\n")
        assert find(d, "quolls", timeout=5)
    log = d.log.read_text()
    assert "Traceback" not in log and log.count("watching it afresh") in (2, 3)


def converge(d, files: int, timeout: float = 60.0) -> dict:
    """Wait until the one source holds `files` indexed files and nothing is pending."""
    deadline = time.monotonic() + timeout
    while True:
        st = d.call("status")
        if st["sources"][0]["files"] == files and st["idle"]:
            return st
        if time.monotonic() > deadline:
            log = d.log.read_text(errors="replace")
            lines = [ln for ln in log.splitlines() if "WARNING" in ln or "ERROR" in ln]
            pytest.fail(f"{st['sources'][0]['files']} files indexed, want {files}; pending "
                        f"{st['pending']}; totals {st['totals']}; warnings:\n"
                        + "\n".join(lines[-20:]))
        time.sleep(0.1)


def storm(root, n: int, start: int = 0) -> None:
    for i in range(start, start + n):  # like a sync tool dumping a folder, or a git checkout
        sub = root / f"dump{i % 10}"
        sub.mkdir(exist_ok=True)
        (sub / f"n{i}.md").write_text(f"# Note {i}\n\nStorm word tok{i}x here.\n")


def seeded(make_daemon, tmp_path):
    """A folder with one note, and a BM25-only daemon over it (not started)."""
    root = tmp_path / "notes"
    root.mkdir()
    (root / "seed.md").write_text("# Seed\n\nA first note.\n")
    return root, make_daemon(sources=[{"name": "n", "path": str(root)}],
                             extra='[embedding]\nmodel = ""\n')


def test_a_1000_file_storm_converges_with_nothing_lost(make_daemon, tmp_path):
    root, d = seeded(make_daemon, tmp_path)
    with d:
        d.wait_idle()
        storm(root, 1000)
        deadline = time.monotonic() + 30
        while True:  # while it settles, status shows a lag
            st = d.call("status")
            if st["sources"][0]["lag_s"] > 0:
                break
            assert not (st["idle"] and st["pending"] == 0), "settled without showing a lag"
            assert time.monotonic() < deadline
        st = converge(d, 1001)
        assert st["sources"][0]["lag_s"] == 0.0
        for i in (0, 1, 499, 998, 999):
            hits = d.call("search", query=f"tok{i}x", k=1, mode="bm25")["results"]
            assert hits and hits[0]["path"].endswith(f"n{i}.md")
        # and a storm of deletions
        for i in range(0, 1000, 2):
            (root / f"dump{i % 10}" / f"n{i}.md").unlink()
        converge(d, 501)


@contextlib.contextmanager
def sysctl(name: str, value: int):
    """Set a kernel setting for the duration (machine-wide: root only, and briefly)."""
    path = Path("/proc/sys") / name.replace(".", "/")
    try:
        old = path.read_text()
        path.write_text(str(value))
    except OSError as e:
        pytest.skip(f"cannot set {name} here: {e}")
    try:
        yield
    finally:
        path.write_text(old)


def test_inotify_queue_overflow_is_heard_and_reconciled(make_daemon, tmp_path):
    root, d = seeded(make_daemon, tmp_path)
    with sysctl("fs.inotify.max_queued_events", 16):  # read when the inotify instance is made
        d.start()
        d.wait_idle()
        assert d.call("status")["sources"][0]["watched"]
    storm(root, 300)  # ~900 events into a queue of 16: the kernel drops most
    st = converge(d, 301)
    assert st["totals"]["watch_overflows"] >= 1
    assert "inotify queue overflowed" in d.log.read_text()


@pytest.mark.parametrize("headroom", [10, 0], ids=["some-folders", "no-folder"])
def test_the_inotify_watch_limit_is_reported_and_scans_take_over(make_daemon, tmp_path,
                                                                 headroom):
    root = tmp_path / "notes"
    for i in range(40):
        (root / f"f{i}" / "deep").mkdir(parents=True)
    (root / "seed.md").write_text("# Seed\n\nA first note.\n")
    d = make_daemon(sources=[{"name": "n", "path": str(root)}],
                    extra='[embedding]\nmodel = ""\n[watch]\nunwatched_scan_interval = 1.0\n')
    # the limit stays low throughout, so the new folder below cannot be watched either
    # headroom 10: some folders get a watch; 0: not even the source's own folder
    with sysctl("fs.inotify.max_user_watches", _watches_in_use() + headroom):
        d.start()
        deadline = time.monotonic() + 15
        # (until the watcher has tried: before, a source is neither watched nor in error)
        while ((src := d.call("status")["sources"][0])["watched"]
               or not src["watch_error"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not src["watched"]
        assert "fs.inotify.max_user_watches" in src["watch_error"]
        assert "sudo sysctl" in src["watch_error"]
        d.wait_idle()
        (root / "new" / "deeper").mkdir(parents=True)
        (root / "new" / "deeper" / "late.md").write_text("# Late\n\nA quokkaphrase arrives.\n")
        hits = find(d, "quokkaphrase", timeout=20)  # found by the frequent scans
        assert hits and hits[0]["path"].endswith("new/deeper/late.md")
    # the limit is raised again: the source is watched afresh, without a restart
    deadline = time.monotonic() + 20
    while not (src := d.call("status")["sources"][0])["watched"] and \
            time.monotonic() < deadline:
        time.sleep(0.2)
    assert src["watched"] and src["watch_error"] is None
    assert "watching it afresh" in d.log.read_text()


def _watches_in_use() -> int:
    """inotify watches held by all processes visible here (the limit is per user)."""
    n = 0
    for fdinfo in Path("/proc").glob("[0-9]*/fdinfo/*"):
        try:
            n += fdinfo.read_text().count("inotify wd:")
        except OSError:
            pass
    return n


def test_kill_9_during_the_initial_embedding_converges(make_daemon, tmp_path):
    import signal
    import sqlite3

    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    d.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        e = d.call("status")["engines"]["embedding"]
        if e.get("vectors", 0) >= 30:
            break
        time.sleep(0.05)
    first = e["embedded_texts"]
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)
    db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
    assert db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0] == \
        db.execute("SELECT COUNT(*) FROM chunks_fts").fetchone()[0]
    with d:
        st = wait_embedded(d)
        second = st["engines"]["embedding"]["embedded_texts"]
        distinct = db.execute("SELECT COUNT(DISTINCT embed_hash) FROM chunks").fetchone()[0]
        assert db.execute("SELECT COUNT(*) FROM embeddings").fetchone()[0] == distinct
        assert st["engines"]["embedding"]["vectors"] == st["sources"][0]["chunks"]
        # embedded in both runs: every distinct text once, plus what was in flight at the kill
        # (one batch of <= 1024 tokens; and what was embedded after the last status we read)
        assert distinct <= first + second <= distinct + 2 * 8, (first, second, distinct)


def test_a_folder_moved_back_and_forth_never_leaves_search(make_daemon, tmp_path):
    """Every search during a move sees the notes, at the old path or the new one: the move is
    one commit, a search reads one state of the index, and a folder's move told twice (the
    folder's event and its files') is applied once."""
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    with d:
        wait_embedded(d)
        a, b = root / "Other Plugins", root / "Plugins elsewhere"
        empty = []
        for i in range(10):
            shutil.move(str(a), str(b))
            a, b = b, a
            t0 = time.monotonic()
            while time.monotonic() - t0 < 1.2:
                if not d.call("search", query="QuickAdd", k=5, mode="bm25")["results"]:
                    empty.append((i, round(time.monotonic() - t0, 3)))
                time.sleep(0.01)
        assert not empty, f"searches that found nothing (move, seconds after it): {empty}"
        hits = find(d, "QuickAdd")
        deadline = time.monotonic() + 10
        while not all(str(a) in h["path"] for h in hits) and time.monotonic() < deadline:
            time.sleep(0.05)
            hits = find(d, "QuickAdd")
        assert hits and all(str(a) in h["path"] for h in hits)
        st = wait_embedded(d)
        assert st["engines"]["embedding"]["embedded_texts"] == st["engines"]["embedding"]["vectors"]


def test_a_watcher_gone_frees_its_connection_without_waiting_for_an_event(make_daemon, tmp_path):
    """`ragctl watch` stopped with Ctrl-C on a quiet vault kept its connection (a slot of
    daemon.max_connections, and a thread) until the next event found it gone; a few of them
    and ragd refused every client. The stream now looks for its client each quiet second."""
    root = tmp_path / "notes"
    root.mkdir()
    (root / "a.md").write_text("# a\n\nA note about lemurs.\n")
    d = make_daemon(sources=[{"name": "n", "path": str(root)}],
                    extra='[embedding]\nmodel = ""\n')
    d.config.write_text(d.config.read_text().replace(  # (its [daemon] table)
        'log_level = "debug"', 'log_level = "debug"\nmax_connections = 2'))
    with d:
        d.wait_idle()
        def soon(fn):  # (a slot is freed once its connection's thread has seen it go)
            deadline = time.monotonic() + 10
            while True:
                try:
                    return fn()
                except (DaemonError, ProtocolError) as e:  # refused: "too many connections"
                    assert time.monotonic() < deadline, e
                    time.sleep(0.2)

        def watch_then_go():
            with d.client(timeout=20) as c:
                assert next(c.replies(c.send("events")))["result"]["event"] == "subscribed"

        def two_clients():
            with d.client(timeout=5) as c1, d.client(timeout=5) as c2:
                assert c1.call("ping")["pid"] == c2.call("ping")["pid"] == d.proc.pid

        for _ in range(3):  # more watchers than slots, one after the other
            soon(watch_then_go)
            soon(two_clients)  # both slots free again: the watcher's too


def test_ragctl_watch_prints_one_line_per_event_whatever_the_name(make_daemon, tmp_path):
    """A file name holding a newline or a right-to-left override is printed escaped by
    `ragctl watch`, as `search -l` and `files` print it (a fresh-user walk saw an event split
    over two lines, and the override printed as is)."""
    import subprocess
    import sys

    root = tmp_path / "notes"
    root.mkdir()
    (root / "a.md").write_text("# a\n\nA note about lemurs.\n")
    d = make_daemon(sources=[{"name": "n", "path": str(root)}],
                    extra='[embedding]\nmodel = ""\n')
    watch = None
    try:
        with d:
            d.wait_idle()
            watch = subprocess.Popen([sys.executable, "-m", "ragctl", "--config", str(d.config),
                                      "watch"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
            time.sleep(1)  # (subscribed)
            (root / "line\nbreak.md").write_text("# b\n\nNewts.\n")
            (root / "evil\u202etxt.md").write_text("# c\n\nVoles.\n")
            d.wait_idle()
            time.sleep(0.5)
        # ragd stopped: the last line says so, exit 0 (it said "lost the connection", exit 1)
        out, err = watch.communicate(timeout=10)
    finally:
        if watch is not None and watch.poll() is None:
            watch.kill()
    assert watch.returncode == 0 and err == "", err
    assert out.splitlines()[-1].endswith(" stopped    ragd stopped"), out
    assert out.splitlines()[0].endswith(" subscribed"), out  # (no padding after the word)
    indexed = [ln for ln in out.splitlines() if " indexed " in ln]
    assert any(ln.endswith("line\\nbreak.md chunks=1") for ln in indexed), out
    assert any("evil\\u202etxt.md" in ln for ln in indexed), out
    assert "\u202e" not in out


def test_a_large_note_does_not_hold_up_the_small_ones_saved_after_it(make_daemon, tmp_path):
    """A note over loader.SLOW_BYTES (here a 3 MB export on one line) is read and chunked on
    the slow lane, as a PDF is: a small note saved just after it is indexed first, and the
    large one is indexed whole after it. (On the main lane, a 5 MB one-line note held a small
    note back 14 s.)"""
    from ragd.ingest import loader
    root = tmp_path / "notes"
    root.mkdir()
    (root / "a.md").write_text("# a\n\nA note about lemurs.\n")
    d = make_daemon(sources=[{"name": "n", "path": str(root)}],
                    extra='[embedding]\nmodel = ""\n[watch]\nquiet_ms = 50\n')
    words = [f"quokka{i % 5000}" for i in range(330_000)]
    big = "# Export\n\n" + " ".join(words) + "\n"
    assert len(big) > 3 * loader.SLOW_BYTES
    with d:
        d.wait_idle()
        with d.client(timeout=60) as c:
            events = c.replies(c.send("events"))
            assert next(events)["result"]["event"] == "subscribed"
            (root / "export.md").write_text(big)
            (root / "small.md").write_text("# Small\n\nA note about wombats.\n")
            order = []
            while len(order) < 2:
                e = next(events)["result"]
                if e["event"] == "indexed":
                    order.append((Path(e["path"]).name, e["chunks"]))
        assert order[0] == ("small.md", 1), order
        assert order[1][0] == "export.md" and order[1][1] > 100, order
        res = d.call("search", query="quokka4999", mode="bm25", k=3)
        assert [Path(r["path"]).name for r in res["results"]] == ["export.md"], res
