"""Switching the embedding model with zero downtime: the old space answers until the new one
covers every chunk, then one transaction flips; restarts and kills resume it. Two really
different spaces: the shared MiniLM GGUF with mean pooling, then with CLS pooling."""

from __future__ import annotations

import os
import sqlite3
import time

from conftest import EMBED_MODEL, RERANK_MODEL, engine_config, ragctl, small_vault, wait_embedded


def distinct_texts(tmp_path) -> int:
    db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
    return db.execute("SELECT COUNT(DISTINCT embed_hash) FROM chunks").fetchone()[0]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_a_model_switch_never_degrades_search_and_flips_when_complete(make_daemon, tmp_path):
    root = small_vault(tmp_path / "v")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    with d:
        st = wait_embedded(d)
        old = st["engines"]["embedding"]
        s1, n, old_pid = old["space"], old["vectors"], old["pid"]
        d.config.write_text(d.config.read_text().replace("[embedding]\n",
                                                         '[embedding]\npooling = "cls"\n'))
        r = ragctl("--config", d.config, "reload")  # as a user does: the switch is said
        assert r.returncode == 0 and "  embedding model: switching to" in r.stdout, r.stdout
        assert "restart is needed" not in r.stdout
        seen_mid = 0
        deadline = time.monotonic() + 180
        while True:
            # the search first, then the status: a switch that completes between the two is
            # then seen done (the other way round, a search after the flip was taken for one
            # during the switch: a race, which failed a CI run)
            r = d.call("search", query="a kanban board with lanes", mode="hybrid", k=3)
            e = d.call("status")["engines"]["embedding"]
            sw = e.get("switch")
            if sw is None and e["space"] != s1:
                break
            # during the switch: the old space answers, never degraded
            assert r["degraded"] is False and r["vector_space"] == s1, r
            if sw is not None and 0 < sw["progress"] < 1:
                seen_mid += 1
                assert sw["from_space"] == s1 and sw["to"] and sw["chunks"] == n
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert seen_mid > 0, "never saw the switch under way"
        st = wait_embedded(d)
        e = st["engines"]["embedding"]
        s2 = e["space"]
        assert s2 != s1 and e["vectors"] == st["sources"][0]["chunks"]
        r = d.call("search", query="a kanban board with lanes", mode="hybrid", k=3)
        assert r["vector_space"] == s2 and not r["degraded"]
        # the new space embedded every distinct live text once
        assert e["embedded_texts"] == distinct_texts(tmp_path)
        deadline = time.monotonic() + 15
        while alive(old_pid):  # the old model's engine stops
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # switching back costs nothing: the old space's vectors are cached
        r = ragctl("--config", d.config, "models", "use", str(e["model_path"]))
        d.config.write_text(d.config.read_text().replace('pooling = "cls"\n', ""))
        d.call("reload")
        deadline = time.monotonic() + 60
        while d.call("status")["engines"]["embedding"]["space"] != s1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert wait_embedded(d)["engines"]["embedding"]["embedded_texts"] == 0
        # the second switch's engine keeps its socket once the first one's engine has stopped
        # (both were "embedding-next": the old one's stop unlinked the new one's socket, and
        # nothing was embedded until a health check restarted it, 40 s later)
        deadline = time.monotonic() + 15
        while alive(e["pid"]):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        now = d.call("status")["engines"]["embedding"]
        assert now["role"] != e["role"] and os.path.exists(now["socket"]), (now, e)
        (root / "fresh.md").write_text("# Fresh\n\nA new note about ocelots in the garden.\n")
        st = wait_embedded(d, timeout=20)
        assert st["engines"]["embedding"]["pid"] == now["pid"]  # no restart was needed
        threads = [t["name"] for t in st["threads"]]
        assert len(threads) == len(set(threads)), threads  # no "stopped" leftovers


def test_a_switch_survives_a_restart_and_a_kill(make_daemon, tmp_path):
    root = small_vault(tmp_path / "v")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    with d:
        s1 = wait_embedded(d)["engines"]["embedding"]["space"]
        r = ragctl("--config", d.config, "--json", "models", "use", "--cancel")
        assert r.returncode == 1 and "no model switch" in r.stderr
        d.config.write_text(d.config.read_text().replace("[embedding]\n",
                                                         '[embedding]\npooling = "cls"\n'))
        d.call("reload")
        deadline = time.monotonic() + 60
        while not (sw := d.call("status")["engines"]["embedding"].get("switch")) or \
                sw["vectors"] < 10:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    # stopped mid-switch: a restart resumes it, the old space answering
    with d:
        deadline = time.monotonic() + 60
        while True:  # the old space loaded again (its snapshot), the switch resumed
            e = d.call("status")["engines"]["embedding"]
            if e.get("switch") and e.get("space") == s1 and \
                    e.get("query_engine", {}).get("state") == "ready":
                break
            assert time.monotonic() < deadline, e
            time.sleep(0.05)
        r = d.call("search", query="custom statuses", mode="hybrid")
        assert r["vector_space"] == s1 and not r["degraded"], r
    # killed mid-switch (or at any point): the index is usable and the switch goes on
    d.start()
    time.sleep(1.0)  # the fault: a kill at a moment of the switch
    d.kill()
    with d:
        deadline = time.monotonic() + 240
        while True:  # the switch resumed and runs to its end
            e = d.call("status")["engines"]["embedding"]
            if e.get("space") not in (None, s1) and "switch" not in e:
                break
            assert time.monotonic() < deadline, e
            time.sleep(0.1)
        st = wait_embedded(d)
        e = st["engines"]["embedding"]
        assert e["vectors"] == st["sources"][0]["chunks"]
        r = d.call("search", query="custom statuses", mode="hybrid")
        assert r["vector_space"] == e["space"] and not r["degraded"]


def test_models_use_and_cancel(make_daemon, tmp_path, second_embedding_model):
    """ragctl models use PATH switches (the reranker's encoder, mean-pooled, is another vector
    space); --cancel puts the model in use back in the config and stops the switch."""
    root = small_vault(tmp_path / "v")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    with d:
        st = wait_embedded(d)
        s1 = st["engines"]["embedding"]["space"]
        r = ragctl("--config", d.config, "models", "use", str(second_embedding_model))
        assert r.returncode == 0 and "switching to" in r.stdout, r.stderr
        assert f'model = "{second_embedding_model}"' in d.config.read_text()
        r = ragctl("--config", d.config, "status")
        assert "switching to" in r.stdout, r.stdout
        logs = tmp_path / "data" / "engines"
        assert (logs / "embedding-next.log").exists()
        r = ragctl("--config", d.config, "models", "use", "--cancel")
        assert r.returncode == 0 and "cancelled" in r.stdout, r.stdout + r.stderr
        assert f'model = "{EMBED_MODEL}"' in d.config.read_text()
        e = d.call("status")["engines"]["embedding"]
        assert "switch" not in e and e["space"] == s1
        # the cancelled engine's log went with it: the logs left are of engines that run
        assert sorted(p.name for p in logs.glob("*.log")) == ["embedding.log", "query.log"]
        r = d.call("search", query="custom statuses", mode="hybrid")
        assert r["vector_space"] == s1 and not r["degraded"]


def embedding_failed(d, timeout: float = 30.0) -> dict:
    """The embedding engine's status once it is marked failed."""
    deadline = time.monotonic() + timeout
    while (e := d.call("status")["engines"]["embedding"]).get("state") != "failed":
        assert time.monotonic() < deadline, e
        time.sleep(0.1)
    return e


def test_a_model_that_cannot_be_used_is_refused_and_a_failed_one_is_replaced_live(
        make_daemon, tmp_path):
    """The README's remedy for a first start without network (the default model cannot be
    fetched): `ragctl models use FILE.gguf`. It starts that model at once — before, the failed
    model stayed failed until a restart, and the reply said "still starting". A model that
    cannot be used is refused: exit 2 (a command line ragctl cannot use, as the README says),
    the config file left as it was (it was written, and broke vectors at the next start), the
    model in use kept. Refused by a plain reload, status and `models` say so until a reload
    no longer names it (a fresh-user walk: said by that reload's reply only)."""
    root = small_vault(tmp_path / "v")
    missing = tmp_path / "not-there.gguf"
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config(embedding=missing))
    with d:
        e = embedding_failed(d)
        assert "does not exist" in e["reason"] and d.call(
            "search", query="kanban", mode="hybrid")["degraded"] is True
        before = d.config.read_text()
        for bad in (str(tmp_path / "nor-this.gguf"), "no-such-model"):
            r = ragctl("--config", d.config, "models", "use", bad)
            assert r.returncode == 2 and "cannot be used" in r.stderr, r.stdout + r.stderr
            assert "left as it was" in r.stderr and d.config.read_text() == before
        assert d.call("status")["engines"]["embedding"]["model"] == str(missing)
        r = ragctl("--config", d.config, "models", "use", str(EMBED_MODEL))
        assert r.returncode == 0 and "preparing the embedding model" in r.stdout, r.stdout
        st = wait_embedded(d)  # no restart
        e = st["engines"]["embedding"]
        assert e["model_path"] == str(EMBED_MODEL) and e["vectors"] == st["sources"][0]["chunks"]
        r = d.call("search", query="a kanban board with lanes", mode="hybrid", k=3)
        assert r["degraded"] is False and r["results"]
        # and on a running model, a model that cannot be used changes nothing either: no
        # such file, a file that is no GGUF, a cross-encoder (a fresh-user walk: the last two
        # were taken, "switching" for good or to vectors that mean nothing)
        readme = tmp_path / "README.md"
        readme.write_text("# models\n")
        for bad, why in ((missing, "does not exist"), (readme, "is not a GGUF model file"),
                         (RERANK_MODEL, "is a reranker")):
            before = d.config.read_text()
            r = ragctl("--config", d.config, "models", "use", str(bad))
            assert r.returncode == 2 and d.config.read_text() == before
            assert why in r.stderr, r.stderr
            st = d.call("status")
            e2 = st["engines"]["embedding"]
            assert e2["model_path"] == str(EMBED_MODEL) and e2["space"] == e["space"]
            assert "switch" not in e2
            assert not [h for h in st["hints"] if "embedding.model" in h], st["hints"]
        good = d.config.read_text()
        d.config.write_text(good.replace(str(EMBED_MODEL), str(readme)))
        res = d.call("reload")
        assert "is not a GGUF model file" in res["embedding_error"]
        hint = [h for h in d.call("status")["hints"] if "embedding.model" in h]
        assert len(hint) == 1 and "is not a GGUF model file" in hint[0] and \
            "the model in use stays" in hint[0], hint
        r = ragctl("--config", d.config, "models")
        assert r.returncode == 0 and "warning: the config file's embedding.model" in r.stdout
        r = ragctl("--config", d.config, "status")
        assert "is not a GGUF model file" in r.stdout, r.stdout
        d.config.write_text(good)
        d.call("reload")
        assert not [h for h in d.call("status")["hints"] if "embedding.model" in h]
        assert not d.call("models")["config_problems"]


def test_a_model_that_failed_to_prepare_is_tried_again_by_a_reload(make_daemon, tmp_path):
    """The configured model could not be had at start (its file not there yet, no network for
    the default one): once it can, `ragctl reload` prepares it, the config unchanged — before,
    only a restart did."""
    root = small_vault(tmp_path / "v")
    later = tmp_path / "models" / "later.gguf"
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config(embedding=later))
    with d:
        e = embedding_failed(d)
        assert "ragctl models use PATH.gguf" in e["reason"]  # what to do about it
        r = ragctl("--config", d.config, "reload")
        assert r.returncode == 0, r.stderr  # tried again: still not there
        e = embedding_failed(d)
        later.parent.mkdir()
        later.symlink_to(EMBED_MODEL)
        r = ragctl("--config", d.config, "reload")
        assert r.returncode == 0 and "preparing the embedding model" in r.stdout, r.stdout
        st = wait_embedded(d)
        assert st["engines"]["embedding"]["vectors"] == st["sources"][0]["chunks"]
        assert d.call("search", query="kanban", mode="hybrid")["degraded"] is False
