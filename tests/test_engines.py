"""The real daemon with the real bundled engine and the shared GGUF models."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import time

import pytest

from conftest import (EMBED_MODEL, RERANK_MODEL, EngineKind, bulk_embedding_stopped,
                      engine_config, ragctl, small_vault, wait_embedded)


def src(root) -> list[dict]:
    return [{"name": "docs", "path": str(root), "kind": "obsidian"}]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead too
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0]


class Sleeper:
    """A real process in its own group, signalled as an engine is (Engine.signal)."""

    def __init__(self):
        self.proc = subprocess.Popen(["sleep", "60"], start_new_session=True)

    def signal(self, sig: int) -> bool:
        os.killpg(self.proc.pid, sig)
        self._sent_stop = sig == signal.SIGSTOP
        return True

    def stopped(self) -> bool:
        """Whether it is stopped, once a signal sent has been delivered (it takes a moment)."""
        deadline = time.monotonic() + 1.0
        state = proc_state(self.proc.pid)
        while time.monotonic() < deadline and (state == "T") != self._sent_stop:
            time.sleep(0.005)
            state = proc_state(self.proc.pid)
        return state == "T"

    _sent_stop = False


def test_the_bulk_engine_is_paused_only_while_a_query_is_embedded(monkeypatch):
    """QueryFirst stops the bulk engine's processes around a query's embedding and always
    lets them go: after an error, after PAUSE_MAX of overlapping queries, and not at all once
    the pauses owed pass PAUSE_BURST (a flood of queries must not stop the bulk work)."""
    from ragd.engines import manager
    bulk = Sleeper()
    q = manager.QueryFirst()
    try:
        with q.around([bulk]):
            assert bulk.stopped()
        assert not bulk.stopped() and q.pauses == 1
        with pytest.raises(RuntimeError):
            with q.around([bulk]):
                raise RuntimeError("the query engine failed")
        assert not bulk.stopped()
        # overlapping queries: one pause, ended by the last one out
        first = q.around([bulk])
        first.__enter__()
        with q.around([bulk]):
            assert bulk.stopped()
        assert bulk.stopped()  # the first is still embedding
        first.__exit__(None, None, None)
        assert not bulk.stopped() and q.pauses == 3
        # queries that keep overlapping: let go after PAUSE_MAX even though one is inside
        monkeypatch.setattr(manager, "PAUSE_MAX", 0.05)
        first = q.around([bulk])
        first.__enter__()
        time.sleep(0.1)
        with q.around([bulk]):
            pass
        assert not bulk.stopped()
        first.__exit__(None, None, None)
        # a flood: past PAUSE_BURST owed, queries run beside the bulk work until it is repaid
        monkeypatch.setattr(manager, "PAUSE_BURST", 0.2)
        with q.around([bulk]):
            time.sleep(0.25)
        with q.around([bulk]):
            assert not bulk.stopped()  # owed 0.25 s, not paused
        time.sleep(0.3)
        with q.around([bulk]):
            assert bulk.stopped()  # repaid by running as long
    finally:
        bulk.proc.kill()
        bulk.proc.wait()


def test_hybrid_search_restart_and_threshold(make_daemon, tmp_path, engine_kind):
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=src(root), extra=engine_config(extra=engine_kind.toml()))
    with d:
        st = wait_embedded(d)
        e = st["engines"]["embedding"]
        engine_kind.check(e)
        assert e["state"] == "ready" and e["vectors"] == st["sources"][0]["chunks"]
        assert e["embedded_texts"] > 50 and e["failed"] == 0
        # the bulk engine yields the cores to the query engine: a lower priority, really set
        q = e["query_engine"]
        assert e["nice"] == 10 and q["nice"] == 0
        assert os.getpriority(os.PRIO_PROCESS, e["pid"]) - \
            os.getpriority(os.PRIO_PROCESS, q["pid"]) == 10
        # [engines] threads = 0: both take every core (one query's embedding in half the
        # time on two cores), and are started so
        cores = len(os.sched_getaffinity(0))
        assert e["threads"] == q["threads"] == cores
        for pid in (e["pid"], q["pid"]):
            args = open(f"/proc/{pid}/cmdline").read().split("\0")
            flag = "-t" if "-t" in args else "--threads"
            assert args[args.index(flag) + 1] == str(cores)
        res = d.call("search", query="make a task repeat on a schedule", k=5)
        assert res["mode"] == "hybrid" and res["degraded"] is False
        # the bulk engine was paused while the query engine embedded the query, and let go
        assert d.call("status")["engines"]["embedding"]["query_engine"]["bulk_paused_s"] > 0
        assert proc_state(e["pid"]) != "T"
        assert res["vector_coverage"] == 1.0
        assert res["fusion"] == "convex" and all("fused" in r["scores"] for r in res["results"])
        assert any({"vector", "bm25"} <= set(r["scores"]) for r in res["results"])
        assert [r["score"] for r in res["results"]] == sorted(
            (r["score"] for r in res["results"]), reverse=True)
        vec = d.call("search", query="make a task repeat on a schedule", k=5, mode="vector")
        assert vec["mode"] == "vector" and all(  # the vector score (and rank) only
            set(r["scores"]) == {"vector", "vector_rank", "note"} for r in vec["results"])
        assert 0 < vec["results"][-1]["score"] <= vec["results"][0]["score"] <= 1.0
        # What only the vectors found below the similarity threshold (MiniLM's 0.30) is cut
        # from hybrid results; a BM25 hit stays whatever its cosine. Vector search keeps all.
        res = d.call("search", query="make a task repeat on a schedule", k=60, group="chunk")
        assert res["cut_below_threshold"] > 0 and res["results"]
        assert all("bm25" in r["scores"] or r["scores"]["vector"] >= 0.30
                   for r in res["results"])
        assert any(r["scores"].get("vector", 1.0) < 0.30 for r in res["results"])
        res = d.call("search", query="make a task repeat on a schedule", k=60, group="chunk",
                     mode="vector")
        assert "cut_below_threshold" not in res and len(res["results"]) == 60
        # ... and says how many of them are below the threshold (it listed five PEPs at
        # 0.25-0.29 for "->" with no word of it: a fresh-user walk)
        under = [r for r in res["results"] if r["scores"]["vector"] < 0.30]
        assert under and res["under_threshold"] == len(under) and res["threshold"] == 0.3, res
        cli = ragctl("--config", d.config, "search", "--mode", "vector", "-k", "60", "-l",
                     "make a task repeat on a schedule")
        shown = len(cli.stdout.splitlines())  # (a line per note: -l)
        assert 0 < int(cli.stderr.split(" of these ")[0].lstrip("(")) < shown and \
            f" of these {shown} results are below the similarity threshold 0.3" in cli.stderr, \
            cli.stderr
        # A distinctive note wins on meaning alone.
        hit = d.call("search", query="styling the buttons of tasks with CSS", k=3,
                     mode="vector")["results"]
        assert any(h["path"].endswith("How to style buttons.md") for h in hit)
        chunks = st["sources"][0]["chunks"]
        engine_pid = e["pid"]
    assert d.proc.returncode == 0 and not alive(engine_pid)  # SIGTERM takes the engine along

    # Restart with a threshold no real query reaches: nothing relevant, and nothing re-embedded.
    d.config.write_text(d.config.read_text() + "[search]\nmin_similarity = 0.99\n")
    with d:
        st = wait_embedded(d)
        assert st["engines"]["embedding"]["embedded_texts"] == 0
        assert st["engines"]["embedding"]["vectors"] == chunks
        res = d.call("search", query="quantum chromodynamics of neutron stars", k=5)
        assert res["results"] == [] and res["reason"].startswith("nothing relevant")
        assert res["reranked"] is False and res["best_similarity"] < 0.99
        assert d.call("search", query="quantum chromodynamics", k=5, mode="bm25")["results"] == []
        # Every word of this query is in one chunk: a literal match is answered anyway.
        res = d.call("search", query="QuickAdd plugin", k=5)
        assert res["below_threshold"] is True and res["results"]
        assert res["results"][0]["path"].endswith("QuickAdd.md")
        assert res["confidence"] == 1.0 and res["low_confidence"] is False  # a literal match
        # ... of only some of its words: the notes may not answer it
        res = d.call("search", query="QuickAdd plugin for zeppelin timetables", k=5)
        assert res["below_threshold"] is True and res["results"]
        assert 0.25 <= res["confidence"] < 1.0 and res["low_confidence"] is True, res


def test_killed_engine_is_restarted_and_search_degrades_meanwhile(make_daemon, tmp_path,
                                                                  engine_kind):
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=src(root), extra=engine_config(extra=engine_kind.toml()))
    with d:
        st = wait_embedded(d)
        engine_kind.check(st["engines"]["embedding"])
        pid = st["engines"]["embedding"]["pid"]
        qpid = st["engines"]["embedding"]["query_engine"]["pid"]
        # Both engines gone (the main one and the one for queries): BM25 answers meanwhile.
        os.kill(pid, signal.SIGKILL)
        os.kill(qpid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while d.call("status")["engines"]["embedding"]["query_engine"]["state"] == "ready":
            assert time.monotonic() < deadline  # seen at once on the pidfd
        res = d.call("search", query="make a task repeat", k=3)
        assert res["degraded"] is True and res["mode"] == "bm25"
        assert res["requested_mode"] == "hybrid" and "engine" in res["reason"]
        assert res["results"]  # BM25 still answers
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            e = d.call("status")["engines"]["embedding"]
            if e["state"] == "ready" and e["pid"] != pid and \
                    e["query_engine"]["state"] == "ready":
                break
            time.sleep(0.05)
        assert e["state"] == "ready" and e["restarts"] == 1 and e["pid"] != pid
        assert e["query_engine"]["restarts"] == 1 and not alive(qpid)
        engine_kind.check(e)
        assert not alive(pid)
        res = d.call("search", query="make a task repeat", k=3)
        assert res["degraded"] is False and res["mode"] == "hybrid"
        engine_pids = [e["pid"], e["query_engine"]["pid"]]
        # The daemon dies without cleaning up: the kernel takes the engines with it.
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)
        deadline = time.monotonic() + 10
        while any(map(alive, engine_pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(alive, engine_pids)), "engine orphaned by a killed daemon"


def test_a_query_engine_lost_part_way_hands_the_query_to_the_bulk_engine(make_daemon,
                                                                          tmp_path):
    """The query engine dies while it embeds a query (stopped by a model switch's hand-over,
    killed): the bulk engine, up beside it, embeds the query, and the search answers by
    meaning. Before, that search was degraded to keywords although an engine was up."""
    import threading
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=src(root), extra=engine_config())
    with d:
        st = wait_embedded(d)
        qpid = st["engines"]["embedding"]["query_engine"]["pid"]
        os.kill(qpid, signal.SIGSTOP)  # still "ready": the search sends it the query
        got = {}
        t = threading.Thread(target=lambda: got.update(
            d.call("search", query="make a task repeat", k=3)))
        t.start()
        time.sleep(1.0)  # the query is in flight to the stopped engine
        os.kill(qpid, signal.SIGKILL)
        t.join(30)
        assert got["mode"] == "hybrid" and got["degraded"] is False, got
        assert got["results"] and got["best_similarity"] > 0, got
        log = d.log.read_text()
        assert "query engine did not answer" in log and "the embedding engine embeds it" in log


def test_engine_that_keeps_dying_is_marked_failed(make_daemon, tmp_path, engine_kind):
    root = small_vault(tmp_path / "vault")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)  # a model file llama.cpp cannot load
    d = make_daemon(sources=src(root), extra=engine_config(
        embedding=broken, extra=engine_kind.toml(max_restarts=2, restart_window=60)))
    with d:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            e = d.call("status")["engines"]["embedding"]
            if e["state"] == "failed":
                break
            time.sleep(0.1)
        assert e["state"] == "failed"
        assert "failed 2 times" in e["reason"]
        assert "\n" in e["reason"]  # the last lines of the engine's log follow
        res = d.call("search", query="make a task repeat", k=3)
        assert res["degraded"] is True and "failed" in res["reason"] and res["results"]
        # a note's name too: the name puts its note first, and the reason stays (it was
        # wiped: "keywords only: None", a fresh-user walk)
        res = d.call("search", query="Find tasks with invalid data", k=3)
        assert res["results"][0]["path"].endswith("Find tasks with invalid data.md"), res
        assert res["degraded"] is True and "failed" in res["reason"], res


def test_model_switch_never_mixes_vector_spaces(make_daemon, tmp_path, second_embedding_model):
    """The model changed while ragd was stopped: at start the model in use serves and the new
    one is built beside it; neither matrix ever holds a vector of the other space."""
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=src(root), extra=engine_config())
    with d:
        st = wait_embedded(d)
        first_space = st["engines"]["embedding"]["space"]
        n = st["engines"]["embedding"]["vectors"]
    # Another model (the reranker's encoder, mean-pooled: a different vector space).
    d.config.write_text(d.config.read_text().replace(str(EMBED_MODEL),
                                                     str(second_embedding_model)))
    with d:
        db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")

        def in_space(space):
            return db.execute("SELECT COUNT(*) FROM chunks c JOIN embeddings e ON "
                              "e.space = ? AND e.text_hash = c.embed_hash",
                              (space,)).fetchone()[0]

        # Watched while the new space is built, until it has been seen part way: the old
        # space answers with all its vectors, the new matrix holds only committed rows of
        # its own space (old ones would make it n at once).
        part_way = False
        deadline = time.monotonic() + 120
        while True:
            assert time.monotonic() < deadline, "the switch never ended"
            e = d.call("status")["engines"]["embedding"]
            sw = e.get("switch")
            if sw is None:
                if e.get("space") not in (None, first_space):
                    break
                time.sleep(0.05)
                continue
            if e.get("space") is not None:  # (None while its snapshot loads at start)
                assert e["space"] == first_space and e["vectors"] == n
            assert sw["to_space"] != first_space
            assert sw["vectors"] <= in_space(sw["to_space"]), (sw, in_space(sw["to_space"]))
            part_way = part_way or 0 < sw["vectors"] < n
            time.sleep(0.02)
        assert part_way, "never saw the new space part way"
        st = wait_embedded(d)
        e = st["engines"]["embedding"]
        assert e["space"] != first_space and e["vectors"] == n == in_space(e["space"])
        res = d.call("search", query="make a task repeat", k=3, mode="vector")
        assert res["vector_space"] == e["space"]
        assert in_space(first_space) == n  # the first model's cache is kept
    # Switching back costs nothing: the first space and its cache are found again.
    d.config.write_text(d.config.read_text().replace(str(second_embedding_model),
                                                     str(EMBED_MODEL)))
    with d:
        deadline = time.monotonic() + 60
        while d.call("status")["engines"]["embedding"].get("space") != first_space:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        st = wait_embedded(d)
        assert st["engines"]["embedding"]["embedded_texts"] == 0
        assert st["engines"]["embedding"]["vectors"] == n


def test_a_5000_word_chunk_is_truncated_and_recorded(make_daemon, tmp_path):
    root = tmp_path / "notes"
    root.mkdir()
    words = " ".join(f"word{i % 97}" for i in range(5000))
    (root / "long.md").write_text(f"# Long\n\nzebra giraffe savanna {words}\n")
    (root / "short.md").write_text("# Short\n\nA note about sourdough bread baking.\n")
    # The chunker would split it; a budget beyond the model's context lets a chunk of 5,000
    # words reach the embedder, which must cut it to the context.
    d = make_daemon(sources=[{"name": "notes", "path": str(root)}],
                    extra=engine_config(extra="[index]\nchunk_tokens = 100000\n"))
    with d:
        st = wait_embedded(d)
        e = st["engines"]["embedding"]
        assert e["truncated"] == 1 and e["failed"] == 0 and e["vectors"] == 2
        db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
        rows = db.execute("SELECT tokens, truncated FROM embeddings ORDER BY tokens").fetchall()
        assert rows[0][1] == 0 and rows[1] == (512 - 4, 1)
        res = d.call("search", query="zebra giraffe savanna", k=2, mode="vector")
        assert res["results"][0]["path"].endswith("long.md")


def test_rerank_path_and_budget(make_daemon, tmp_path, engine_kind):
    root = small_vault(tmp_path / "vault")
    # A generous budget first (the machine may be busy); a 1 ms one afterwards.
    d = make_daemon(sources=src(root), extra=(
        f'[embedding]\nmodel = "{EMBED_MODEL}"\n'
        f'[reranker]\nmodel = "{RERANK_MODEL}"\nbudget_ms = 120000\n' + engine_kind.toml()))
    with d:
        wait_embedded(d)
        deadline = time.monotonic() + 30
        while d.call("status")["engines"]["reranker"]["state"] != "ready":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        engine_kind.check(d.call("status")["engines"]["reranker"])
        res = d.call("search", query="style the task buttons with a CSS snippet", k=5)
        assert res["reranked"] is True
        assert all("rerank" in r["scores"] for r in res["results"])
        assert [r["score"] for r in res["results"]] == [r["scores"]["rerank"]
                                                         for r in res["results"]]
        assert res["results"][0]["score"] >= res["results"][-1]["score"]
        plain = d.call("search", query="style the task buttons with a CSS snippet", k=5,
                       rerank=False)
        assert plain["reranked"] is False and "rerank" not in plain["results"][0]["scores"]
    d.config.write_text(d.config.read_text().replace("budget_ms = 120000", "budget_ms = 1"))
    with d:
        wait_embedded(d)
        while d.call("status")["engines"]["reranker"]["state"] != "ready":
            time.sleep(0.05)
        res = d.call("search", query="style the task buttons with a CSS snippet", k=5)
        assert res["reranked"] is False and "budget" in res["rerank_reason"]
        assert res["results"] and "fused" in res["results"][0]["scores"]


def test_an_input_the_engine_always_refuses_is_recorded_not_retried_forever(tmp_path, monkeypatch,
                                                                            engine_kind):
    """The engine serves a 128-token context while the embedder believes 512: long texts fail
    for real (HTTP 500 'too large'), short ones pass."""
    from ragd import config
    from ragd.engines.models import ResolvedModel
    from ragd.engines.supervisor import Engine
    from ragd.index import embedder as emb_mod
    from ragd.index import store
    from ragd.index.embedder import Embedder
    from ragd.index.indexer import Indexer

    monkeypatch.setattr(emb_mod, "MAX_ATTEMPTS", 2)  # keep the backoff short: 2 s, then give up
    root = tmp_path / "notes"
    root.mkdir()
    (root / "long.md").write_text("# Long\n\n" + " ".join(["okapi"] * 400) + "\n")
    (root / "short.md").write_text("# Short\n\nA short note about bread.\n")
    cfg = config.from_dict({"daemon": {"data_dir": str(tmp_path / "data")},
                            "index": {"chunk_tokens": 100000},  # the long note: one chunk
                            "sources": [{"name": "n", "path": str(root)}]}, None)
    store.open_store(cfg.db_path).close()
    served = ResolvedModel("m", EMBED_MODEL, "embedding", "mean", 128, "", "", 0.0, None)
    believed = ResolvedModel("m", EMBED_MODEL, "embedding", "mean", 512, "", "", 0.0, None)
    engine = Engine("embedding", served, engine_kind.settings(), tmp_path / "run",
                    tmp_path / "logs")
    engine.start()
    try:
        assert engine.wait_ready(60), engine.tail_log()
        engine_kind.check(engine.status())
    except BaseException:
        engine.stop()
        raise
    from ragd.index.vectorstore import VectorStore
    vectors = VectorStore(cfg.data_dir)
    emb = Embedder(cfg.db_path, engine, believed, vectors)
    ix = Indexer(cfg, cfg.db_path, listener=vectors)
    try:
        ix.start()
        ix.request_scan()
        assert ix.wait_idle(30)
        emb.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and emb.stats.failed == 0:
            time.sleep(0.1)
        assert emb.stats.failed == 1 and emb.stats.texts == 1
        assert emb.wait_idle(10)
        db = store.connect(cfg.db_path)
        (reason, attempts), = db.execute("SELECT reason, attempts FROM embed_failures").fetchall()
        assert attempts == 2 and "HTTP 500" in reason
        assert len(emb.vectors) == 1 and emb.pending(db) == 0
        # Given up: nothing is queued or scheduled for a retry, so it is never tried again.
        assert emb.idle and emb.space.retry == [] and not emb.space.todo
        assert db.execute("SELECT attempts FROM embed_failures").fetchone()[0] == 2
    finally:
        ix.stop()
        emb.stop()
        engine.stop()


def test_a_chunk_is_embedded_as_its_readable_body_under_its_header(make_daemon, tmp_path):
    """The vector is of what embed_hash names: header + body (Obsidian syntax made readable),
    not of the raw markup. Checked against the engine itself."""
    import numpy as np

    from ragd.engines.client import EngineClient
    from ragd.index.vectors import from_blob
    from ragd.ingest.chunker import embed_text

    root = tmp_path / "notes"
    root.mkdir()
    (root / "Harbour.md").write_text(
        "# Tides\n\nThe [[Fishing Boats|boats]] leave at ==dawn== when the %%secret%% tide "
        "turns; see [[Lighthouse#Lamp]] and #harbour/night for the ![[chart.png]] notes.\n")
    d = make_daemon(sources=[{"name": "n", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    with d:
        wait_embedded(d)
        db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
        heading, text, body, blob = db.execute(
            "SELECT c.heading, c.text, c.body, e.vector FROM chunks c JOIN embeddings e ON "
            "e.text_hash = c.embed_hash").fetchone()
        assert body != text and "[[" in text and "[[" not in body
        client = EngineClient(str(tmp_path / "run" / "embedding.sock"))
        want, raw = client.embed([embed_text(heading, body), embed_text(heading, text)])
        stored = from_blob(blob)
        assert float(np.dot(stored, want)) > 0.999
        assert float(np.dot(stored, raw)) < 0.99


# Varied on purpose: short and long, punctuation, digits, code, accents and other scripts.
SENTENCES = [
    "Make a task repeat every week.",
    "hi",
    "The mitochondria is the powerhouse of the cell; ATP synthesis happens across its inner "
    "membrane, driven by a proton gradient that the electron transport chain maintains.",
    "def embed(texts: list[str]) -> np.ndarray:  # returns one row per text",
    "Réunion à 14h30 : café, croissants et l'ordre du jour (v2.1).",
    "東京の天気は晴れです。",
    "Version 3.14.159 was released on 2024-03-14 with 2,718 fixes!",
    "- [ ] buy milk 📅 2025-01-01 🔁 every week",
    " ".join(["a long note about sourdough bread, its starter and the oven"] * 20),
]


def unix_only(pid: int, sock) -> bool:
    """The process listens on its Unix socket and on no TCP port."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    tcp_listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    tcp_listening.append(cols[1])
    with open("/proc/net/unix") as f:
        unix = {cols[6]: cols[7] for cols in (r.split() for r in f.read().splitlines()[1:])
                if len(cols) >= 8}
    serving = any(unix.get(i) == str(sock) for i in inodes)
    return serving and not tcp_listening


def test_native_engine_answers_as_the_bundled_one_does(tmp_path, llama_server):
    """The same model through the native llama-server and through the bundled engine: the same
    tokens, the same vectors (cosine >= 0.999 on varied sentences), the same rerank order; both
    on a Unix socket only."""
    import numpy as np

    from ragd.engines.models import ResolvedModel
    from ragd.engines.supervisor import Engine

    kinds = [EngineKind("bundled"), EngineKind("native", llama_server)]
    roles = {"embedding": ResolvedModel("m", EMBED_MODEL, "embedding", "mean", 512, "", "", 0.0,
                                        None),
             "reranker": ResolvedModel("r", RERANK_MODEL, "reranker", "rank", 512, "", "", 0.0,
                                       None)}
    engines = {}
    try:
        for kind in kinds:
            for role, model in roles.items():
                e = engines[kind.name, role] = Engine(role, model, kind.settings(),
                                                      tmp_path / kind.name, tmp_path / "logs")
                e.start()
        for (name, role), e in engines.items():
            assert e.wait_ready(60), f"{name} {role}: {e.tail_log()}"
            kind = kinds[0] if name == "bundled" else kinds[1]
            kind.check(e.status())
            assert unix_only(e.pid, e.socket), f"{name} {role} listens on more than its socket"

        bundled = engines["bundled", "embedding"].client
        native = engines["native", "embedding"].client
        for text in SENTENCES:
            assert native.tokenize(text) == bundled.tokenize(text), text
        a, b = bundled.embed(SENTENCES), native.embed(SENTENCES)
        cos = np.sum(a * b, axis=1)
        assert cos.min() >= 0.999, dict(zip(SENTENCES, cos.round(5)))
        # And the two engines' vectors are not all the same vector: the check above could not
        # pass with a degenerate engine.
        assert (a @ a.T)[0, 1:].max() < 0.95

        query = "how do I make a task repeat?"
        docs = ["To make a task recur, add a recurrence rule such as 'every week'.",
                "Sourdough needs a lively starter and a hot oven.",
                "Tasks can be styled with CSS snippets.",
                "A recurring task is created again when it is done."]
        rb = engines["bundled", "reranker"].client.rerank(query, docs)
        rn = engines["native", "reranker"].client.rerank(query, docs)
        assert np.argsort(rb).tolist() == np.argsort(rn).tolist(), (rb, rn)
        assert np.allclose(rb, rn, atol=0.01 * max(1.0, max(map(abs, rb)))), (rb, rn)
        assert len(set(np.round(rb, 3))) > 1  # not a constant score
    finally:
        for e in engines.values():
            e.stop()


def test_llama_settings_in_the_environment_do_not_reach_the_engine(tmp_path, monkeypatch,
                                                                   engine_kind):
    """llama-server reads LLAMA_ARG_* and LLAMA_API_KEY as options: a user's settings for their
    own llama-server (an API key, a bad value) must not change or break the one ragd runs."""
    from ragd.engines.models import ResolvedModel
    from ragd.engines.supervisor import Engine

    monkeypatch.setenv("LLAMA_API_KEY", "a-key-ragd-does-not-send")  # 401 on every request
    monkeypatch.setenv("LLAMA_ARG_API_KEY_FILE", str(tmp_path / "missing"))  # exits at start
    model = ResolvedModel("m", EMBED_MODEL, "embedding", "mean", 512, "", "", 0.0, None)
    engine = Engine("embedding", model, engine_kind.settings(max_restarts=1), tmp_path / "run",
                    tmp_path / "logs")
    engine.start()
    try:
        assert engine.wait_ready(60), engine.tail_log()
        engine_kind.check(engine.status())
        (vec,) = engine.client.embed(["a sentence to embed"])
        assert vec.shape == (384,)
    finally:
        engine.stop()


def _cpu_ms(pid: int) -> float:
    """CPU time of every thread of a process so far, in ms (schedstat: nanoseconds, where
    /proc/PID/stat counts 10-ms ticks)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # (a thread that ended meanwhile)
    return total / 1e6


def test_an_engine_does_not_spin_after_a_request(tmp_path, engine_kind):
    """llama.cpp's OpenMP threads spin for more work after each request (libgomp's default:
    ~10 ms of CPU on two threads here): on a 2-core machine that took the cores from the
    search work that follows a query's embedding. ragd's engines sleep soon after
    (supervisor.OMP_SPIN)."""
    from ragd.engines.models import ResolvedModel
    from ragd.engines.supervisor import Engine

    model = ResolvedModel("m", EMBED_MODEL, "embedding", "mean", 512, "", "", 0.0, None)
    engine = Engine("query", model, engine_kind.settings(threads=2), tmp_path / "run",
                    tmp_path / "logs")
    engine.start()
    try:
        assert engine.wait_ready(60), engine.tail_log()
        pid = engine.status()["pid"]
        after = []
        for i in range(7):
            engine.client.embed([f"what did I write about question {i} last week?"])
            t0 = _cpu_ms(pid)
            # time passing on purpose: the CPU the engine takes while nothing is asked of it
            time.sleep(0.2)
            after.append(_cpu_ms(pid) - t0)
        assert sorted(after)[3] < 3.0, after
    finally:
        engine.stop()


@pytest.mark.slow
def test_a_first_start_without_a_log_warns_of_nothing(tmp_path, caplog):
    """The cap is checked before the log is first opened: a first start has none yet, and
    that is no reason to warn (every new daemon logged 'could not be rotated' twice)."""
    from ragd.engines.models import ResolvedModel
    from ragd.engines.supervisor import Engine, EngineSettings

    model = ResolvedModel("m", EMBED_MODEL, "embedding", "mean", 512, "", "", 0.0, None)
    engine = Engine("embedding", model, EngineSettings(health_interval=0.5), tmp_path / "run",
                    tmp_path / "logs")
    assert not engine.log_path.exists()
    with caplog.at_level(logging.INFO, logger="ragd"):
        engine.start()
        try:
            assert engine.wait_ready(60), engine.tail_log()
            # time passing on purpose: two health checks, each checking the log's cap; what is
            # checked is that none of them warns
            time.sleep(1.2)
        finally:
            engine.stop()
    assert engine.log_path.exists()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_the_bundled_engine_logs_nothing_for_a_request(tmp_path):
    """The bundled engine logs warnings and errors only: at llama.cpp's default it wrote three
    lines for every text embedded (2.1 MB for a vault of 885 notes; a fresh-user walk)."""
    from ragd.engines.models import ResolvedModel
    from ragd.engines.supervisor import Engine, EngineSettings

    model = ResolvedModel("m", EMBED_MODEL, "embedding", "mean", 512, "", "", 0.0, None)
    engine = Engine("embedding", model, EngineSettings(), tmp_path / "run", tmp_path / "logs")
    engine.start()
    try:
        assert engine.wait_ready(60), engine.tail_log()
        engine.client.embed(["warm up"])
        time.sleep(0.2)  # (a request's lines may come just after its reply)
        before = engine.log_path.read_bytes()
        for i in range(20):
            engine.client.embed([f"sentence number {i} to embed"])
        time.sleep(0.2)
        assert engine.log_path.read_bytes() == before
        assert b"listening" in before  # (the engine's own line: where it listens)
    finally:
        engine.stop()


@pytest.mark.slow
def test_an_engines_log_is_kept_under_its_cap(tmp_path, monkeypatch):
    """A native llama-server logs lines for every request into <role>.log: past the cap, a health
    check copies it to <role>.log.1 and empties it in place, and the running server's next
    lines land at its start (it appends); the next start does the same."""
    from ragd.engines import supervisor
    from ragd.engines.models import ResolvedModel
    from ragd.engines.supervisor import Engine, EngineSettings

    monkeypatch.setattr(supervisor, "LOG_CAP_BYTES", 4096)
    # the bundled engine logs warnings only; at info it logs every request, as a native
    # llama-server does by default: the log the cap is for
    command = supervisor.command
    monkeypatch.setattr(supervisor, "command", lambda *a: [*command(*a), "--verbosity", "3"])
    model = ResolvedModel("m", EMBED_MODEL, "embedding", "mean", 512, "", "", 0.0, None)
    engine = Engine("embedding", model, EngineSettings(health_interval=0.5), tmp_path / "run",
                    tmp_path / "logs")
    log, old = engine.log_path, engine.log_path.with_name("embedding.log.1")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"x" * 5000)  # a big log from an earlier run: rotated at the start
    engine.start()
    try:
        assert engine.wait_ready(60), engine.tail_log()
        assert old.read_bytes() == b"x" * 5000
        grown = 0
        for i in range(200):  # a few lines per request, until past the cap
            engine.client.embed([f"sentence number {i} to embed"])
            grown = max(grown, log.stat().st_size)
            if old.read_bytes() != b"x" * 5000:
                break
        deadline = time.monotonic() + 10
        while old.read_bytes() == b"x" * 5000:  # (the next health check)
            assert time.monotonic() < deadline, (grown, log.stat().st_size)
            time.sleep(0.1)
        assert old.stat().st_size > 4096 and b"starting:" in old.read_bytes()
        while log.stat().st_size > 4096:  # (the copy is in place just before the emptying)
            assert time.monotonic() < deadline, log.stat().st_size
            time.sleep(0.05)
        engine.client.embed(["one more sentence"])  # the server writes on, from the start
        deadline = time.monotonic() + 10
        while not (text := log.read_bytes()) and time.monotonic() < deadline:
            time.sleep(0.05)  # (its log lines of a request may come just after the reply)
        assert 0 < len(text) < 4096 and not text.startswith(b"\0"), text[:80]
    finally:
        engine.stop()


def test_a_bundled_engine_stops_at_once_in_the_middle_of_a_batch(tmp_path, caplog):
    """SIGTERM during a long embedding request: the bundled engine exits at once, by itself.
    It waited for the request to finish, past the stop's grace, so every stop during a bulk
    embedding logged 'did not exit after SIGTERM, sending SIGKILL' (a fresh-user walk)."""
    import threading

    from ragd.engines.client import EngineError, EngineUnavailable
    from ragd.engines.models import ResolvedModel
    from ragd.engines.supervisor import Engine, EngineSettings

    model = ResolvedModel("m", EMBED_MODEL, "embedding", "mean", 512, "", "", 0.0, None)
    engine = Engine("embedding", model, EngineSettings(threads=1), tmp_path / "run",
                    tmp_path / "logs")
    engine.start()
    stopped = False
    try:
        assert engine.wait_ready(60), engine.tail_log()
        pid = engine.status()["pid"]
        proc = engine._proc
        texts = [f"note {i}: " + " ".join(f"word{j * i % 997}" for j in range(60))
                 for i in range(400)]  # (seconds of work on one thread)

        def batch():
            try:
                engine.client.embed(texts, timeout=120)
            except (EngineError, EngineUnavailable, OSError):
                pass  # (cut short by the stop)

        t = threading.Thread(target=batch)
        t.start()
        t0, deadline = _cpu_ms(pid), time.monotonic() + 30
        while _cpu_ms(pid) - t0 < 200:  # the engine is working on the batch
            assert t.is_alive() and time.monotonic() < deadline, "the batch was not embedded"
            time.sleep(0.02)
        with caplog.at_level(logging.INFO, logger="ragd"):
            engine.stop()
            stopped = True
        t.join(30)
        assert proc.returncode == 0, proc.returncode  # its own exit, not a SIGKILL's -9
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    finally:
        if not stopped:
            engine.stop()


def _descendants(pid: int) -> list[int]:
    """Every process under pid (its engines, and a bundled engine's server child)."""
    parent = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    parent[int(p)] = int(f.read().split(")")[-1].split()[1])
            except (FileNotFoundError, ProcessLookupError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def test_a_stop_that_signals_the_engines_too_is_no_pause(make_daemon, tmp_path):
    """A service manager stops a unit by signalling all of its processes (systemd's
    control-group kill): the engines exit at once while ragd stops, and a batch in flight
    fails. That is the stop, not an engine lost: the log said "embedding paused: ...
    Connection refused" (a fresh-user walk) and a stop must log no such thing."""
    d = make_daemon(extra=engine_config())  # (obsidian-tasks-docs: ~1,500 texts to embed)
    with d:
        deadline = time.monotonic() + 120
        while not ((e := d.call("status")["engines"]["embedding"]).get("vectors", 0) >= 64
                   and e.get("embedder") == "embedding"):
            assert time.monotonic() < deadline, e
            time.sleep(0.05)
        engines = _descendants(d.proc.pid)
        assert e["pid"] in engines
        for pid in [*engines, d.proc.pid]:  # (a group kill: in no order; the engines first here)
            os.kill(pid, signal.SIGTERM)
        assert d.proc.wait(30) == 0
    log = (tmp_path / "data" / "ragd.log").read_text()
    assert "stopping" in log and "embedding paused" not in log, log[-2000:]


def test_a_restart_in_the_middle_of_a_first_embedding_has_an_estimate_at_once(make_daemon,
                                                                             tmp_path):
    """The pace of a run is kept at its stop: a restart with texts still to embed said "no
    estimate yet" (ragctl start, status) until 32 texts of the new run were in (a fresh-user
    walk). Small batches here, so that 32 texts take many requests."""
    from ragd.index.embedder import EmbedStats

    assert EmbedStats().seconds_per_text() is None  # (no run before: nothing to go by)
    d = make_daemon(extra=engine_config(extra="batch_tokens = 256\n"))
    with d:
        deadline = time.monotonic() + 120
        while (e := d.call("status")["engines"]["embedding"]).get("embedded_texts", 0) < 40:
            assert time.monotonic() < deadline, e
            time.sleep(0.1)
    with d:
        deadline = time.monotonic() + 60
        while (e := d.call("status")["engines"]["embedding"]).get("pending_texts") is None:
            assert time.monotonic() < deadline, e
            time.sleep(0.02)
        assert e["pending_texts"] > 0 and e["embedded_texts"] < 32, e
        assert e["eta_s"] is not None and e["eta_s"] > 0, e


def test_the_time_left_goes_by_the_pace_of_the_last_requests():
    """A first index's first batches share the cores with the indexer: at their pace `ragctl
    start` said "~63 min" where status said "~20 min left" seconds later. The estimate goes by
    the last RECENT_REQUESTS requests."""
    from ragd.index.embedder import RECENT_REQUESTS, EmbedStats

    s = EmbedStats()
    s.took(10.0, 10)
    s.texts = 10
    assert s.seconds_per_text() is None  # (too few texts to say)
    s.texts = 1000
    for _ in range(4):
        s.took(10.0, 10)  # 1 s a text while the indexer ran beside
    assert s.seconds_per_text() == pytest.approx(1.0)
    for _ in range(RECENT_REQUESTS):
        s.took(1.0, 10)
    assert s.seconds_per_text() == pytest.approx(0.1)
    assert s.seconds == pytest.approx(50.0 + RECENT_REQUESTS) and s.requests == 5 + RECENT_REQUESTS


def test_the_time_left_counts_long_notes_rest_as_long_as_their_first_texts():
    """The notes' openings go first (space.HEAD_TEXTS), long notes' other texts last: paced
    per text of the openings, the estimate ran short at the end where short notes went first.
    The rest is paced per token, each text as long as the first texts of its notes were once
    SAMPLES of them are in; then, when the rest is all that is left, by its own pace."""
    from ragd.index.embedder import RECENT_REQUESTS, SAMPLES, EmbedStats

    s = EmbedStats()
    s.texts = 1000
    for _ in range(RECENT_REQUESTS):
        s.took(1.0, 20, 20 * 50)  # openings of 50 tokens, 0.05 s a text
    assert s.time_left(100, 40) == pytest.approx(7.0)  # (no sample yet: per text)
    s.sample_texts, s.sample_tokens = SAMPLES, SAMPLES * 250
    # 100 openings at 0.05 s, 40 rest texts of 250 tokens at 0.001 s a token
    assert s.time_left(100, 40) == pytest.approx(5.0 + 40 * 0.25)
    assert s.time_left(100, 0) == pytest.approx(5.0)
    for _ in range(RECENT_REQUESTS):
        s.took(1.0, 4, 4 * 250)  # the rest alone: its own pace
    assert s.time_left(0, 40) == pytest.approx(10.0)
    s.texts = 10
    assert s.time_left(100, 40) is None  # (no pace yet, none kept from a run before)
    s.before = 0.05
    assert s.time_left(100, 40) == pytest.approx(7.0)


def test_a_long_notes_first_texts_are_its_rests_samples():
    """What estimates the rest's length: the first texts of the notes that have one."""
    from ragd.index.space import HEAD_TEXTS
    from ragd.index.vectorstore import past_heads

    added = [(i, f"long{i}", 1) for i in range(HEAD_TEXTS + 3)] + [(100, "short", 2)]
    got = past_heads(added)
    assert got["rest"] == {f"long{i}" for i in range(HEAD_TEXTS, HEAD_TEXTS + 3)}
    assert got["samples"] == {f"long{i}" for i in range(HEAD_TEXTS)}


def test_an_engine_that_fails_is_explained_by_its_log_lines_that_say_why(tmp_path):
    """A model llama.cpp cannot serve aborts after pages of loading notes, and ggml's gdb
    backtrace came after the reason: status showed eight lines of gdb (a fresh-user walk).
    The engines run without the backtrace, and the reason given is the last start's lines
    that say what went wrong."""
    from ragd.engines.models import ResolvedModel
    from ragd.engines.supervisor import Engine, EngineSettings, child_env

    assert child_env()["GGML_NO_BACKTRACE"] == "1"
    model = ResolvedModel("m", EMBED_MODEL, "embedding", "mean", 512, "", "", 0.0, None)
    engine = Engine("generator", model, EngineSettings(), tmp_path / "run", tmp_path / "logs")
    engine.log_path.parent.mkdir(parents=True, exist_ok=True)
    engine.log_path.write_text(
        "--- 2026-12-05 11:40:00 starting: llama-server -m old.gguf\n"
        "error: an older start's failure\n"
        "--- 2026-12-05 11:41:00 starting: llama-server -m minilm.gguf\n"
        + "".join(f"llama_model_loader: - kv {i}: some.key = {i}\n" for i in range(40))
        + "/src/llama-context.cpp:1020: GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max) "
          "failed\n"
        + "".join(f"#{i} 0x7f00 in frame_{i} ()\n" for i in range(12)))
    assert engine.tail_log() == ("/src/llama-context.cpp:1020: GGML_ASSERT(n_outputs_max <= "
                                 "cparams.n_outputs_max) failed")
    engine.log_path.write_text("--- 2026-12-05 starting: x\n"
                               + "".join(f"line {i}\n" for i in range(20)))
    assert engine.tail_log(3) == "line 17\nline 18\nline 19"  # (nothing telling: the last)


def test_the_texts_of_a_note_deleted_while_they_wait_in_a_batch_are_not_embedded(make_daemon,
                                                                                  tmp_path):
    """The embedder takes WORK_BATCH texts at a time; a long note deleted while its texts are
    in that batch had the rest of them embedded for nothing, status saying "embedding" with
    nothing left to embed (a fresh-user walk). The texts forgotten since are left out of the
    requests still to send. The bulk engine is held (SIGSTOP) on the batch's first request
    while the note is deleted."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("# A\n\nA short note about tomatoes in a greenhouse.\n")
    d = make_daemon(sources=[{"name": "notes", "path": str(notes), "kind": "folder"}],
                    extra=engine_config(extra="batch_tokens = 256\n"))
    with d:
        d.wait_idle(180, vectors=True)
        with bulk_embedding_stopped(d):
            words = ("harbor lantern quartz meadow falcon copper thistle orbit velvet "
                     "canyon ember willow saddle glacier pepper").split()
            (notes / "long.md").write_text("# Long\n\n" + "\n\n".join(
                f"## Part {i}\n\n" + " ".join(f"{words[(i * 7 + j) % len(words)]}{i}"
                                               for j in range(150))
                for i in range(120)))
            deadline = time.monotonic() + 60
            while not ((e := d.call("status")["engines"]["embedding"]).get("embedder")
                       == "embedding" and e.get("pending_texts", 0) >= 100):
                assert time.monotonic() < deadline, e
                time.sleep(0.05)
            (notes / "long.md").unlink()
            deadline = time.monotonic() + 60
            while (e := d.call("status")["engines"]["embedding"]).get("pending_texts") != 0:
                assert time.monotonic() < deadline, e
                time.sleep(0.05)
            before = e["embedded_texts"]
        st = d.wait_idle(120, vectors=True)
        after = st["engines"]["embedding"]["embedded_texts"]
    # the request the engine was held on (one text a request at this batch size), and none
    # of the batch's other texts (WORK_BATCH of them were taken)
    assert after - before <= 2, (before, after)
