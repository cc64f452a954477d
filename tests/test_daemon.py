"""The real daemon on a copy of a real vault, driven over its real socket and through ragctl."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import BM25_ONLY, ragctl, small_vault
from ragd import protocol as P

PHRASE = "chrono library reads dates very flexibly"
NOTE = "Queries/Filters.md"


def phrase_line(path) -> int:
    for i, line in enumerate(open(path, encoding="utf-8"), 1):
        if "reads dates very flexibly" in line:
            return i
    raise AssertionError("phrase not in the note")


def test_phrase_comes_back_first_with_path_and_lines(make_daemon, tmp_path):
    with make_daemon() as d:
        st = d.wait_idle()
        src = st["sources"][0]
        assert src["name"] == "obsidian-tasks-docs"
        assert src["files"] == 118 and src["chunks"] > 118 and src["failed"] == 0

        res = d.call("search", query=PHRASE, k=5)
        top = res["results"][0]
        note = tmp_path / "vaults" / "obsidian-tasks-docs" / NOTE
        assert top["path"] == str(note)
        assert os.path.isabs(top["path"])
        line = phrase_line(note)
        assert top["line_start"] <= line <= top["line_end"]
        # The line range points at exactly the chunk's text in the file.
        lines = note.read_text(encoding="utf-8").split("\n")
        assert "\n".join(lines[top["line_start"] - 1: top["line_end"]]).strip() == top["text"]
        assert res["results"][0]["score"] > res["results"][1]["score"]
        only = d.call("search", query=PHRASE, k=5, sources=["obsidian-tasks-docs"])["results"]
        assert [r["path"] for r in only] == [r["path"] for r in res["results"]]


def test_ragctl_commands_and_json_shapes(make_daemon, tmp_path):
    with make_daemon() as d:
        d.wait_idle()
        cfg = str(d.config)
        r = ragctl("--config", cfg, "search", "--json", PHRASE, "-k", "3")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert set(out) >= {"query", "mode", "elapsed_ms", "results"}
        assert out["query"] == PHRASE and out["mode"] == "bm25" and len(out["results"]) == 3
        for hit in out["results"]:
            assert set(hit) >= {"path", "source", "line_start", "line_end", "heading", "score",
                                "text"}
            assert 1 <= hit["line_start"] <= hit["line_end"]
        assert out["results"][0]["path"].endswith(NOTE)

        r = ragctl("--config", cfg, "status", "--json")
        st = json.loads(r.stdout)
        assert st["pid"] == d.proc.pid and st["pending"] == 0
        assert st["sources"][0]["files"] == 118 and st["sources"][0]["chunks"] > 0

        r = ragctl("--config", cfg, "search", PHRASE)  # human output
        assert r.returncode == 0 and NOTE in r.stdout.splitlines()[1]  # title, then path:line
        r = ragctl("--socket", str(d.socket), "sources")
        assert "obsidian-tasks-docs" in r.stdout and "obsidian" in r.stdout
        r = ragctl("--config", cfg, "reindex", "--source", "nope")
        assert r.returncode == 1 and "no source named 'nope'" in r.stderr
        # a source's name in another case means it (ragd/config.py: Config.named)
        r = ragctl("--config", cfg, "search", "--json", "--source", "Obsidian-Tasks-Docs",
                   PHRASE, "-k", "1")
        assert r.returncode == 0 and json.loads(r.stdout)["results"][0]["path"].endswith(NOTE)
        r = ragctl("--config", cfg, "reindex", "--json", "--source", "OBSIDIAN-tasks-docs")
        assert json.loads(r.stdout) == {"queued": ["obsidian-tasks-docs"]}
        d.wait_idle()
        assert d.call("status")["totals"]["files_indexed"] == 2 * 118


def test_ragctl_when_not_running(tmp_path):
    sock = tmp_path / "nothing.sock"
    r = ragctl("--socket", sock, "status")  # (sources reads the config file when ragd is down)
    assert r.returncode != 0
    assert r.stderr.strip().count("\n") == 0
    assert "ragd is not running" in r.stderr
    # nothing to stop is what a stop asks for: exit 0, so `ragctl stop && ragctl start` starts
    r = ragctl("--socket", sock, "stop")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.strip().count("\n") == 0 and "nothing to stop" in r.stdout, r.stdout
    assert "ragctl start" not in r.stdout
    # search exits 1 when nothing is relevant, as grep does; an error is 2, as grep's
    for cmd in (["search", "x"], ["related", "--text", "x"]):
        r = ragctl("--socket", sock, *cmd)
        assert r.returncode == 2 and "not running" in r.stderr, (cmd, r.returncode, r.stderr)


def test_ragctl_start_stop_and_environment_lookup(make_daemon, tmp_path):
    d = make_daemon()  # writes the config; ragctl starts it
    env = dict(os.environ, RAGD_CONFIG=str(d.config))
    r = ragctl("start", env=env)
    assert r.returncode == 0, r.stderr
    assert "ragd started" in r.stdout
    try:
        r = ragctl("start", env=env)
        assert "already running" in r.stdout
        env2 = dict(os.environ, RAGD_SOCKET=str(d.socket))
        r = ragctl("status", "--json", env=env2)
        pid = json.loads(r.stdout)["pid"]
        # XDG lookup: a config at $XDG_CONFIG_HOME/ragd/config.toml
        xdg = tmp_path / "xdg"
        (xdg / "ragd").mkdir(parents=True)
        (xdg / "ragd" / "config.toml").write_text(d.config.read_text())
        env3 = {k: v for k, v in os.environ.items() if not k.startswith("RAGD_")}
        env3["XDG_CONFIG_HOME"] = str(xdg)
        r = ragctl("status", "--json", env=env3)
        assert json.loads(r.stdout)["pid"] == pid
    finally:
        r = ragctl("stop", env=env)
    assert r.returncode == 0 and "stopped" in r.stdout
    # it has exited (gone, or a zombie its parent, init, has not reaped yet)
    from ragctl.lifecycle import _alive
    assert not _alive(pid)
    assert not d.socket.exists()


@pytest.mark.slow
def test_ragctl_start_reports_a_config_error(tmp_path):
    """Exit 2, as the README says of a config that cannot be used: a key ragd does not know
    and a value it refuses (that one was exit 1: only ragd's own check saw it)."""
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[daemon]\ndata_dir = "%s"\nsokcet = "x"\n' % (tmp_path / "d"))
    r = ragctl("--config", cfg, "start")
    assert r.returncode == 2
    assert "sokcet" in r.stderr and str(cfg) in r.stderr
    cfg.write_text('[daemon]\ndata_dir = "%s"\nsocket = "%s"\n[search]\nk = 0\n'
                   % (tmp_path / "d", tmp_path / "s.sock"))
    r = ragctl("--config", cfg, "start")
    assert r.returncode == 2 and "search.k" in r.stderr, r.stderr


def test_ragctl_errors_name_a_missing_config_and_are_json_with_json(make_daemon, tmp_path):
    """A --config (or $RAGD_CONFIG) that does not exist is said, not taken for the default
    config; with --json an error is one JSON object on stderr ({"error": code, "message"}),
    stdout staying empty."""
    missing = tmp_path / "typo.toml"
    r = ragctl("--config", missing, "status")
    assert r.returncode == 2 and r.stderr == f"ragctl: {missing}: config file not found\n"
    r = ragctl("status", env={**os.environ, "RAGD_CONFIG": str(missing)})
    assert r.returncode == 2 and "config file not found" in r.stderr
    r = ragctl("--config", missing, "status", "--json")
    assert r.returncode == 2 and json.loads(r.stderr)["error"] == "bad_config"
    r = ragctl("--config", missing, "search", "", "--json")  # a wrong command line
    assert r.returncode == 2 and json.loads(r.stderr)["error"] == "bad_args"
    # argparse's errors too: one line, or one JSON object (they were its usage and the error)
    r = ragctl("--config", missing, "search", "--json", "--mode", "fuzzy", "x")
    err = json.loads(r.stderr)
    assert r.returncode == 2 and err["error"] == "bad_args" and "fuzzy" in err["message"]
    r = ragctl("search", "-k", "abc", "x")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith(
        "ragctl search: argument -k: invalid int value: 'abc'"), r.stderr
    # an argument that is not UTF-8 (a Latin-1 name): one line, not a traceback (but get's
    # path, which may name such a file: test_faults, a name that is not UTF-8)
    for args in ([b"search", b"caf\xff"], [b"search", b"x", b"--path", b"Odd/bad\xff*"],
                 [b"get", b"/x/name.md", b"--socket", b"/x/bad\xff.sock"]):
        r = subprocess.run([sys.executable, "-m", "ragctl", "--config", str(missing), *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "\\xff" in r.stderr and "is not valid UTF-8" in r.stderr, r.stderr
    with make_daemon() as d:
        r = ragctl("--config", d.config, "ask", "what is due", "-k", "0", "--json")
        assert r.returncode == 2 and r.stdout == ""  # a value ragd refused: bad_args
        err = json.loads(r.stderr)
        assert err["error"] == "bad_args" and "'k' must be between" in err["message"]
        r = ragctl("--config", d.config, "ask", "what is due", "-k", "0")
        assert r.stderr.startswith("ragctl: ask: 'k' must be between") and "(bad_args)" in r.stderr


def test_a_config_that_is_a_folder_is_a_config_error(make_daemon, tmp_path):
    """--config (or the default config) naming a folder: ragctl said "cannot read: Is a
    directory", the commands that edit the config an OS error ("[Errno 21] ...", not a
    config error), and `service install --socket S` wrote a unit that ran ragd on the
    folder. Now one config error everywhere, exit 2, naming the config.toml inside when there
    is one; --socket still reaches a running daemon, and ragd itself refuses the folder."""
    folder = tmp_path / "conf"
    folder.mkdir()
    said = f"{folder}: is a folder, not a config file"
    for cmd in (["status"], ["start"], ["sources"]):
        r = ragctl("--config", folder, *cmd)
        assert r.returncode == 2 and r.stderr == f"ragctl: {said}\n", (cmd, r.stderr)
    r = ragctl("--config", folder, "status", "--json")
    assert r.returncode == 2 and json.loads(r.stderr) == {"error": "bad_config",
                                                          "message": said}
    xdg = tmp_path / "xdg"
    (xdg / "ragd" / "config.toml").mkdir(parents=True)  # the default config, a folder
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGD_")}
    env["XDG_CONFIG_HOME"] = str(xdg)
    r = ragctl("status", env=env)
    assert r.returncode == 2 and "config.toml: is a folder, not a config file" in r.stderr
    (folder / "config.toml").write_text("")
    said += f" (did you mean {folder / 'config.toml'}?)"
    r = subprocess.run([sys.executable, "-m", "ragd", "--config", str(folder)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.strip() == f"ragd: config error: {said}"
    with make_daemon() as d:
        nowhere = tmp_path / "none.sock"  # not running: these read (or edit) the config
        for cmd in (["sources"], ["sources", "add", str(tmp_path)], ["sources", "remove", "x"],
                    ["service", "install", "--no-start"]):
            r = ragctl("--socket", nowhere, "--config", folder, "--json", *cmd, env=env)
            assert r.returncode == 2, (cmd, r.stdout, r.stderr)
            assert json.loads(r.stderr) == {"error": "bad_config", "message": said}, cmd
        assert not (xdg / "systemd").exists()  # no unit naming a folder
        r = ragctl("--socket", d.socket, "--config", folder, "status", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["pid"] == d.proc.pid, r.stderr


def test_a_refused_reload_is_logged_and_changes_nothing(make_daemon, tmp_path):
    """ragctl reload with a bad config: an error reply, the daemon goes on with the config in
    force, and its log says why (as it does for a SIGHUP)."""
    with make_daemon() as d:
        good = d.config.read_text()
        d.config.write_text(good + "\n[search]\nnote_weight = -1\nk = 0\n")
        with pytest.raises(P.DaemonError) as e:
            d.call("reload")
        # every bad setting named at once, not one per reload
        assert e.value.code == "bad_config" and "note_weight" in e.value.message
        assert "search.k must be between 1 and 1000, got 0" in e.value.message
        assert d.call("ping")["pid"] == d.proc.pid
        log = (tmp_path / "data" / "ragd.log").read_text()
        assert "reload: " in log and "note_weight must be between 0 and 10" in log
        d.config.write_text(good)
        d.call("reload")


def test_a_reload_reaches_every_part_that_reads_the_config(make_daemon, tmp_path):
    """A reload swaps in a new config (it is immutable): the ops (search.k), the ranking
    (search.note_weight), the indexer (index.max_file_bytes) and the editors' buffers
    (buffers.max_per_client) each read the new one; a restart setting is only named."""
    root = tmp_path / "n"
    root.mkdir()
    for i in range(6):
        (root / f"quokka {i}.md").write_text(f"# Quokka {i}\n\nA quokka note, number {i}.\n")
    d = make_daemon(sources=[{"name": "n", "path": str(root)}])
    with d:
        d.wait_idle()
        before = d.call("search", query="quokka")["results"]
        assert len(before) == 6
        with d.client() as editor:
            editor.call("buffer_set", path=str(root / "quokka 0.md"), text="# Q\n\nquokka\n")
            editor.call("buffer_set", path=str(root / "quokka 1.md"), text="# Q\n\nquokka\n")
        d.config.write_text(d.config.read_text() + "\n[search]\nk = 2\nnote_weight = 0.0\n"
                            "[index]\nmax_file_bytes = 200\n[buffers]\nmax_per_client = 1\n"
                            "[engines]\nthreads = 1\n")
        res = d.call("reload")
        assert set(res["applied"]) == {"search.k", "search.note_weight", "index.max_file_bytes",
                                       "buffers.max_per_client"}
        assert res["restart_needed"] == ["engines.threads"]
        # and status says so until then (a fresh-user walk found it said once, then forgotten)
        assert any("engines.threads, which takes effect at the next start" in h
                   for h in d.call("status")["hints"])
        after = d.call("search", query="quokka")["results"]
        assert len(after) == 2  # the ops' default k
        # the note's whole-text score no longer counts: the ranking's own config is the new one
        score = {h["path"]: h["score"] for h in before}
        assert all(h["score"] < score[h["path"]] for h in after)
        (root / "big.md").write_text("# Big\n\nquokka wombat " + "words " * 100 + "\n")
        d.wait_idle()
        assert d.call("search", query="wombat")["results"] == []  # skipped: over 200 bytes
        with d.client() as editor:
            editor.call("buffer_set", path=str(root / "quokka 0.md"), text="# Q\n\nquokka\n")
            with pytest.raises(P.DaemonError) as e:
                editor.call("buffer_set", path=str(root / "quokka 1.md"), text="# Q\n")
            assert "max_per_client = 1" in e.value.message
        assert d.call("status")["pid"] == d.proc.pid


def test_second_daemon_is_refused_with_pid(make_daemon, tmp_path):
    with make_daemon() as d:
        second = subprocess.run([sys.executable, "-m", "ragd", "--config", str(d.config)],
                                capture_output=True, text=True, timeout=30)
        assert second.returncode == 1
        assert second.stderr.strip() == (
            f"ragd: ragd is already running (pid {d.proc.pid}) on data dir "
            f"{tmp_path / 'data'}; stop it with 'ragctl stop' first")
        assert d.call("ping")["pid"] == d.proc.pid  # the first one is unharmed


def test_stop_and_restart_keeps_the_index(make_daemon):
    d = make_daemon()
    with d:
        d.wait_idle()
        before = d.call("search", query=PHRASE, k=3)["results"]
        chunks = d.call("status")["sources"][0]["chunks"]
        # SIGTERM is a clean stop: exit 0, socket removed.
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(20) == 0
        assert not d.socket.exists()
    with d:
        st = d.wait_idle()
        # Nothing changed on disk, so nothing was read, let alone re-chunked.
        assert st["totals"]["files_indexed"] == 0
        assert st["sources"][0]["chunks"] == chunks
        after = d.call("search", query=PHRASE, k=3)["results"]
        assert [(r["path"], r["line_start"]) for r in after] == \
            [(r["path"], r["line_start"]) for r in before]


def test_changes_while_stopped_are_picked_up_on_start(make_daemon, tmp_path):
    d = make_daemon()
    vault = tmp_path / "vaults" / "obsidian-tasks-docs"
    with d:
        d.wait_idle()
    (vault / "new note.md").write_text("# Zebra crossing\n\nThe quokka sat by the zebra crossing.\n")
    os.remove(vault / NOTE)
    # renamed while stopped: the scan finds it by its content's hash, a move (not read into
    # chunks again)
    renamed = sorted(p for p in vault.glob("*.md") if p.name not in (NOTE, "new note.md"))[0]
    renamed.rename(vault / "Renamed while stopped.md")
    with d:
        st = d.wait_idle()
        assert st["totals"]["files_indexed"] == 1 and st["totals"]["files_removed"] == 1
        assert st["totals"]["files_moved"] == 1
        assert d.call("get", path=str(vault / "Renamed while stopped.md"))["path"]
        hits = d.call("search", query="quokka", k=3)["results"]
        assert hits[0]["path"] == str(vault / "new note.md") and hits[0]["line_start"] == 3
        hits = d.call("search", query=PHRASE, k=10)["results"]
        assert all(not h["path"].endswith(NOTE) for h in hits)


def test_chunking_or_kind_changed_while_stopped_reads_every_file_again(make_daemon, tmp_path):
    """A reload re-chunks when the chunk size changes; a config edited while ragd was stopped
    must do the same at the next start (it used to keep every note's old chunks), and a start
    with nothing changed must still read nothing."""
    d = make_daemon()
    with d:
        chunks = d.wait_idle()["sources"][0]["chunks"]
    text = d.config.read_text()
    d.config.write_text(text + "\n[index]\nchunk_tokens = 96\n")
    with d:
        st = d.wait_idle()
        assert st["totals"]["files_indexed"] == 118
        assert st["sources"][0]["chunks"] > chunks
        rechunked = st["sources"][0]["chunks"]
    assert "chunk_tokens changed since it was read: reading every file again" in \
        d.log.read_text()
    db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
    reading = json.loads(db.execute("SELECT value FROM meta WHERE key = 'reading'").fetchone()[0])
    db.close()
    assert reading["obsidian-tasks-docs"]["chunk_tokens"] == 96
    with d:  # the same config again: nothing is read
        st = d.wait_idle()
        assert st["totals"]["files_indexed"] == 0 and st["sources"][0]["chunks"] == rechunked
    # the source's kind changed while stopped (its notes parsed as plain Markdown): read again
    d.config.write_text(d.config.read_text().replace('kind = "obsidian"', 'kind = "folder"'))
    with d:
        st = d.wait_idle()
        assert st["totals"]["files_indexed"] == 118 and st["sources"][0]["kind"] == "folder"


def test_bad_files_are_skipped_with_reasons_and_the_daemon_lives(make_daemon, tmp_path):
    root = tmp_path / "docs"
    root.mkdir()
    (root / "good.md").write_text("The okapi grazes in the forest.\n")
    (root / "binary.md").write_bytes(b"\x00\x01\x02 okapi")
    (root / "latin1.txt").write_bytes("caf\xe9 okapi menu".encode("latin-1"))
    (root / "big.txt").write_text("okapi " * 3000)
    (root / "dangling.md").symlink_to(root / "missing-target.md")
    (root / "dangling-out.md").symlink_to(tmp_path / "nowhere" / "x.md")  # (was "outside")
    d = make_daemon(sources=[{"name": "docs", "path": str(root), "kind": "folder"}],
                    extra=BM25_ONLY + "[index]\nmax_file_bytes = 10000")
    with d:
        st = d.wait_idle()
        s = st["sources"][0]
        assert (s["files"], s["skipped"], s["failed"]) == (2, 4, 0)
        import sqlite3
        db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
        reasons = dict(db.execute("SELECT relpath, reason FROM files"))
        assert reasons["binary.md"] == "binary file (contains NUL bytes)"
        assert reasons["big.txt"].startswith("too large")
        assert reasons["dangling.md"] == reasons["dangling-out.md"] == "broken symlink"
        assert reasons["latin1.txt"].startswith("invalid UTF-8")
        assert reasons["good.md"] is None
        hits = d.call("search", query="okapi", k=10)["results"]
        assert {os.path.basename(h["path"]) for h in hits} == {"good.md", "latin1.txt"}


def test_sigterm_during_initial_index_leaves_a_consistent_index(make_daemon, tmp_path):
    d = make_daemon(vaults=("dwarvesf-brain",))
    d.start()
    deadline = time.monotonic() + 30
    while True:  # stop it part way: some files indexed, not all
        st = d.call("status")
        if st["totals"]["files_indexed"] > 0:
            break
        assert time.monotonic() < deadline
    assert not st["idle"]
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    import sqlite3
    db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
    n_chunks = db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    n_fts = db.execute("SELECT COUNT(*) FROM chunks_fts").fetchone()[0]
    assert n_chunks == n_fts
    assert db.execute("SELECT COUNT(*) FROM chunks c LEFT JOIN files f ON f.id = c.file_id "
                      "WHERE f.id IS NULL").fetchone()[0] == 0
    assert db.execute("INSERT INTO chunks_fts(chunks_fts) VALUES('integrity-check')") is not None
    db.close()
    with d:
        st = d.wait_idle()
        assert st["sources"][0]["files"] + st["sources"][0]["skipped"] == 885


def test_a_storm_of_signals_never_wedges_the_main_thread(make_daemon, tmp_path):
    """Signal handlers only write to a pipe. They used to set threading.Events: a signal
    landing while the main thread held that Event's lock (entering or leaving its wait)
    deadlocked it, and the daemon never stopped (CI: a SIGTERM right after start). Hundreds
    of SIGHUPs, then SIGTERM: every reload is answered or coalesced, and the stop is prompt."""
    d = make_daemon(vaults=(), sources=[])
    d.start()
    try:
        for _ in range(5):
            for _ in range(300):
                d.proc.send_signal(signal.SIGHUP)
            assert d.call("ping")  # alive, answering, between the storms
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(20) == 0
    finally:
        d.kill()
    log = (tmp_path / "data" / "ragd.log").read_text()
    assert "stopping" in log and "reloaded" in log


def test_a_signal_taken_by_any_thread_stops_the_daemon(make_daemon, tmp_path):
    """The kernel hands a process's signal to any of its threads. Python runs the handler on
    the main thread only when that thread runs bytecode, and it sleeps in os.read: a SIGTERM
    taken by another thread left the daemon asleep for good (CI: 1 stop right after start in
    15). Here SIGHUP, then SIGTERM, go to each thread that is not the main one in turn
    (tgkill): the reload happens and the stop is prompt."""
    import ctypes

    tgkill = ctypes.CDLL(None, use_errno=True).tgkill
    d = make_daemon(vaults=(), sources=[])
    d.start()
    try:
        pid = d.proc.pid
        others = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
        assert others  # the daemon's threads (server, indexer, watcher...)
        log = tmp_path / "data" / "ragd.log"
        assert tgkill(pid, others[0], signal.SIGHUP) == 0
        deadline = time.monotonic() + 10
        while "reloaded" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "reloaded" in log.read_text()
        for tid in others:  # threads may have ended meanwhile: ESRCH is fine
            if tgkill(pid, tid, signal.SIGTERM) == 0:
                break
        assert d.proc.wait(10) == 0
    finally:
        d.kill()


def test_the_wait_op_waits_for_a_fresh_text_index_to_fill(make_daemon, tmp_path):
    """`wait` (what ragctl and the tests use to know the index has nothing left to do) also
    waits for a tantivy index being filled: FTS5 answers meanwhile, in another order (CI: an
    editor test compared a search made then with one made after, and failed)."""
    import sqlite3
    d = make_daemon(vaults=("obsidian-tasks-docs",))
    with d:
        d.wait_idle()
    # as after an upgrade to another index format: nothing to index, the whole index to refill
    db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
    with db:
        db.execute("UPDATE meta SET value = 'an older format' WHERE key = 'text_index'")
    db.close()
    with d:
        d.wait_idle()
        res = d.call("search", query="custom statuses", k=5, mode="bm25")
        assert res["bm25_index"] == "tantivy", res["bm25_index"]


def test_status_says_embedding_while_a_batch_is_in_flight():
    """Its texts deleted meanwhile (a 5 MB note removed while embedded), nothing waits, but
    the engine is still on the last batch: the header said "idle" while the engine's line said
    "(embedding)" (a fresh-user walk)."""
    from ragd.ops.status import doing

    engines = {"embedding": {"state": "ready", "embedder": "embedding", "pending_texts": 0}}
    assert doing("idle", 0, engines, None) == "embedding"
    engines["embedding"]["embedder"] = "idle"
    assert doing("idle", 0, engines, None) == "idle"
    engines["embedding"]["pending_texts"] = 12
    assert doing("idle", 0, engines, None) == "embedding (12 texts to go)"


def test_a_reload_says_what_will_not_work(make_daemon, tmp_path):
    """A fresh-user walk configured one folder as a second source (every note then came back
    twice: `sources added`, nothing else said), a folder inside a source (said in status
    only), and a generator whose file was not there (found at the next start only; `ask` said
    no generator was configured, as if the setting were not there)."""
    root = small_vault(tmp_path / "v")
    (root / "sub").mkdir()
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}])
    with d:
        d.wait_idle()
        text = d.config.read_text()
        d.config.write_text(text + f'\n[[sources]]\nname = "twice"\npath = "{root}/"\n')
        with pytest.raises(P.DaemonError) as e:
            d.call("reload")
        assert e.value.code == P.BAD_CONFIG and "are the same folder" in e.value.message
        chat = tmp_path / "chat.gguf"
        d.config.write_text(text + f'\n[[sources]]\nname = "inner"\npath = "{root / "sub"}"\n'
                            f'\n[generator]\nmodel = "{chat}"\n')
        res = d.call("reload")
        assert res["added"] == ["inner"] and res["restart_needed"] == ["generator.model"]
        assert [o for o in res["overlaps"] if "'inner'" in o and "inside source 'v'" in o]
        assert res["next_start"] == [f"generator.model: model file {chat} does not exist"]
        with pytest.raises(P.DaemonError) as e:
            d.call("ask", question="what is a kanban board?")
        assert e.value.code == P.UNAVAILABLE and "takes effect at the next start" in \
            e.value.message and "it cannot serve: model file" in e.value.message, \
            e.value.message
        # said until a reload no longer names it, not only in that reload's reply
        assert [h for h in d.call("status")["hints"] if "generator.model: model file" in h]
        r = ragctl("--config", d.config, "reload")  # the overlap said once, the model until fixed
        assert r.returncode == 0 and "inside source" not in r.stdout, r.stdout
        assert f"warning: generator.model: model file {chat} does not exist (its engine will " \
               f"not start)" in r.stdout, r.stdout
        # removed, the inner source is not promised a way back that `sources add` refuses
        r = ragctl("--config", d.config, "sources", "remove", "inner")
        assert r.returncode == 0 and "overlaps the source 'v'" in r.stdout and \
            "by hand" in r.stdout, r.stdout
        r = ragctl("--config", d.config, "sources", "add", str(root / "sub"), "--name", "inner")
        assert r.returncode == 2 and "is inside the source 'v'" in r.stderr, r.stderr
