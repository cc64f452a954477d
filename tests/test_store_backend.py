"""The store backends through the same searches: SQLite + the local vector index (the default,
its BM25 ranking served by the tantivy index, or by FTS5 with bm25_index = "fts5") and Milvus
(Milvus Lite from its wheel: the same client API as a Milvus server), each behind the real
daemon, the real engine and the real socket."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from conftest import engine_config, ragctl, small_vault, wait_embedded

STORES = ["sqlite", "sqlite-fts5", "milvus"]


def store_extra(backend: str, local_vectors: bool = False) -> str:
    if backend == "sqlite-fts5":
        return engine_config(extra='[search]\nbm25_index = "fts5"\n')
    token = 'token = "root:Milvus"\n' if backend == "milvus" else ""  # Lite takes any
    local = "local_vectors = true\n" if local_vectors else ""
    return engine_config(extra=f'[store]\nbackend = "{backend}"\n{token}{local}')


def snapshot_files(data: Path) -> set[str]:
    return {p.name.split(".", 1)[1] for p in (data / "vectors").glob("space-*.npy")} | \
        {p.name.split(".", 1)[1] for p in (data / "vectors").glob("space-*.usearch")}


def behind(st) -> bool:
    if st["store"]["backend"] == "milvus" and not (
            st["store"]["state"] == "in sync" and st["store"]["pending"] == 0):
        return True
    text = st["bm25_index"]
    return text["engine"] == "tantivy" and not (text["serving"] and text["pending"] == 0)


def in_sync(d, timeout: float = 120.0) -> dict:
    """Until the index is idle, embedded, and its mirror (milvus) or its tantivy index has
    every commit."""
    st = wait_embedded(d)
    deadline = time.monotonic() + timeout
    while behind(st):
        assert time.monotonic() < deadline, (st["store"], st["bm25_index"])
        time.sleep(0.2)
        st = d.call("status")
    return st


def bm25_served_by(backend: str) -> str | None:
    """What the reply's bm25_index says served the keyword ranking."""
    return {"sqlite": "tantivy", "sqlite-fts5": "fts5", "milvus": None}[backend]


def paths(res) -> list[str]:
    return [r["path"].rsplit("/", 1)[-1] for r in res["results"]]


@pytest.mark.parametrize("backend", STORES)
def test_search_edits_moves_and_restarts_through_the_store(make_daemon, tmp_path, backend):
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=store_extra(backend))
    with d:
        st = in_sync(d)
        store_name = backend.split("-")[0]
        assert st["store"]["backend"] == store_name
        assert st["bm25_index"]["engine"] == ("fts5" if backend != "sqlite" else "tantivy")
        out = ragctl("--config", d.config, "status").stdout
        assert ("store: milvus" in out and "in sync" in out) == (backend == "milvus"), out
        assert ("bm25: tantivy, in sync" in out) == (backend == "sqlite"), out
        assert "Milvus" not in out and "root:" not in repr(st)  # the token is never shown
        q = "how do I set up a custom status for my tasks"
        for mode in ("hybrid", "vector", "bm25"):
            res = d.call("search", query=q, mode=mode, k=5)
            assert res["mode"] == mode and not res.get("degraded"), res
            assert res.get("store", "sqlite") == store_name
            if mode != "vector":
                assert res.get("bm25_index") == bm25_served_by(backend), res
            assert "Custom Statuses" in " ".join(paths(res)) or \
                "Set up custom statuses.md" in paths(res), (mode, paths(res))
        # filters apply before the top k, in both rankings
        res = d.call("search", query=q, mode="hybrid", k=5, path="Other Plugins/*")
        assert res["results"] and all("/Other Plugins/" in r["path"] for r in res["results"])
        assert res.get("bm25_index") == bm25_served_by(backend), res
        res = d.call("search", query="plugin", mode="bm25", k=50, group="chunk")
        assert any("/Other Plugins/" not in r["path"] for r in res["results"]), res
        res = d.call("search", query="plugin", mode="bm25", k=50, group="chunk",
                     path="Other Plugins/*")
        assert res["results"] and all("/Other Plugins/" in r["path"] for r in res["results"])

        # an edit: a new word, found by BM25 and by its vector once --wait returns
        note = root / "How To" / "Set up custom statuses.md"
        with open(note, "a", encoding="utf-8") as f:
            f.write("\n\nThe quokkazebra protocol governs zanzibar spice caravans. ⚓\n")
        res = d.call("search", query="quokkazebra", mode="bm25", k=3, wait=30)
        assert paths(res)[:1] == ["Set up custom statuses.md"], res
        # a symbol is found as a word by every store (FTS5's and Milvus' tokenizers drop it)
        st = in_sync(d)
        res = d.call("search", query="⚓", mode="bm25", k=3)
        assert paths(res) == ["Set up custom statuses.md"], res
        res = d.call("search", query="the rules for spice caravans of zanzibar", mode="vector",
                     k=20, wait=30, group="chunk")
        assert any("quokkazebra" in r["text"] for r in res["results"]), res

        # a move embeds nothing and the note is found under its new path
        before = d.call("status")["engines"]["embedding"]["embedded_texts"]
        (root / "Moved").mkdir()
        shutil.move(str(note), root / "Moved" / note.name)  # same name, so the same title
        res = d.call("search", query="quokkazebra", mode="hybrid", k=3, wait=30)
        assert [r["path"].split("/vault/", 1)[1] for r in res["results"]][:1] == \
            ["Moved/Set up custom statuses.md"], res
        st = in_sync(d)
        assert st["engines"]["embedding"]["embedded_texts"] == before

        # a delete leaves both rankings
        (root / "Moved" / note.name).unlink()
        for mode in ("bm25", "hybrid"):
            res = d.call("search", query="quokkazebra caravans", mode=mode, k=10, wait=30)
            assert all("Moved/" not in r["path"] for r in res["results"]), res
        chunks = in_sync(d)["sources"][0]["chunks"]

    # a restart finds the mirror in step: nothing pushed again
    with d:
        st = in_sync(d)
        assert st["sources"][0]["chunks"] == chunks
        if backend == "milvus":
            assert st["store"]["pushed"] == 0 and st["store"]["collection"], st["store"]
        if backend == "sqlite":
            assert st["bm25_index"]["pushed"] == 0, st["bm25_index"]
        res = d.call("search", query=q, mode="hybrid", k=5)
        assert res.get("store", "sqlite") == store_name and res["results"]
        assert res.get("bm25_index") == bm25_served_by(backend), res
        # Milvus holds the vectors: ragd keeps which chunks have one, not the vectors
        assert st["engines"]["embedding"]["vector_index"] == (
            "milvus" if backend == "milvus" else "exact"), st["engines"]["embedding"]
        res = d.call("related", path=res["results"][0]["path"], k=3)
        assert res["results"] and not res.get("reason"), res
    assert snapshot_files(tmp_path / "data") == (
        {"ids.npy", "files.npy", "hashes.npy"} if backend == "milvus" else
        {"ids.npy", "files.npy", "hashes.npy", "vectors.npy"})


@pytest.mark.parametrize("local_vectors", [False, True])
def test_milvus_down_answers_from_sqlite(make_daemon, tmp_path, local_vectors):
    """Milvus unreachable (a server URI nothing listens on): search answers from SQLite and
    says so; the mirror keeps retrying with its work in the outbox, and the daemon lives on.
    Without a local copy of the vectors the answer is by keywords alone, and says why."""
    root = small_vault(tmp_path / "vault")
    local = "local_vectors = true\n" if local_vectors else ""
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config(extra='[store]\nbackend = "milvus"\n'
                                              f'uri = "http://127.0.0.1:9"\n{local}'))
    with d:
        st = wait_embedded(d)
        deadline = time.monotonic() + 60
        while st["store"]["state"] != "retrying":
            assert time.monotonic() < deadline, st["store"]
            time.sleep(0.2)
            st = d.call("status")
        assert st["store"]["error"]
        res = d.call("search", query="custom status", mode="hybrid", k=3)
        assert res["results"] and res["store"].startswith("sqlite (milvus ")
        if local_vectors:
            assert res["mode"] == "hybrid" and not res["degraded"], res
        else:
            assert res["mode"] == "bm25" and res["degraded"], res
            assert res["reason"].startswith(
                "the vectors are in Milvus alone, which cannot answer (milvus retrying")
            rel = d.call("related", path=res["results"][0]["path"])
            assert not rel["results"] and "Milvus alone" in rel["reason"], rel
        st = d.call("status")
        assert st["store"]["pending"] > 0 and st["store"]["collection"] is None
        out = ragctl("--config", d.config, "status").stdout
        assert "search reads SQLite meanwhile" in out and "last error" in out, out


@pytest.mark.parametrize("local_vectors", [False, True])
def test_a_model_switch_with_milvus_never_mixes_vector_spaces(make_daemon, tmp_path,
                                                              local_vectors):
    """A switch (mean pooling to CLS: two really different spaces): Milvus holds one space's
    vectors, so until its new collection has every chunk search reads SQLite (by keywords
    alone, said so, when Milvus alone holds the vectors); a dense answer from Milvus is always
    from the space that embedded the query."""
    root = small_vault(tmp_path / "v")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=store_extra("milvus", local_vectors))
    with d:
        st = in_sync(d)
        s1 = st["engines"]["embedding"]["space"]
        assert st["store"]["collection"] == f"ragd_s{s1}"
        d.config.write_text(d.config.read_text().replace("[embedding]\n",
                                                         '[embedding]\npooling = "cls"\n'))
        assert d.call("reload")["embedding"].startswith("switching to")
        stores = set()
        deadline = time.monotonic() + 240
        while True:
            st = d.call("status")
            r = d.call("search", query="a kanban board with lanes", mode="vector", k=3)
            if local_vectors or r["store"] == "milvus":
                assert not r["degraded"] and r["results"], r
            else:
                assert r["degraded"] and "Milvus alone" in r["reason"], r
            stores.add(r["store"])
            if r["store"] == "milvus":
                assert r["store_space"] == r["vector_space"], r
            if st["engines"]["embedding"]["space"] != s1 and r["store"] == "milvus":
                break
            assert time.monotonic() < deadline, (st["store"], st["engines"]["embedding"])
            time.sleep(0.05)
        st = in_sync(d)
        s2 = st["engines"]["embedding"]["space"]
        assert s2 != s1 and st["store"]["collection"] == f"ragd_s{s2}"
        assert any(s.startswith("sqlite (milvus") for s in stores), stores  # the fill


def test_kill_9_during_the_milvus_sync_converges_to_the_same_chunks(make_daemon, tmp_path):
    """kill -9 while the index is embedded and pushed, four times: after a clean run, Milvus
    holds exactly SQLite's chunks, each marked embedded exactly when its vector is cached."""
    import signal
    import sqlite3

    from pymilvus import MilvusClient
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=store_extra("milvus"))
    for i in range(4):
        d.start()
        time.sleep(1 + i)  # the fault: a kill at a later moment of the sync each time
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
    with d:
        in_sync(d)
    db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
    chunks = {r[0] for r in db.execute("SELECT id FROM chunks")}
    space = int(db.execute("SELECT value FROM meta WHERE key = 'active_space'").fetchone()[0])
    embedded = {r[0] for r in db.execute(
        "SELECT c.id FROM chunks c JOIN embeddings e ON e.space = ? AND "
        "e.text_hash = c.embed_hash", (space,))}
    name = db.execute("SELECT value FROM meta WHERE key = 'store_collection'").fetchone()[0]
    assert name == f"ragd_s{space}" and len(chunks) > 100
    assert db.execute("SELECT COUNT(*) FROM store_outbox").fetchone()[0] == 0
    client = MilvusClient(str(tmp_path / "data" / "milvus.db"))
    try:
        client.load_collection(name)
        rows = client.query(name, filter="id >= 0", output_fields=["id", "embedded"],
                            limit=16384)
        assert {r["id"] for r in rows} == chunks and len(rows) == len(chunks)
        assert {r["id"] for r in rows if r["embedded"]} == embedded == chunks
        assert client.list_collections() == [name]
    finally:
        client.close()


def tantivy_ids(data: Path, folder: str = "bm25") -> list[int]:
    """The ids the tantivy index in data/<folder> holds (read with the daemon stopped): chunk
    ids, or the notes' file ids (bm25-notes)."""
    import tantivy

    from ragd.index.textindex import _schema
    ix = tantivy.Index(_schema(note=folder == "bm25-notes"), path=str(data / folder),
                       reuse=True)
    s = ix.searcher()
    hits = s.search(tantivy.Query.all_query(), 100000, count=False).hits
    return s.fast_field_values("id", [a for _, a in hits])


def test_kill_9_during_the_tantivy_sync_converges_to_the_same_chunks(make_daemon, tmp_path):
    """kill -9 while the tantivy index is filled and edits are synced, four times; then its
    folder lost, then its folder garbage, then the notes' folder lost: after each clean run
    it holds exactly SQLite's chunks, once each, the notes' index exactly its notes, and
    search reads it."""
    import signal
    import sqlite3

    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    notes = sorted(root.rglob("*.md"))
    for i in range(4):
        d.start()
        time.sleep(0.5 + i * 0.7)  # the fault: edits at a later moment of the sync each time
        for note in notes[i * 2:i * 2 + 2]:  # edits while it syncs
            with open(note, "a", encoding="utf-8") as f:
                f.write(f"\n\nEdit {i}: the wombatfalcon rule applies here.\n")
        notes[-1 - i].unlink()
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
    data = tmp_path / "data"

    def check() -> None:
        db = sqlite3.connect(data / "index.sqlite3")
        chunks = sorted(r[0] for r in db.execute("SELECT id FROM chunks"))
        files = sorted(r[0] for r in db.execute("SELECT rowid FROM notes_fts"))
        assert db.execute("SELECT COUNT(*) FROM text_outbox").fetchone()[0] == 0
        db.close()
        assert len(chunks) > 50 and sorted(tantivy_ids(data)) == chunks
        assert len(files) > 10 and sorted(tantivy_ids(data, "bm25-notes")) == files

    for damage in (None, "lost", "garbage", "notes lost"):
        if damage == "notes lost":
            shutil.rmtree(data / "bm25-notes")
        if damage == "lost":
            shutil.rmtree(data / "bm25")
        elif damage == "garbage":
            for f in (data / "bm25").iterdir():
                if f.suffix in (".idx", ".term", ".json"):
                    f.write_bytes(b"not an index")
        with d:
            in_sync(d)
            res = d.call("search", query="wombatfalcon", mode="bm25", k=50, group="chunk")
            assert res["bm25_index"] == "tantivy", res
            assert len({r["path"] for r in res["results"]}) == 8, res
        check()
    log = (data / "ragd.log").read_text()
    # the first, the lost, the garbage, the notes' lost
    assert log.count("text index: filling") == 4, log
    assert "is unreadable or of another format" in log
    # the folder that was lost is the one named
    assert f"{data / 'bm25-notes'} is unreadable or of another format (missing)" in log


def test_the_tantivy_folder_deleted_under_the_running_daemon(make_daemon, tmp_path):
    """rm -rf of data/bm25 while ragd runs: the next push fails, the text-sync thread drops its
    writer, retries after its backoff and rebuilds the folder from SQLite; search answers all
    along (FTS5 meanwhile) and reads tantivy again once it holds every chunk."""
    import sqlite3

    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    data = tmp_path / "data"
    with d:
        in_sync(d)
        shutil.rmtree(data / "bm25")
        note = next(root.rglob("*.md"))
        with open(note, "a", encoding="utf-8") as f:
            f.write("\n\nThe pangolinquartz entry.\n")
        res = d.call("search", query="pangolinquartz", mode="bm25", k=3, wait=30)
        assert [r["path"] for r in res["results"]][:1] == [str(note)], res
        deadline = time.monotonic() + 90
        while True:
            st = d.call("status")
            res = d.call("search", query="pangolinquartz", mode="bm25", k=3)
            assert res["results"] and res["results"][0]["path"] == str(note), res
            if res["bm25_index"] == "tantivy" and not behind(st):
                break
            assert time.monotonic() < deadline, (st["bm25_index"], res["bm25_index"])
            time.sleep(0.2)
        sync = next(t for t in st["threads"] if t["name"] == "text-sync")
        assert sync["state"] == "running" and sync["restarts"] >= 1, sync  # it failed, came back
    db = sqlite3.connect(data / "index.sqlite3")
    chunks = sorted(r[0] for r in db.execute("SELECT id FROM chunks"))
    assert sorted(tantivy_ids(data)) == chunks
