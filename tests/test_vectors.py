"""Where vectors live: the exact matrix, the HNSW graph past a size, and their snapshots —
with real MiniLM vectors, and through the real daemon."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import bulk_embedding_stopped, engine_config, small_vault, wait_embedded
from ragd.index.ann import AnnIndex
from ragd.index.vectors import VectorIndex
from ragd.index.vectorstore import RESCORED, VectorStore


def real_vectors(tmp_path, make_daemon):
    root = small_vault(tmp_path / "v")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    with d:
        wait_embedded(d)
    db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
    rows = db.execute("SELECT c.id, c.file_id, e.vector FROM chunks c JOIN embeddings e ON "
                      "e.text_hash = c.embed_hash").fetchall()
    return (np.array([r[0] for r in rows]), np.array([r[1] for r in rows]),
            np.vstack([np.frombuffer(r[2], dtype="<f4") for r in rows]))


@pytest.mark.parametrize("dtype", ["f16", "i8"])
def test_the_graph_answers_like_the_matrix_and_follows_edits(tmp_path, make_daemon, dtype):
    """The graph, float16 or int8 (the default: then a search's candidates are ranked again
    by their float32 vectors from the embedding cache, VectorStore.rescore), answers as the
    exact matrix does."""
    ids, files, vecs = real_vectors(tmp_path, make_daemon)
    db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
    space_id = int(db.execute("SELECT value FROM meta WHERE key = 'active_space'").fetchone()[0])
    exact = VectorIndex(vecs.shape[1])
    exact.add(ids.tolist(), vecs, files.tolist())
    ann = AnnIndex.from_rows(vecs.shape[1], space_id, ids, files, vecs, dtype=dtype)
    assert ann.approximate == (dtype == "i8")
    space = SimpleNamespace(id=space_id, vectors=ann)

    def search(q, k, only=None):  # as the searcher asks it (hybrid._dense)
        return VectorStore.rescore(db, space, q, *ann.search(q, max(k, 100) if
                                                             ann.approximate else k, only))

    assert len(ann) == len(exact) == len(ids)
    hits = 0
    for q in vecs[::7]:  # each chunk's own vector as a query
        a, sa = search(q, 10)
        e, se = exact.search(q, 10)
        hits += len(set(a[:10].tolist()) & set(e.tolist()))
        assert np.allclose(sa[:3], se[:3], atol=2e-3)
    assert hits / (10 * len(vecs[::7])) >= 0.98
    # the vectors one rescoring read serve the next of the same search (dense feedback's): the
    # same answer, and only the chunks not read before are looked up
    known: dict = {}
    for q in (vecs[3], vecs[3] + 0.2 * vecs[4], vecs[5]):
        found = ann.search(q, 100 if ann.approximate else 10)
        before = set(known)
        sql: list[str] = []
        db.set_trace_callback(sql.append)
        got = VectorStore.rescore(db, space, q, *found, known=known)
        db.set_trace_callback(None)
        fresh = VectorStore.rescore(db, space, q, *found)
        assert got[0].tolist() == fresh[0].tolist() and np.allclose(got[1], fresh[1])
        looked_up = {int(x) for s in sql for x in re.findall(r"\d+", s.split(" IN (")[1])}
        head = set(found[0][:RESCORED].tolist())
        assert looked_up == (head - before if ann.approximate else set())
        assert head <= set(known) or not ann.approximate
    # filters: a few files, ranked exactly; every result in them
    some = np.unique(files)[:2]
    a, sa = search(vecs[0], 5, some)
    e, se = exact.search(vecs[0], 5, some)
    assert a[:5].tolist() == e.tolist() and np.allclose(sa[:5], se, atol=2e-3)
    # removal is real; a replaced row takes its new vector; get and nearest_to_any
    gone = ids[:10].tolist()
    assert ann.remove(gone) == 10 and not any(g in ann for g in gone)
    assert not set(ann.search(vecs[0], 50)[0].tolist()) & set(gone)
    ann.add([int(ids[20])], vecs[21:22], [int(files[21])])
    found, got = ann.get([int(ids[20])])
    assert found == [int(ids[20])] and np.dot(got[0], vecs[21]) > (0.999 if dtype == "f16"
                                                                    else 0.99)
    near = ann.nearest_to_any(vecs[30:33], 5, exclude_files=[int(files[30])])
    assert near and all(f != int(files[30]) for _, f, _, _ in near)
    # saved and loaded: the same answers
    ann.save(tmp_path / "g.usearch")
    k_ids, k_files, _ = ann.export_keys()
    back = AnnIndex.load(tmp_path / "g.usearch", vecs.shape[1], 1, k_ids, k_files, dtype)
    assert len(back) == len(ann)
    assert back.search(vecs[40], 5)[0].tolist() == ann.search(vecs[40], 5)[0].tolist()
    # the loaded graph is mapped from its file and cannot change (usearch crashes on a
    # removal from a mapped graph): edits go beside it, and answers follow them
    assert back._base is not None
    for g in (ann, back):
        g.remove(ids[50:60].tolist())  # removed
        g.add(ids[60:70].tolist(), vecs[70:80], files[70:80].tolist())  # replaced
        g.add(ids[60:62].tolist(), vecs[80:82], files[80:82].tolist())  # replaced twice
    assert len(back) == len(ann) and ids[55] not in back and ids[65] in back
    for q in (vecs[75], vecs[81], vecs[55], vecs[3]):
        a, b = ann.search(q, 10), back.search(q, 10)
        assert a[0].tolist() == b[0].tolist() and np.allclose(a[1], b[1], atol=1e-5)
        assert not set(b[0].tolist()) & set(ids[50:60].tolist())
    def top(g, q):  # the chunks of the best cosine (others may hold the same text)
        found, sims = g.search(q, 10)
        return set(found[sims >= sims[0] - 1e-3].tolist())

    assert int(ids[61]) in top(back, vecs[81]) and int(ids[61]) not in top(back, vecs[61])
    assert back.get([int(ids[61]), int(ids[0]), int(ids[90])])[0] == [int(ids[61]),
                                                                       int(ids[90])]
    assert np.allclose(back.get([int(ids[61])])[1], ann.get([int(ids[61])])[1], atol=1e-6)
    some = np.unique(files)[3:5]  # a filter, and the graph path of a filter too
    assert back.search(vecs[90], 5, some)[0].tolist() == ann.search(vecs[90], 5, some)[0].tolist()
    assert back.nearest_to_any(vecs[70:72], 5) == ann.nearest_to_any(vecs[70:72], 5)
    # saved: merged into a new file, mapped in turn; the same answers
    back.save(tmp_path / "g2.usearch")
    k_ids, k_files, _ = back.export_keys()
    again = AnnIndex.load(tmp_path / "g2.usearch", vecs.shape[1], 1, k_ids, k_files, dtype)
    assert len(again) == len(ann) and not again._dead and not len(again._ix)
    for q in (vecs[75], vecs[81], vecs[3]):  # (a graph built otherwise: ties may swap)
        (a, sa), (b, sb) = again.search(q, 10), ann.search(q, 10)
        assert np.allclose(sa, sb, atol=1e-3) and len(set(a.tolist()) & set(b.tolist())) >= 9
    assert int(ids[61]) in top(again, vecs[81])
    # nearly every chunk replaced by one of a new id (every file read again), then saved: the
    # graph in memory takes the few rows the file still holds (VectorStore.snapshot)
    every = AnnIndex.load(tmp_path / "g2.usearch", vecs.shape[1], 1, k_ids, k_files, dtype)
    old_ids = [int(i) for i in k_ids[5:]]
    found, got = every.get(old_ids)
    every.remove(old_ids)
    new_ids = [c + 10**6 for c in found]
    every.add(new_ids, got, [0] * len(found))
    every.save(tmp_path / "g3.usearch")
    n_ids, n_files, _ = every.export_keys()
    assert sorted(n_ids.tolist()) == sorted([int(i) for i in k_ids[:5]] + new_ids)
    third = AnnIndex.load(tmp_path / "g3.usearch", vecs.shape[1], 1, n_ids, n_files, dtype)
    assert len(third) == len(k_ids) and not third._dead and not len(third._ix)
    exact = VectorIndex(vecs.shape[1])
    f2, g2 = third.get(n_ids.tolist())
    assert f2 == n_ids.tolist()
    exact.add(f2, g2, [0] * len(f2))
    for q in (vecs[3], vecs[75], vecs[1]):  # (int8 cosines: about ±0.005)
        (a, sa), (e, se) = third.search(q, 10), exact.search(q, 10)
        assert np.allclose(sa, se, atol=1e-2 if third.approximate else 2e-3)
        assert len(set(a.tolist()) & set(e.tolist())) >= 9
    # most of the mapped graph removed (a source removed): what is left, exactly
    left = [int(i) for i in k_ids[:25]]
    again.remove([int(i) for i in k_ids[25:]])
    assert again._dead and len(again) == 25
    rest = VectorIndex(vecs.shape[1])
    found, got = ann.get(left)
    rest.add(found, got, [0] * len(found))
    for q in (vecs[3], vecs[200 % len(vecs)]):
        (a, sa), (e, se) = again.search(q, 5), rest.search(q, 5)
        assert np.allclose(sa, se, atol=2e-3) and set(a.tolist()) <= set(left)


def test_the_daemon_moves_to_a_graph_past_its_threshold_and_restarts_from_snapshots(
        make_daemon, tmp_path):
    root = small_vault(tmp_path / "v")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config(extra="ann_threshold = 50\n"))
    log = tmp_path / "data" / "ragd.log"
    with d:
        st = wait_embedded(d)
        n = st["engines"]["embedding"]["vectors"]
        deadline = time.monotonic() + 60
        while "searched through an HNSW graph" not in log.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        res = d.call("search", query="a kanban board of cards in lanes", mode="vector", k=3)
        assert res["results"][0]["path"].endswith("Kanban Plugin.md")
        note = root / "Fresh.md"
        note.write_text("# Fresh\n\nA note about sourdough starters and rye flour.\n")
        hits = d.call("search", query="baking bread with a sourdough starter", mode="vector",
                      k=1, wait=20)["results"]
        assert hits[0]["path"] == str(note)  # an edit reaches the graph, no rebuild
        assert d.call("status")["engines"]["embedding"]["vectors"] == n + 1
    text = log.read_text()
    assert text.count("searched through an HNSW graph") == 1
    with d:  # restart: the saved graph, nothing read back from the cache, nothing embedded
        st = wait_embedded(d)
        assert st["engines"]["embedding"]["vectors"] == n + 1
        assert st["engines"]["embedding"]["embedded_texts"] == 0
        assert "all from the saved graph (no chunk changed since it was taken)" in \
            log.read_text()
        hits = d.call("search", query="baking bread with a sourdough starter", mode="vector",
                      k=1)["results"]
        assert hits[0]["path"] == str(note)
    assert log.read_text().count("searched through an HNSW graph") == 1  # not rebuilt
    sources = [{"name": "v", "path": str(root), "kind": "obsidian"}]
    # the threshold raised past the space's size: the setting holds at the next start (its
    # saved graph was searched whatever the setting said), nothing embedded again
    d = make_daemon(sources=sources, extra=engine_config(extra="ann_threshold = 100000\n"))
    with d:
        emb = wait_embedded(d)["engines"]["embedding"]
        assert (emb["vector_index"], emb["vectors"], emb["embedded_texts"]) == ("exact", n + 1, 0)
        hits = d.call("search", query="baking bread with a sourdough starter", mode="vector",
                      k=1)["results"]
        assert hits[0]["path"] == str(note)
    assert "under ann_threshold (100000): searched exactly" in log.read_text()
    # and lowered again: the graph is built at the start, with no change to wait for
    d = make_daemon(sources=sources, extra=engine_config(extra="ann_threshold = 50\n"))
    with d:
        wait_embedded(d)
        deadline = time.monotonic() + 60
        while log.read_text().count("searched through an HNSW graph") < 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert d.call("status")["engines"]["embedding"]["vector_index"] == "hnsw"


def test_a_graph_whose_chunks_all_changed_is_saved_once_they_settle(make_daemon, tmp_path):
    """Every file read again and every chunk rewritten (a parser upgrade that changes every
    chunk's keywords: new chunk ids, each vector from the cache, nothing to embed): the graph
    is saved whole once the changes have settled, not only at a
    stop, which could not write it in time at 100k chunks: every start after it built the
    graph again from the cache (6 minutes at 1M). Here the daemon is killed, so no stop
    saves it. (A third of the graph or more changed: written whole, not listed beside it.)"""
    root = small_vault(tmp_path / "v")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config(extra="ann_threshold = 50\n"))
    log = tmp_path / "data" / "ragd.log"
    with d:
        n = wait_embedded(d)["engines"]["embedding"]["vectors"]
        deadline = time.monotonic() + 60
        while "searched through an HNSW graph" not in log.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.1)
    graph = next((tmp_path / "data" / "vectors").glob("*.graph.usearch"))
    saved = graph.stat().st_mtime_ns
    db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
    reading = json.loads(db.execute("SELECT value FROM meta WHERE key = 'reading'").fetchone()[0])
    for how in reading.values():
        how["parser"] = -1  # read by another parser: every file is read again
    with db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'reading'", (json.dumps(reading),))
        # ... and its chunks come out otherwise (a file whose chunks come out as stored keeps
        # its rows): their texts, and so their vectors, as before
        db.execute("UPDATE chunks SET keywords = keywords || ' by-the-old-parser'")
    ids = {r[0] for r in db.execute("SELECT id FROM chunks")}
    d.start()
    try:
        st = wait_embedded(d)
        assert st["engines"]["embedding"]["embedded_texts"] == 0
        assert not ids & {r[0] for r in db.execute("SELECT id FROM chunks")}  # all new ids
        deadline = time.monotonic() + 120  # (QUIET_BEFORE_GRAPH, then the embedder's look)
        while graph.stat().st_mtime_ns == saved:
            assert time.monotonic() < deadline, "the changed graph was not saved"
            time.sleep(0.5)
        time.sleep(1)  # (the snapshot's key lists are written after the graph)
    finally:
        d.kill()
    at = len(log.read_text())
    with d:
        st = wait_embedded(d)
        assert (st["engines"]["embedding"]["vectors"], st["engines"]["embedding"]
                ["embedded_texts"]) == (n, 0)
        assert "all from the saved graph (no chunk changed since it was taken)" in \
            log.read_text()[at:]
        hits = d.call("search", query="a kanban board of cards in lanes", mode="vector", k=3)
        assert hits["results"][0]["path"].endswith("Kanban Plugin.md")


def embedded_once(make_daemon, tmp_path):
    """A daemon over the small vault, run once until every chunk has its vector and stopped:
    (the daemon, its root, its log, the vector count)."""
    root = small_vault(tmp_path / "v")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    with d:
        n = wait_embedded(d)["engines"]["embedding"]["vectors"]
    return d, root, tmp_path / "data" / "ragd.log", n


def test_a_restart_loads_the_matrix_snapshot(make_daemon, tmp_path):
    d, root, _, n = embedded_once(make_daemon, tmp_path)
    (root / "How To" / "Set up custom statuses.md").unlink()  # changed while ragd was down
    with d:
        st = wait_embedded(d)
        text = (tmp_path / "data" / "ragd.log").read_text()
        # (read before or after the scan drops the note's chunks: checked then, or not needed)
        assert "from the snapshot, 0 from the cache" in text or \
            "all from the snapshot (no chunk changed since it was taken)" in text
        assert st["engines"]["embedding"]["vectors"] == st["sources"][0]["chunks"] < n
        assert st["engines"]["embedding"]["vector_index"] == "exact"


def test_vectors_read_from_the_cache_are_snapshotted(make_daemon, tmp_path):
    """No snapshot on disk (an upgrade, a deleted folder): the vectors are read from the cache
    once, and the stop writes the snapshot, so the next start reads nothing back."""
    d, _, log, n = embedded_once(make_daemon, tmp_path)
    shutil.rmtree(tmp_path / "data" / "vectors")
    with d:
        wait_embedded(d)
        assert f"{n} vectors read from the cache" in log.read_text()
    assert any((tmp_path / "data" / "vectors").iterdir())
    with d:
        st = wait_embedded(d)
        assert st["engines"]["embedding"]["vectors"] == n
        assert log.read_text().count("all from the snapshot (no chunk changed since it was "
                                     "taken)") == 1


def test_a_snapshot_checked_whole_is_trusted_at_the_next_start(make_daemon, tmp_path):
    """A snapshot without its state (a stop that ran out of time, an older ragd) is checked
    against the chunks, a pass over all of them (seconds at 1M chunks). Found whole, its state
    is written then: the start after it, even after a kill, loads it as it is."""
    d, _, log, n = embedded_once(make_daemon, tmp_path)
    for meta in (tmp_path / "data" / "vectors").glob("space-*.meta.json"):
        meta.unlink()
    with d:
        wait_embedded(d)
        assert f"{n} from the snapshot, 0 from the cache" in log.read_text()
        d.kill()
    with d:
        assert wait_embedded(d)["engines"]["embedding"]["vectors"] == n
        assert log.read_text().count("all from the snapshot (no chunk changed since it was "
                                     "taken)") == 1


def test_changes_of_a_file_written_twice_in_one_transaction_add_only_its_last_chunks(tmp_path):
    """The vectors mirror a transaction's Changes: every removed id dropped, then every added
    one taken. A file written twice in one batch (a folder's move told twice) added the ids of
    its first write too, and the vectors kept rows for chunks that no longer existed."""
    from ragd.index import store

    db = store.open_store(tmp_path / "index.db")

    def records(words):
        return [store.ChunkRecord(i, "Note", i + 1, i + 1, w, f"t{w}", f"e{w}", body=w)
                for i, w in enumerate(words)]

    store.begin(db)
    store.put_file(db, "v", "a.md", 1, 1, "h0", "indexed", None, records(["one", "two"]))
    store.put_file(db, "v", "b.md", 1, 1, "h1", "indexed", None, records(["six"]))
    db.execute("COMMIT")
    first = [r[0] for r in db.execute("SELECT id FROM chunks")]

    changes = store.Changes()
    store.begin(db)
    for words in (["one", "two", "three"], ["one", "two", "four"]):
        mine = store.Changes()
        store.put_file(db, "v", "a.md", 2, 2, "h2", "indexed", None, records(words), mine)
        # another file between them: the second write cannot take the first one's ids again
        store.put_file(db, "v", f"{words[-1]}.md", 1, 1, "h3", "indexed", None,
                       records(["seven"]), mine)
        changes.extend(mine)
    mine = store.Changes()
    store.delete_file(db, store.file_row(db, "v", "b.md")["id"], mine)
    changes.extend(mine)
    db.execute("COMMIT")

    now = {r[0]: r[1] for r in db.execute("SELECT id, embed_hash FROM chunks")}
    assert sorted(a[0] for a in changes.added) == sorted(now)
    assert {a[0]: a[1] for a in changes.added} == now
    assert set(first) <= set(changes.removed)
    # mirrored as the vector store does: the removed dropped, then the added taken
    mirror = set(first)
    mirror -= set(changes.removed)
    mirror |= {a[0] for a in changes.added}
    assert mirror == set(now)


def test_a_text_queued_again_while_it_is_embedded_is_counted_once():
    """Two sources holding the same note: the second's commit queues again the texts the
    embedder has in hand. pending_texts counted them twice (CI saw 178 for 114 texts). And a
    text no chunk has any more is not counted, even while it is being embedded."""
    import threading

    from ragd.index.space import Space

    space = Space(1, None, None)
    space.queue(["a", "b", "c"])
    assert space.take(2, threading.Event()) == ["a", "b"]
    assert space.pending() == 3
    space.queue(["b"])  # the same text, committed by another file
    assert space.pending() == 3
    space.stored(["b"])  # its vector is in: not to embed again
    assert space.pending() == 2
    assert space.queued({"a", "b", "c"}) == {"a", "c"}
    space.forget({"a"})  # its chunks deleted while it is embedded
    assert space.pending() == 1
    space.done(["a", "b"])
    assert space.take(5, threading.Event()) == ["c"]
    space.stored(["c"])
    space.done(["c"])
    assert space.idle()


def test_an_edit_made_while_a_backlog_is_embedded_gets_its_vector_first(tmp_path, make_daemon):
    """A note written while the vault's texts are still being embedded was queued behind all
    of them: a fresh-user walk saw it unfound by meaning for 12 minutes. Its texts now go to
    the front of the queue, so it has its vectors after the batch in the engine's hands, with
    most of the backlog still waiting. (The engine is held still while the note is written,
    so the check does not depend on the machine's speed.)"""
    d = make_daemon(extra=engine_config())  # the Tasks docs: ~1,500 texts to embed
    root = tmp_path / "vaults" / "obsidian-tasks-docs"
    note = root / "garden.md"
    with d:
        d.wait_idle(60)  # (the chunks; their vectors come after)
        with bulk_embedding_stopped(d) as e:
            backlog = e["pending_texts"]
            assert backlog > 1000, e
            note.write_text("# Gardening\n\nTomatoes need six hours of sunshine every day.\n")
            deadline = time.monotonic() + 30
            while not any(r["path"] == str(note) for r in
                          d.call("search", query="tomatoes", mode="bm25")["results"]):
                assert time.monotonic() < deadline, "the note was never indexed"
                time.sleep(0.1)
        deadline = time.monotonic() + 120
        while (d.call("related", path=str(note), k=1).get("reason") or ""
               ).startswith("no vectors for this note yet"):
            assert time.monotonic() < deadline, d.call("status")["engines"]["embedding"]
            time.sleep(0.1)
        left = d.call("status")["engines"]["embedding"]["pending_texts"]
        assert left > backlog / 2, (left, backlog)  # found before the backlog, not after it
        hits = d.call("search", query="how much sun do tomato plants need", mode="vector")
        assert hits["results"][0]["path"] == str(note)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["set", "remove", "merge"]),
                          st.integers(0, 40), st.integers(1, 5)), max_size=120),
       st.integers(0, 20))
def test_the_file_map_agrees_with_a_dict_through_any_changes(ops, start):
    """FileMap (a graph's chunk -> file, in sorted arrays and a log of changes) answers as a
    plain dict would, through adds, moves, removals and merges at any moment."""
    import ragd.index.filemap as fm
    merge_at, fm.MERGE_AT = fm.MERGE_AT, 3  # merged by itself every few changes too
    try:
        _file_map_run(fm, ops, start)
    finally:
        fm.MERGE_AT = merge_at


def _file_map_run(fm, ops, start):
    base = {c: c % 3 + 1 for c in range(start)}
    m = fm.FileMap(np.array(list(base), dtype=np.int64),
                   np.array(list(base.values()), dtype=np.int64))
    ref = dict(base)
    for op, chunk, file in ops:
        if op == "set":
            m.set(chunk, file)
            ref[chunk] = file
        elif op == "remove":
            assert m.remove(chunk) == (chunk in ref)
            ref.pop(chunk, None)
        else:
            m.merge()
        assert len(m) == len(ref)
    for c in range(45):
        assert (c in m) == (c in ref) and m.get(c) == ref.get(c)
    ids, files = m.arrays()
    assert dict(zip(ids.tolist(), files.tolist())) == ref
    for f in range(1, 6):
        assert sorted(m.chunks_of(np.array([f])).tolist()) == sorted(
            c for c, x in ref.items() if x == f)


def test_a_snapshot_older_than_the_chunks_is_checked_not_trusted(make_daemon, tmp_path):
    """A daemon killed after an edit left a snapshot of the chunks as they were before it (a
    snapshot is written every 10 minutes and at a stop): the next start must see that the
    chunks changed since (their generation: the edit keeps their number), check the snapshot
    against them and take the edit's vector from the cache — not load the snapshot as it is."""
    root = small_vault(tmp_path / "v")
    note = root / "Fresh.md"
    note.write_text("# Fresh\n\nA note about tomatoes and their watering.\n")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    log = tmp_path / "data" / "ragd.log"
    with d:
        wait_embedded(d)
    with d:
        n = wait_embedded(d)["sources"][0]["chunks"]
        assert log.read_text().count("no chunk changed since it was taken") == 1
        note.write_text("# Fresh\n\nA note about sourdough starters and rye flour.\n")
        hits = d.call("search", query="baking bread with a sourdough starter", mode="vector",
                      k=1, wait=20)["results"]
        assert hits[0]["path"] == str(note)
        assert d.call("status")["sources"][0]["chunks"] == n
        d.kill()
    # as an older ragd wrote the hashes (str, not bytes): they are still read
    for hashes in (tmp_path / "data" / "vectors").glob("space-*.hashes.npy"):
        np.save(hashes, np.load(hashes).astype(str))
    with d:
        st = wait_embedded(d)
        text = log.read_text()
        assert text.count("no chunk changed since it was taken") == 1  # the first restart's
        assert "from the snapshot, 1 from the cache" in text
        assert st["engines"]["embedding"]["embedded_texts"] == 0
        assert st["engines"]["embedding"]["vectors"] == st["sources"][0]["chunks"] == n
        hits = d.call("search", query="baking bread with a sourdough starter", mode="vector",
                      k=1)["results"]
        assert hits[0]["path"] == str(note)


def test_a_graph_snapshot_after_a_few_edits_lists_them_and_keeps_the_graph_file(
        make_daemon, tmp_path):
    """A stop after a few edits wrote the whole graph again (660 MB at a million chunks): it
    did not fit in the stop's 4 s, and the next start checked every chunk (5.8 s). Now the
    chunks changed since the graph file are listed beside it and read back from the cache at
    the next start. The edited note is found by its new text and not by its old one after
    such a start, after a kill that follows another edit (the start checks, and must not
    trust the graph file's vectors of the listed chunks) and after a full save."""
    root = small_vault(tmp_path / "v")
    note = root / "Fresh.md"
    note.write_text("# Fresh\n\nA note about tomatoes and their watering in a hot summer.\n")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config(extra="ann_threshold = 50\n"))
    log = tmp_path / "data" / "ragd.log"
    vectors = tmp_path / "data" / "vectors"
    tomatoes, bread = "watering tomato plants in summer", "baking bread with a sourdough starter"

    def first(query):  # (None: no note close enough in meaning)
        hits = d.call("search", query=query, mode="vector", k=1)["results"]
        return hits[0]["path"] if hits else None

    with d:  # the graph built here, written whole (a stop may list what came after it)
        wait_embedded(d)
        deadline = time.monotonic() + 60
        while d.call("status")["engines"]["embedding"]["vector_index"] != "hnsw":
            assert time.monotonic() < deadline
            time.sleep(0.1)
    (graph,) = vectors.glob("space-*.graph.usearch")
    written = graph.stat().st_mtime_ns
    with d:
        wait_embedded(d)
        assert first(tomatoes) == str(note)
        note.write_text("# Fresh\n\nA note about sourdough starters and rye flour.\n")
        (root / "Other Plugins" / "QuickAdd.md").unlink()
        assert d.call("search", query=bread, mode="vector", k=1, wait=20)["results"][0][
            "path"] == str(note)
    assert graph.stat().st_mtime_ns == written  # not written again
    (listed,) = vectors.glob("space-*.dirty.npy")
    assert 1 <= len(np.load(listed)) < 200
    with d:
        st = wait_embedded(d)
        assert st["engines"]["embedding"]["embedded_texts"] == 0
        assert "of them from the cache (changed since the graph file was written)" in \
            log.read_text()
        assert first(bread) == str(note) and first(tomatoes) != str(note)
        other = root / "Tomatoes.md"
        other.write_text("# Tomatoes\n\nA note about tomatoes and their watering in a hot "
                         "summer.\n")
        assert d.call("search", query=tomatoes, mode="vector", k=1, wait=20)["results"][0][
            "path"] == str(other)
        d.kill()  # no snapshot: the next start checks the light one against the chunks, and
        # the listed chunks' vectors (the sourdough note's) are the cache's, not the graph's
    with d:
        st = wait_embedded(d)
        assert st["engines"]["embedding"]["embedded_texts"] == 0
        assert st["engines"]["embedding"]["vectors"] == st["sources"][0]["chunks"]
        assert first(tomatoes) == str(other) and first(bread) == str(note)
    with d:  # the checked start's snapshot: whole again or listed, the answers the same
        wait_embedded(d)
        assert first(tomatoes) == str(other) and first(bread) == str(note)


def test_the_rows_of_gone_files_are_read_in_lists(tmp_path):
    """store.file_rows_of (the scan's files found gone) reads its rows in IN lists of at most
    IN_BATCH: a folder of 2,000 notes gone at once, a name that is not UTF-8 among them (kept
    as bytes), another source's file of the same name, and a name with no row."""
    import os

    from ragd.index import store

    db = store.open_store(tmp_path / "index.db")
    odd = os.fsdecode(b"caf\xe9.md")  # (surrogate-escaped: how os.listdir gives it)
    names = [f"gone/n{i}.md" for i in range(2000)] + [odd]
    store.begin(db)
    for i, rel in enumerate(names):
        store.put_file(db, "v", rel, i, i, f"h{i}", "indexed", None, None)
    store.put_file(db, "w", "gone/n0.md", 7, 7, "other", "indexed", None, None)
    db.execute("COMMIT")
    rows = store.file_rows_of(db, "v", [*names, "never/there.md"])
    assert set(rows) == set(names)
    assert all(rows[rel].relpath == rel and rows[rel].source == "v" for rel in names)
    assert rows["gone/n1999.md"].size == 1999 and rows[odd].hash == "h2000"
    assert rows["gone/n0.md"].hash == "h0"


def test_the_queue_takes_every_notes_head_before_long_notes_rest():
    """Space's queue: texts past a long note's first HEAD_TEXTS (`rest`) are taken once no
    other text waits; an edit's (`first`) and a text some note holds in its head are not held
    back; pending counts each once, and stored or forgotten texts leave either part."""
    from ragd.index.space import Space
    s = Space(1, None, VectorIndex(4))
    s.queue(["a1", "a2", "t1", "t2"], rest={"t1", "t2"})
    s.queue(["b1", "t2"])  # t2 is also in another note's head: it goes with the heads
    s.queue(["e1", "t3"], first=True, rest={"t3"})  # an edit's: first, whatever its place
    assert s.pending() == 7
    stop = threading.Event()
    assert s.take(3, stop) == ["e1", "t3", "a1"]
    assert s.take(10, stop) == ["a2", "b1", "t2", "t1"]
    s.queue(["c1", "t4"], rest={"t4"})
    s.forget({"t4"})
    s.stored(["e1", "t3", "a1", "a2", "t2", "b1", "t1"])
    assert s.pending() == 1 and s.take(10, stop) == ["c1"]


def test_past_heads_are_the_texts_only_a_long_note_s_tail_holds():
    from ragd.index.space import HEAD_TEXTS
    from ragd.index.vectorstore import past_heads
    long = [(100 + i, f"l{i}", 7) for i in range(HEAD_TEXTS + 3)]
    short = [(10, "s0", 3), (11, f"l{HEAD_TEXTS + 2}", 3)]  # a tail text a short note holds
    assert past_heads(long[::-1] + short)["rest"] == {f"l{HEAD_TEXTS}", f"l{HEAD_TEXTS + 1}"}


def test_a_long_note_modified_last_waits_behind_every_notes_opening(make_daemon, tmp_path):
    """Vectors built for an index that had none (BM25 first, then an embedding model): most
    recently modified notes first, but a long note's texts past its first HEAD_TEXTS come
    after every other note's. A 5 MB note modified last held the queue for minutes before any
    other note had a vector (a fresh-user walk on the Obsidian Hub)."""
    from ragd.index.space import HEAD_TEXTS
    root = small_vault(tmp_path / "vault")
    long = root / "Log.md"
    long.write_text("# Log\n\n" + "\n\n".join(
        f"## Entry {i}\n\nOn day {i} the greenhouse sensor {i * 7} read a humidity of "
        f"{40 + i % 30} percent and the fan ran for {i % 11} hours." for i in range(60)) + "\n")
    old = time.time() - 86400
    for p in root.rglob("*.md"):
        if p != long:
            os.utime(p, (old, old))
    sources = [{"name": "n", "path": str(root), "kind": "folder"}]
    with make_daemon(sources=sources) as d:  # BM25 only: no vector yet
        d.wait_idle()
    d = make_daemon(sources=sources, extra=engine_config())
    with d:
        wait_embedded(d)
    db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
    try:
        rows = db.execute("SELECT f.relpath, c.ordinal, e.created_at FROM chunks c JOIN files f "
                          "ON f.id = c.file_id JOIN embeddings e ON e.text_hash = c.embed_hash"
                          ).fetchall()
    finally:
        db.close()
    heads = [t for p, o, t in rows if not p.endswith("Log.md") or o < HEAD_TEXTS]
    tail = [t for p, o, t in rows if p.endswith("Log.md") and o >= HEAD_TEXTS]
    assert len(tail) > 30 and len(heads) > 100
    assert max(heads) <= min(tail), (max(heads), min(tail))
    # the long note's head came first, as the most recently modified
    assert min(t for p, o, t in rows if p.endswith("Log.md")) == min(heads)


def test_the_embedding_cache_becomes_a_rowid_table_and_keeps_every_vector(tmp_path):
    """Migration m013: an index whose embedding cache is a WITHOUT ROWID table (schema 12)
    keeps every vector, its token count and orphan mark, the Milvus outbox's trigger on it, and
    its key: a vector stored again for the same text replaces the row. While it runs, the
    file ragctl start waits on says so; it is gone after."""
    from ragd.index import milvus, schema, store
    db = store.connect(tmp_path / "index.sqlite3")
    for version, step in enumerate(schema.MIGRATIONS[:12]):
        db.execute("BEGIN IMMEDIATE")
        step(db)
        db.execute(f"PRAGMA user_version = {version + 1}")
        db.execute("COMMIT")
    table = "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'embeddings'"
    assert "WITHOUT ROWID" in db.execute(table).fetchone()[0]
    schema.run_script(db, milvus.TRIGGERS)
    db.execute("INSERT INTO spaces (id, fingerprint, model, dims, probe, created_at, "
               "last_used) VALUES (1, 'f', 'm', 384, x'00', 1.0, 1.0)")
    rows = [(1, f"h{i}", np.arange(384, dtype=np.float32).tobytes() + bytes([i]), 10 + i,
             i % 2, 1.5, 7.0 if i == 2 else None) for i in range(5)]
    db.executemany("INSERT INTO embeddings VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    db.close()
    marker = tmp_path / "run" / "ragd.sock.upgrading"
    seen = []
    m013 = schema.MIGRATIONS[12]
    schema.MIGRATIONS[12] = lambda db: (seen.append(marker.read_text()), m013(db))
    try:
        db = store.open_store(tmp_path / "index.sqlite3", marker)
    finally:
        schema.MIGRATIONS[12] = m013
    assert seen == [f"schema 12 -> {store.SCHEMA_VERSION}\n"] and not marker.exists()
    assert "WITHOUT ROWID" not in db.execute(table).fetchone()[0]
    got = db.execute("SELECT space, text_hash, vector, tokens, truncated, created_at, "
                     "orphaned_at FROM embeddings ORDER BY text_hash").fetchall()
    assert [tuple(r) for r in got] == rows
    names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE tbl_name = "
                                      "'embeddings'")}
    assert {"store_embeddings_ai", "embeddings_orphaned"} <= names, names
    db.execute("INSERT OR REPLACE INTO embeddings (space, text_hash, vector, tokens, "
               "truncated, created_at) VALUES (1, 'h0', x'00', 1, 0, 2.0)")
    assert db.execute("SELECT COUNT(*), MIN(tokens) FROM embeddings").fetchone()[:] == (5, 1)
    assert db.execute("EXPLAIN QUERY PLAN SELECT vector FROM embeddings WHERE space = 1 AND "
                      "text_hash = 'h3'").fetchone()[3].startswith("SEARCH")
