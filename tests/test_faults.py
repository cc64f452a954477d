"""The fault suite: the real daemon (and engine) meeting what goes wrong on real machines.

Each case here failed on the daemon before these faults were handled. bench/faults.py runs the
same cases at full size (20 kills on obsidian-hub, 10,000 frames, 200 clients) and prints the
figures; here each is kept short.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import sqlite3
import stat
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import pytest

from conftest import (engine_config, make_pdf, no_dac, small_vault, wait_embedded)
from ragd import protocol as P
from ragd.ops import ARGS


def db_of(tmp_path: Path) -> sqlite3.Connection:
    # autocommit: the integrity-check INSERT must not leave a write transaction open
    return sqlite3.connect(tmp_path / "data" / "index.sqlite3", isolation_level=None)


def no_restarts(st: dict) -> None:
    bad = [t for t in st["threads"] if t["restarts"]]
    assert not bad, f"threads restarted: {bad}"


def consistent(db: sqlite3.Connection) -> None:
    """chunks == FTS rows, counts kept by the triggers == what is there, integrity ok."""
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    n = db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    assert n == db.execute("SELECT COUNT(*) FROM chunks_fts").fetchone()[0]
    db.execute("INSERT INTO chunks_fts (chunks_fts) VALUES ('integrity-check')")
    kept = dict(((s, k), v) for s, k, v in db.execute("SELECT source, key, n FROM counts"))
    for (source, key), v in kept.items():
        if key == "chunks":
            real = db.execute("SELECT COUNT(*) FROM chunks c JOIN files f ON f.id = c.file_id "
                              "WHERE f.source = ?", (source,)).fetchone()[0]
        else:
            real = db.execute("SELECT COUNT(*) FROM files WHERE source = ? AND status = ?",
                              (source, key)).fetchone()[0]
        assert v == real, (source, key, v, real)


# -- odd files -----------------------------------------------------------------------------------

def test_odd_names_and_odd_files_never_stop_indexing(make_daemon, tmp_path):
    """A name that is not UTF-8, a newline in a name, a FIFO, a symlink loop and a 50 MB file,
    found by the first scan and while watching: each is indexed or skipped with its reason, and
    indexing goes on (before, the first one stopped the indexer for good and a FIFO blocked it
    forever)."""
    root = tmp_path / "notes"
    root.mkdir()
    raw_root = os.fsencode(root)
    with open(os.path.join(raw_root, b"caf\xe9 latin1.md"), "wb") as f:
        f.write(b"# Cafe\n\nThe word zanzibarite lives here.\n")
    (root / "new\nline.md").write_text("# Newline\n\nThe word quillwort lives here.\n")
    os.mkfifo(root / "pipe.md")
    (root / "loop.md").symlink_to(root / "loop.md")
    with open(root / "huge.md", "wb") as f:
        f.truncate(50 * 1024 * 1024)  # sparse: 50 MB that costs no disk
    (root / "plain.md").write_text("# Plain\n\nThe word okapi lives here.\n")
    d = make_daemon(sources=[{"name": "n", "path": str(root)}])
    with d:
        st = d.wait_idle()
        # and the same while watching
        with open(os.path.join(raw_root, b"na\xefve \xff.md"), "wb") as f:
            f.write(b"# Naive\n\nThe word brontosaurine lives here.\n")
        os.mkfifo(root / "pipe2.md")
        (root / "after.md").write_text("# After\n\nThe word marzipanic lives here.\n")
        deadline = time.monotonic() + 20
        while not d.call("search", query="marzipanic", mode="bm25")["results"]:
            assert time.monotonic() < deadline, "indexing stopped"
            time.sleep(0.05)
        st = d.wait_idle()
        no_restarts(st)
        assert st["indexer"] == "idle"
        for word, name in [("zanzibarite", "caf\ufffd latin1.md"), ("quillwort", "new\nline.md"),
                           ("brontosaurine", "na\ufffdve \ufffd.md"), ("okapi", "plain.md")]:
            hits = d.call("search", query=word, mode="bm25")["results"]
            assert hits and Path(hits[0]["path"]).name == name, (word, hits)
        files = {Path(f["path"]).name: f for f in d.call("files")["files"]}
        assert files["pipe2.md"]["status"] == "skipped"
        assert files["pipe2.md"]["reason"] == "not a regular file (a FIFO)"
        assert files["loop.md"]["reason"] == "symlink loop"
        assert files["huge.md"]["reason"].startswith("too large (52428800 bytes")
        assert files["caf\ufffd latin1.md"]["status"] == "indexed"
    consistent(db_of(tmp_path))




def test_a_name_that_is_not_utf8_can_be_fetched(make_daemon, tmp_path):
    """A note whose name (or folder's) is not UTF-8 is found; its result's path shows each such
    byte as U+FFFD and `path_bytes` holds the exact bytes: get takes either (the printed one
    while no other name prints alike), and so does `ragctl get` given the name by the shell
    (before: get of the printed path was not_found, and the bytes could not be given)."""
    root = tmp_path / "notes"
    root.mkdir()
    raw = os.fsencode(root)
    os.mkdir(os.path.join(raw, b"dossi\xe9r"))
    notes = {b"caf\xe9 latin1.md": "zanzibarite", b"dossi\xe9r/na\xefve.md": "brontosaurine",
             b"a\xe9.md": "quillwort", b"a\xe8.md": "quillwort"}  # the last two print alike
    for name, word in notes.items():
        with open(os.path.join(raw, name), "wb") as f:
            f.write(f"# Note\n\nThe word {word} lives here.\n".encode())
    d = make_daemon(sources=[{"name": "n", "path": str(root)}])
    with d:
        d.wait_idle()
        import base64
        for name, word in notes.items():
            hits = [h for h in d.call("search", query=word, mode="bm25", k=5)["results"]
                    if base64.b64decode(h.get("path_bytes", "")) == raw + b"/" + name]
            assert len(hits) == 1, (name, hits)
            hit = hits[0]
            assert hit["path"] == os.fsencode(hit["path"]).decode() and "\ufffd" in hit["path"]
            got = d.call("get", path_bytes=hit["path_bytes"])
            assert word in got["text"] and got["path_bytes"] == hit["path_bytes"]
            if name in (b"a\xe9.md", b"a\xe8.md"):  # which of the two is not said
                with pytest.raises(P.DaemonError) as e:
                    d.call("get", path=hit["path"])
                assert e.value.code == P.NOT_FOUND
            else:
                assert word in d.call("get", path=hit["path"], line_start=3)["text"]
            r = subprocess.run([sys.executable, "-m", "ragctl", "--config", str(d.config),
                                "get", raw + b"/" + name], capture_output=True, timeout=60)
            assert r.returncode == 0 and word.encode() in r.stdout, r.stderr
        files = {base64.b64decode(f["path_bytes"]) for f in d.call("files")["files"]}
        assert files == {raw + b"/" + n for n in notes}
        for bad in ("not base64!", base64.b64encode(b"relative/name.md").decode()):
            with pytest.raises(P.DaemonError) as e:
                d.call("get", path_bytes=bad)
            assert e.value.code == P.BAD_ARGS, e.value
        with pytest.raises(P.DaemonError) as e:
            d.call("get", path=str(root / "x.md"), path_bytes=hit["path_bytes"])
        assert e.value.code == P.BAD_ARGS and "either" in e.value.message

def test_related_and_search_l_take_and_give_a_name_that_is_not_utf8(make_daemon, tmp_path):
    """A fresh-user walk's "caf\xe9.md": `ragctl related` refused the name the shell gave
    ("not valid UTF-8") and the printed one ("not indexed"), where get takes both; and
    `search -l` printed it with U+FFFD, a name no file has (`| xargs` failed). related now
    takes path_bytes and the printed name as get does, and -l prints the exact bytes."""
    import base64
    root = tmp_path / "notes"
    root.mkdir()
    raw = os.fsencode(root)
    for name, text in [(b"caf\xe9.md", "A capybara grazes by the river at dusk."),
                       (b"giant.md", "The capybara is the largest living rodent.")]:
        with open(os.path.join(raw, name), "wb") as f:
            f.write(f"# Note\n\n{text}\n".encode())
    d = make_daemon(sources=[{"name": "n", "path": str(root)}], extra=engine_config())
    exact = raw + b"/caf\xe9.md"
    with d:
        wait_embedded(d)
        hit = next(h for h in d.call("search", query="capybara", k=5)["results"]
                   if "path_bytes" in h)
        for how in ({"path_bytes": hit["path_bytes"]}, {"path": hit["path"]}):
            res = d.call("related", **how)
            assert [Path(r["path"]).name for r in res["results"]] == ["giant.md"], (how, res)
        r = subprocess.run([sys.executable, "-m", "ragctl", "--config", str(d.config),
                            "related", "-l", exact], capture_output=True, timeout=60)
        assert r.returncode == 0 and r.stdout.startswith(raw + b"/giant.md:"), r
        r = subprocess.run([sys.executable, "-m", "ragctl", "--config", str(d.config),
                            "search", "-l", "grazes"], capture_output=True, timeout=60)
        assert r.returncode == 0 and r.stdout.splitlines()[0] == exact + b":3", r
        assert base64.b64decode(hit["path_bytes"]) == exact


def test_what_is_not_a_file_is_listed_alike_by_scans_and_events(make_daemon, tmp_path):
    """A FIFO, a link to /dev/zero and a link to a folder, found by the first scan or created
    while watched: each is listed skipped with its reason, and stays so through later scans
    (before, one heard while watched was listed skipped, then vanished from `files` at the
    next scan, and one found by a scan was never listed)."""
    root = tmp_path / "notes"
    (root / "folder").mkdir(parents=True)
    (root / "plain.md").write_text("# Plain\n\nThe word okapi lives here.\n")
    os.mkfifo(root / "pipe.md")
    (root / "zero.md").symlink_to("/dev/zero")
    (root / "dir.md").symlink_to(root / "folder")
    want = {"pipe.md": "not a regular file (a FIFO)",
            "zero.md": "a link to a file outside the source (/dev/zero): ragd does not follow "
                       "links out of its sources",
            "dir.md": "not a regular file (a folder)"}
    d = make_daemon(sources=[{"name": "n", "path": str(root)}])
    with d:
        d.wait_idle()
        os.mkfifo(root / "pipe2.md")
        (root / "zero2.md").symlink_to("/dev/zero")
        (root / "dir2.md").symlink_to(root / "folder")
        (root / "after.md").write_text("# After\n\nThe word marzipanic lives here.\n")
        want.update({k.replace(".md", "2.md"): v for k, v in want.items()})
        deadline = time.monotonic() + 20
        while not d.call("search", query="marzipanic", mode="bm25")["results"]:
            assert time.monotonic() < deadline, "indexing stopped"
            time.sleep(0.05)
        for i in range(3):  # as heard; then after a scan, twice
            d.wait_idle()
            files = {Path(f["path"]).name: f for f in d.call("files")["files"]}
            got = {n: (f["status"], f["reason"]) for n, f in files.items() if n in want}
            assert got == {n: ("skipped", r) for n, r in want.items()}, (i, got)
            assert files["plain.md"]["status"] == files["after.md"]["status"] == "indexed"
            st = d.call("status")
            assert st["sources"][0]["skipped"] == 6 and st["sources"][0]["files"] == 2, st
            d.call("reindex", source="n")
        no_restarts(d.call("status"))

def test_a_file_that_changes_or_vanishes_while_read(tmp_path, monkeypatch):
    """The indexer thread with a file that grows, or is deleted, between its read and its write:
    what was read is written with the stat it was read at (so the next event reads it again),
    and a vanished file is removed only once its absence is seen."""
    from ragd import config
    from ragd.index import store
    from ragd.index.indexer import Indexer
    from ragd.ingest import loader

    root = tmp_path / "notes"
    root.mkdir()
    grow, gone = root / "grow.md", root / "gone.md"
    grow.write_text("# Grow\n\nfirst words\n")
    gone.write_text("# Gone\n\nsoon absent\n")
    cfg = config.from_dict({"daemon": {"data_dir": str(tmp_path / "data")},
                            "sources": [{"name": "n", "path": str(root)}]}, None)
    store.open_store(cfg.db_path).close()
    real_load = loader.load

    def load(src, rel, max_bytes):
        out = real_load(src, rel, max_bytes)
        if rel == "grow.md":
            with open(grow, "a") as f:
                f.write("more words appended while it was read\n")
        elif rel == "gone.md":
            gone.unlink(missing_ok=True)
        return out

    monkeypatch.setattr(loader, "load", load)
    ix = Indexer(cfg, cfg.db_path)
    ix.start()
    try:
        ix.request_scan()
        assert ix.wait_idle(30)
        db = store.connect(cfg.db_path)
        rows = {r["relpath"]: r for r in db.execute("SELECT relpath, size, status FROM files")}
        # grow.md: indexed as read, with the size it had then, so a scan sees it changed
        assert rows["grow.md"]["status"] == "indexed"
        assert rows["grow.md"]["size"] < grow.stat().st_size
        # gone.md: read before it vanished: indexed; the next look sees it gone
        monkeypatch.setattr(loader, "load", real_load)
        ix.request_scan()
        assert ix.wait_idle(30)
        rels = {r[0] for r in db.execute("SELECT relpath FROM files")}
        assert rels == {"grow.md"}
        size = db.execute("SELECT size FROM files").fetchone()[0]
        assert size == grow.stat().st_size
        assert ix.worker.restarts == 0
    finally:
        ix.stop()



class SwapRace:
    """The race of a fault run: V/racedir (in a source) moved aside, a link to an outside
    O/racedir put in its place, removed, and the folder moved back, in a loop on a thread."""

    def __init__(self, root: Path, outside: Path):
        self.root, self.outside = root, outside
        self.stop = threading.Event()
        self.swaps = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        here, held = self.root / "racedir", self.root / ".held"
        while not self.stop.is_set():
            os.rename(here, held)
            os.symlink(self.outside / "racedir", here)
            os.unlink(here)
            os.rename(held, here)
            self.swaps += 1

    def __enter__(self) -> "SwapRace":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)


def test_a_folder_swapped_for_a_link_never_leads_out_of_a_source(make_daemon, tmp_path):
    """A folder of a source swapped for a link to a folder outside it, and back, in a loop,
    while get reads a note in it and the indexer re-reads it: no get ever returns the outside
    file, and the outside text is never indexed (before: get checked the resolved path, then
    opened the path again, and served the outside file in 42 of 2,524 gets; search found the
    outside text in 50 of ~290 searches)."""
    root, outside = tmp_path / "notes", tmp_path / "outside"
    (root / "racedir").mkdir(parents=True)
    (outside / "racedir").mkdir(parents=True)
    note = root / "racedir" / "note.md"
    note.write_text("# Inside\n\nThe word insidious lives here.\n")
    (outside / "racedir" / "note.md").write_text("# Outside\n\nThe word swordfish lives "
                                                  "outside.\n")
    d = make_daemon(sources=[{"name": "n", "path": str(root)}])
    with d:
        d.wait_idle()
        gets = leaks = searches = found = 0
        codes: dict[str, int] = {}
        with SwapRace(root, outside) as race, d.client() as c:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    text = c.call("get", path=str(note))["text"]
                    leaks += "swordfish" in text
                except P.DaemonError as e:
                    codes[e.code] = codes.get(e.code, 0) + 1
                gets += 1
                if gets % 10 == 0:
                    searches += 1
                    found += bool(c.call("search", query="swordfish", mode="bm25")["results"])
        assert race.swaps > 100 and gets > 500, (race.swaps, gets)
        assert leaks == 0 and found == 0, (leaks, gets, found, searches)
        assert set(codes) <= {P.NOT_FOUND, P.FORBIDDEN}, codes  # (mid-swap: not there)
        d.wait_idle()
        assert not d.call("search", query="swordfish", mode="bm25")["results"]
        assert d.call("search", query="insidious", mode="bm25")["results"]
        assert "insidious" in d.call("get", path=str(note))["text"]
        no_restarts(d.call("status"))


def test_a_link_swapped_in_after_the_check_is_not_followed(tmp_path, monkeypatch):
    """The same race, made certain: the folder is swapped for a link to an outside folder just
    after the path was resolved and checked, before it is opened. The read is refused as a
    change (tried again later), for the indexer's read and for get's."""
    from ragd import config
    from ragd.ingest import excerpt, loader, sources

    root, outside = tmp_path / "notes", tmp_path / "outside"
    for base, word in ((root, "insidious"), (outside, "swordfish")):
        (base / "racedir").mkdir(parents=True)
        (base / "racedir" / "note.md").write_text(f"# Note\n\nThe word {word}.\n")
        make_pdf(base / "racedir" / "paper.pdf", [[f"The word {word} in a PDF."]])
    cfg = config.from_dict({"sources": [{"name": "n", "path": str(root)}]}, None)
    src = cfg.sources[0]
    real = sources.real_inside

    def resolved_then_swapped(r, path):
        out = real(r, path)
        if (root / "racedir").is_dir() and not (root / "racedir").is_symlink():
            os.rename(root / "racedir", root / ".held")
            os.symlink(outside / "racedir", root / "racedir")
        return out

    def swapped_back():
        if (root / "racedir").is_symlink():
            os.unlink(root / "racedir")
            os.rename(root / ".held", root / "racedir")

    locate = excerpt.locate

    def located_swapped_back(path, srcs):  # each time get looks again, it is back in place
        swapped_back()
        return locate(path, srcs)

    for name in ("note.md", "paper.pdf"):
        monkeypatch.setattr(sources, "real_inside", resolved_then_swapped)
        with pytest.raises(sources.Swapped) as e:
            loader.load(src, f"racedir/{name}", 1 << 20)
        assert e.value.retry
        # get: swapped back before each look, swapped again before each open
        monkeypatch.setattr(excerpt, "locate", located_swapped_back)
        with pytest.raises(excerpt.Refused) as e:
            excerpt.get_text(str(root / "racedir" / name), cfg.sources, None, None, 1 << 20)
        assert e.value.code == P.NOT_FOUND and "keeps changing" in e.value.message
        # and left swapped: the path now leads outside, which get refuses as such
        monkeypatch.setattr(excerpt, "locate", locate)
        with pytest.raises(excerpt.Refused) as e:
            excerpt.get_text(str(root / "racedir" / name), cfg.sources, None, None, 1 << 20)
        assert e.value.code == P.FORBIDDEN and "swordfish" not in e.value.message
        swapped_back()
        monkeypatch.setattr(sources, "real_inside", real)
        got = excerpt.get_text(str(root / "racedir" / name), cfg.sources, None, None, 1 << 20)
        assert "insidious" in got["text"] and "swordfish" not in got["text"]
        assert "insidious" in " ".join(loader.load(src, f"racedir/{name}", 1 << 20).doc.lines)

# -- what cannot be read or listed ----------------------------------------------------------------

def test_what_cannot_be_listed_or_read_is_kept(make_daemon, tmp_path):
    """Run as a user whom permissions bind (as root: without CAP_DAC_OVERRIDE). A folder that
    cannot be listed keeps its files (before, they were deleted), and so does an unreadable
    root; a note that cannot be read keeps what was indexed; a new unreadable one is skipped
    with its reason; all recover when the permissions do."""
    root = tmp_path / "notes"
    (root / "sub").mkdir(parents=True)
    for i in range(4):
        (root / "sub" / f"s{i}.md").write_text(f"# S{i}\n\nThe word subterranean{i} is here.\n")
    (root / "top.md").write_text("# Top\n\nThe word toplofty is here.\n")
    d = make_daemon(sources=[{"name": "n", "path": str(root)}], wrap=no_dac())
    with d:
        d.wait_idle()
        assert len(d.call("search", query="subterranean0 subterranean1 subterranean2 "
                          "subterranean3", mode="bm25", k=10)["results"]) == 4
        os.chmod(root / "sub", 0)
        os.chmod(root / "top.md", 0)
        fresh = root / "fresh.md"
        fresh.write_text("# Fresh\n\nThe word freshwater is here.\n")
        os.chmod(fresh, 0)
        try:
            d.call("reindex")
            st = d.wait_idle()
            src = st["sources"][0]
            assert src["unlisted"] == ["sub"]
            assert "could not be listed" in src["last_error"]
            assert src["files"] == 5
            for i in range(4):
                assert d.call("search", query=f"subterranean{i}", mode="bm25")["results"]
            assert d.call("search", query="toplofty", mode="bm25")["results"]
            files = {Path(f["path"]).name: f for f in d.call("files")["files"]}
            assert files["top.md"]["status"] == "indexed"
            assert files["top.md"]["reason"].startswith("kept from an earlier read")
            assert files["fresh.md"]["status"] == "skipped"
            assert files["fresh.md"]["reason"] == "permission denied"
            d.call("reindex")  # tried again, still unreadable: said once in the log
            d.wait_idle()
            log = d.log.read_text()
            assert log.count("skipped n/fresh.md: permission denied") == 1, log
            assert log.count("n/top.md could not be read") == 1, log
            # the root itself
            os.chmod(root, 0)
            d.call("reindex")
            st = d.wait_idle()
            assert st["sources"][0]["unlisted"] == ["."] and st["sources"][0]["files"] == 5
        finally:
            os.chmod(root, 0o755)
            os.chmod(root / "sub", 0o755)
            os.chmod(root / "top.md", 0o644)
            os.chmod(fresh, 0o644)
        d.call("reindex")
        st = d.wait_idle()
        src = st["sources"][0]
        assert src["unlisted"] == [] and src["files"] == 6 and src["skipped"] == 0
        assert d.call("search", query="freshwater", mode="bm25")["results"]
        no_restarts(st)


def test_a_slow_pdftotext_holds_nothing_up(make_daemon, tmp_path):
    """pdftotext taking 15 s (a PATH shim): notes keep being indexed meanwhile, then the PDF."""
    real = subprocess.run(["sh", "-c", "command -v pdftotext"], capture_output=True,
                          text=True).stdout.strip()
    assert real, "the PDF tests need pdftotext (poppler-utils)"
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "pdftotext").write_text(f"#!/bin/sh\nsleep 15\nexec {real} \"$@\"\n")
    os.chmod(shim / "pdftotext", 0o755)
    root = tmp_path / "docs"
    root.mkdir()
    make_pdf(root / "slow.pdf", [["The word pachydermatous is in this PDF."]])
    (root / "first.md").write_text("# First\n\nThe word firstling is here.\n")
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}
    d = make_daemon(sources=[{"name": "docs", "path": str(root)}], env=env)
    with d:
        t0 = time.monotonic()
        deadline = t0 + 8
        while not d.call("search", query="firstling", mode="bm25")["results"]:
            assert time.monotonic() < deadline, "a note waited behind the PDF"
            time.sleep(0.05)
        (root / "later.md").write_text("# Later\n\nThe word latecomer is here.\n")
        while not d.call("search", query="latecomer", mode="bm25")["results"]:
            assert time.monotonic() < deadline, "a new note waited behind the PDF"
            time.sleep(0.05)
        assert time.monotonic() - t0 < 14  # both while pdftotext was still asleep
        assert not d.call("search", query="pachydermatous", mode="bm25")["results"]
        st = d.wait_idle(timeout=60)
        assert d.call("search", query="pachydermatous", mode="bm25")["results"]
        no_restarts(st)


# -- the database ------------------------------------------------------------------------------

def test_a_busy_database_never_kills_a_thread(make_daemon, tmp_path):
    """Another process holds the index's write lock for 12 s (past the 10 s busy timeout) while
    the indexer and the embedder both need it: they wait and carry on (before, each died of
    'database is locked' until a restart)."""
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    with d:
        hold = sqlite3.connect(tmp_path / "data" / "index.sqlite3", isolation_level=None)
        hold.execute("BEGIN IMMEDIATE")
        try:
            (root / "new note.md").write_text("# New\n\nThe word lockjawed is here.\n")
            time.sleep(12)  # the fault itself: the lock held past busy_timeout
            st = d.call("status")
            assert st["pending"] > 0 or not st["idle"]  # the work waits, it is not lost
        finally:
            hold.rollback()
            hold.close()
        st = wait_embedded(d, timeout=240)
        no_restarts(st)
        assert d.call("search", query="lockjawed", mode="bm25")["results"]
        e = st["engines"]["embedding"]
        assert e["vectors"] == st["sources"][0]["chunks"]
    consistent(db_of(tmp_path))


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if os.getuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                           str(where)], capture_output=True).returncode == 0


def test_a_full_disk_pauses_indexing_and_it_resumes(make_daemon, tmp_path):
    """The data dir on a 1 MB tmpfs (else: a file size limit on the daemon): status says the
    index cannot be written, nothing is corrupt, and once there is room it converges."""
    data = tmp_path / "data"
    mounted = _mount_tmpfs(data, "1m")
    d = make_daemon(vaults=("dwarvesf-brain",))
    try:
        d.start()
        if not mounted:  # a limit on file size instead (SIGXFSZ is ignored: a write error)
            import resource
            resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        deadline = time.monotonic() + 60
        while not (st := d.call("status"))["indexer"].startswith("paused"):
            assert time.monotonic() < deadline, st["indexer"]
            time.sleep(0.1)
        assert "cannot be written" in st["indexer"]
        assert "full" in st["indexer"] or "I/O" in st["indexer"] or "large" in st["indexer"]
        if mounted:
            subprocess.run(["mount", "-o", "remount,size=200m", str(data)], check=True)
        else:
            import resource
            resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE,
                             (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        st = d.wait_idle(timeout=180)
        assert st["indexer"] == "idle"
        assert st["sources"][0]["files"] + st["sources"][0]["skipped"] == 885
        no_restarts(st)
        d.stop()
        consistent(db_of(tmp_path))
    finally:
        d.kill()
        if mounted:
            subprocess.run(["umount", "-l", str(data)])


# -- kills ----------------------------------------------------------------------------------------

EMBED_LINE = re.compile(r"embedding (\d+) texts")


def sent_texts(log: Path) -> int:
    """Texts the embedder sent to the engine (logged before each request), over all runs."""
    return sum(int(m.group(1)) for m in EMBED_LINE.finditer(log.read_text(errors="replace")))


def test_kill_9_at_random_points_converges(make_daemon, tmp_path):
    """kill -9 three times at random points of indexing and embedding: after each restart the
    index converges; nothing is lost, and a kill costs at most the batch it interrupted."""
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config())
    rng = random.Random(8)
    kills = 3
    for _ in range(kills):
        d.start()
        time.sleep(rng.uniform(0.2, 2.5))  # a random point (the fault: when the kill lands)
        d.kill()
        with contextlib.closing(db_of(tmp_path)) as db:
            consistent(db)
    with d:
        st = wait_embedded(d, timeout=240)
        db = db_of(tmp_path)
        consistent(db)
        n_files = sum(1 for p in root.rglob("*.md"))
        assert st["sources"][0]["files"] == n_files
        assert st["engines"]["embedding"]["vectors"] == st["sources"][0]["chunks"]
        distinct = db.execute("SELECT COUNT(DISTINCT embed_hash) FROM chunks").fetchone()[0]
        space = st["engines"]["embedding"]["space"]
        assert db.execute("SELECT COUNT(*) FROM embeddings WHERE space = ?",
                          (space,)).fetchone()[0] == distinct
    sent = sent_texts(d.log)
    # each text embedded once, plus at most the batches a kill interrupted: two in flight (the
    # embedder sends the next while it stores the one before), each <= 1024 tokens: at most
    # 16 texts of 64+ tokens (the probe is not logged)
    assert distinct <= sent <= distinct + kills * 2 * 16, (sent, distinct)


def test_the_engine_killed_during_embedding_is_restarted_and_nothing_is_lost(make_daemon,
                                                                             tmp_path):
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config(extra="[engines]\nmax_restarts = 50\n"))
    kills = 3
    with d:
        done = 0
        deadline = time.monotonic() + 180
        last_pid = None
        while done < kills:
            assert time.monotonic() < deadline
            e = d.call("status")["engines"]["embedding"]
            if e.get("state") == "ready" and e.get("pid") != last_pid and e.get("embedder") in (
                    "embedding", "loading vectors"):
                os.kill(e["pid"], signal.SIGKILL)
                last_pid = e["pid"]
                done += 1
            time.sleep(0.05)
        st = wait_embedded(d, timeout=240)
        e = st["engines"]["embedding"]
        assert e["restarts"] >= kills
        assert e["vectors"] == st["sources"][0]["chunks"]
        db = db_of(tmp_path)
        distinct = db.execute("SELECT COUNT(DISTINCT embed_hash) FROM chunks").fetchone()[0]
        assert e["embedded_texts"] == distinct  # none stored twice, none lost
        no_restarts(st)



def kill_until_failed(d, query: bool = False, timeout: float = 180.0) -> dict:
    """kill -9 the embedding engine (or its query engine) each time it is up again, until
    ragd marks it failed; its status then."""
    deadline, last = time.monotonic() + timeout, None
    while True:
        e = d.call("status")["engines"]["embedding"]
        if query:
            e = e.get("query_engine") or {}
        if e.get("state") == "failed":
            return e
        if e.get("state") == "ready" and e.get("pid") not in (None, last):
            os.kill(e["pid"], signal.SIGKILL)
            last = e["pid"]
        assert time.monotonic() < deadline, e
        time.sleep(0.02)


def test_a_failed_engine_comes_back(make_daemon, tmp_path):
    """The embedding engine killed until ragd marks it failed (max_restarts in the window):
    it is tried again after a backoff, by itself, and texts written meanwhile get their
    vectors; the query engine, failed the same way, comes back at once on a reload (before:
    a failed engine stayed down until ragd was restarted, past the window and reloads alike,
    and search stayed on BM25)."""
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config(extra="[engines]\nmax_restarts = 2\n"
                                              "failed_retry = 3\n"))
    with d:
        wait_embedded(d)
        e = kill_until_failed(d)
        assert "failed 2 times within 300s" in e["reason"], e["reason"]
        assert e["next_try"] and e["next_try"] - time.time() <= 3.5, e
        (root / "later.md").write_text("# Later\n\nWritten while the engine was down: "
                                       "a heron stood in the reeds.\n")
        st = wait_embedded(d, timeout=120)  # only once the engine is back
        e = st["engines"]["embedding"]
        assert e["state"] == "ready" and e["next_try"] is None and e["pending_texts"] == 0
        assert "trying again in 3 s" in (tmp_path / "data" / "ragd.log").read_text()
        res = d.call("search", query="a grey bird standing in water", mode="vector", k=3)
        assert not res["degraded"] and res["results"][0]["path"].endswith("later.md"), res
    # the same, for the query engine, with the next try far off: a reload tries it now
    cfg = d.config.read_text().replace("failed_retry = 3", "failed_retry = 3600")
    d.config.write_text(cfg)
    with d:
        wait_embedded(d)
        e = kill_until_failed(d, query=True)
        assert e["next_try"] - time.time() > 20, e
        r = subprocess.run([sys.executable, "-m", "ragctl", "--config", str(d.config),
                            "status"], capture_output=True, text=True, timeout=60)
        assert "query engine: next try in" in r.stdout, r.stdout
        assert d.call("reload")["engines_retried"] == ["query"]
        deadline = time.monotonic() + 20  # well before its next try (30 s)
        while (q := d.call("status")["engines"]["embedding"]["query_engine"])["state"] != \
                "ready":
            assert time.monotonic() < deadline, q
            time.sleep(0.05)
        assert d.call("reload")["engines_retried"] == []  # nothing failed now
        no_restarts(d.call("status"))

# -- the socket -----------------------------------------------------------------------------------

def fuzz_values(rng: random.Random, inside: Path | None = None):
    """Wrong-typed and hostile values; with `inside` (a source's folder) also paths within it
    that no file system can hold: a name over 255 bytes, a path over 4096 (each was an
    `internal` error: ENAMETOOLONG)."""
    deep = []
    for _ in range(200):
        deep = [deep]
    values = [None, True, False, 0, -1, 2**63 - 1, 2**64 - 1, -2**63, 1.5, float("nan"),
              float("inf"), "", "x" * 100000, "\x00", "../../etc/passwd", b"\xff\xfe", [],
              [1, "a"], ["no such source"], {}, {"a": {"b": [1]}}, deep, rng.random()]
    if inside is not None:
        values += [f"{inside}/{'x' * 256}.md", f"{inside}/{'é' * 130}/a.md",
                   f"{inside}/" + "/".join(["folder"] * 700) + "/a.md"]
    return values


FUZZ_OPS = [op for op in ARGS if op not in ("stop", "events", "models_pull", "wait")]


def _frame(msg) -> bytes:
    body = msgpack.packb(msg, use_bin_type=True)
    return P.HEADER.pack(len(body)) + body


def fuzz_frames(n: int, seed: int = 1, inside: Path | None = None) -> list[tuple[bytes, bool]]:
    """(bytes, a reply is due): every op with every wrong-typed value for each argument, then
    random bytes, truncated frames, deep and huge msgpack, non-requests and broken JSON lines
    up to n. (stop, events, models_pull and wait are left out: they stop, stream, reach the
    network or block by design.) `inside`: a source's folder, for paths within it."""
    rng = random.Random(seed)
    values = fuzz_values(rng, inside)
    frames: list[tuple[bytes, bool]] = []
    for op in FUZZ_OPS:
        for arg in ARGS[op]:
            for v in values:
                if v is None and op in ("reindex", "gc"):
                    continue  # None is the default: a whole reindex, not a bad request
                frames.append((_frame({"id": len(frames), "op": op, "args": {arg: v}}), True))
    while len(frames) < n:
        kind = rng.randrange(7)
        if kind == 0:  # an op with random values for all its arguments, maybe an unknown one
            op = rng.choice(FUZZ_OPS)
            args = {a: rng.choice(values[1:]) for a in ARGS[op]}
            if rng.random() < 0.3:
                args[rng.choice(["zzz", "", "\u00e9"])] = 1
            frames.append((_frame({"id": len(frames), "op": op, "args": args}), True))
        elif kind == 1:  # random payload in a valid frame
            body = rng.randbytes(rng.randrange(1, 300))
            frames.append((P.HEADER.pack(len(body)) + body, True))
        elif kind == 2:  # not a map, or no op
            frames.append((_frame(rng.choice([[1, 2], "op", 7, {"op": 3}, {"args": {}},
                                              {"op": "search", "args": [1]}])), True))
        elif kind == 3:  # deep nesting
            body = b"\x91" * rng.randrange(1000, 100000) + b"\xc0"
            frames.append((P.HEADER.pack(len(body)) + body, True))
        elif kind == 4:  # an array of 4 billion items announced in a small frame
            body = b"\xdd\xff\xff\xff\xff" + b"\xc0" * 10
            frames.append((P.HEADER.pack(len(body)) + body, True))
        elif kind == 5:  # truncated: the header promises more than comes before the hang-up
            body = _frame({"op": "ping"})[4:]
            frames.append((P.HEADER.pack(len(body) + 50) + body, False))
        else:  # JSON lines, some broken
            line = rng.choice([b'{"op": "ping"}', b'{"op": "search", "args": {"query": 1}}',
                               b'{"op": "search", "args": {"query": "\\ud800"}}',
                               b"{" * 50000, b'{"op": "status", "args": {"x": [}'])
            frames.append((line + b"\n", True))
    return frames


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def send_fuzz(sock_path: Path, frames: list[tuple[bytes, bool]]) -> dict:
    """Each frame on a connection of its own (an error that closes one must not hide the next
    frame). Every frame that is due a reply gets one, with a known error code (never
    `internal`, a crash); the connection then still answers a ping unless the framing broke."""
    out = {"frames": 0, "replies": 0, "errors": 0}
    ping = _frame({"id": "p", "op": "ping"})
    for data, due in frames:
        out["frames"] += 1
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(str(sock_path))
            s.sendall(data)
            if not due:
                continue
            jsonl = data[:1] == b"{"
            reply = read_reply(s, jsonl)
            assert reply is not None, f"no reply to {data[:60]!r}"
            out["replies"] += 1
            if "error" in reply:
                out["errors"] += 1
                assert reply["error"]["code"] in P.ERROR_CODES, reply
                assert reply["error"]["code"] != P.INTERNAL, (data[:200], reply)
                if reply["error"]["code"] == P.FRAME_TOO_LARGE:
                    continue
            if not jsonl:  # the same connection goes on
                s.sendall(ping)
                pong = read_reply(s, False)
                assert pong is not None and "result" in pong, (data[:60], pong)
    return out


def read_reply(s: socket.socket, jsonl: bool) -> dict | None:
    buf = b""
    if jsonl:
        while b"\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                return None
            buf += chunk
        import json
        return json.loads(buf.split(b"\n", 1)[0])
    while len(buf) < 4:
        chunk = s.recv(4 - len(buf))
        if not chunk:
            return None
        buf += chunk
    (n,) = struct.unpack("!I", buf)
    body = b""
    while len(body) < n:
        chunk = s.recv(n - len(body))
        if not chunk:
            return None
        body += chunk
    return msgpack.unpackb(body, raw=False)


def hammer(sock_path: Path, clients: int, seconds: float) -> tuple[int, list[str]]:
    """`clients` connections at once, each asking search/status/ping in a loop."""
    done, errors = [0], []
    stop = time.monotonic() + seconds
    lock = threading.Lock()

    def client(i: int) -> None:
        rng = random.Random(i)
        try:
            with P.Client(sock_path, timeout=60) as c:
                while time.monotonic() < stop:
                    op = rng.choice(["search", "status", "ping", "files"])
                    if op == "search":
                        c.call("search", query=rng.choice(["task", "recurring dates", "x"]),
                               mode="bm25", k=5)
                    elif op == "files":
                        c.call("files", limit=50)
                    else:
                        c.call(op)
                    with lock:
                        done[0] += 1
        except Exception as e:  # noqa: BLE001 - every failure is reported
            with lock:
                errors.append(f"client {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0], errors


def test_fuzzed_frames_and_many_clients_never_hurt_the_daemon(make_daemon, tmp_path):
    d = make_daemon(vaults=("obsidian-tasks-docs",))
    with d:
        d.wait_idle()
        # Warm up with the load to come (its threads, buffers, the read pool's connections
        # and their page caches): what is measured after is what the load leaves behind.
        hammer(d.socket, 50, 2.0)
        time.sleep(1.1)  # the memory given back after a burst (at most once a second)
        before = rss_kb(d.proc.pid)
        frames = fuzz_frames(1500, inside=tmp_path / "vaults" / "obsidian-tasks-docs")
        out = send_fuzz(d.socket, frames)
        assert out["replies"] == sum(due for _, due in frames) and out["errors"] > 1000, out
        n, errors = hammer(d.socket, 50, 5.0)
        assert not errors, errors[:5]
        assert n > 100
        st = d.call("status")
        no_restarts(st)
        time.sleep(1.1)  # (as above: the memory given back after the burst)
        after = rss_kb(d.proc.pid)
        assert after <= before * 1.10 + 2048, (before, after)  # within 10% (+2 MB slack)
        assert d.call("ping")["pid"] == d.proc.pid


def test_a_hung_engine_is_found_and_replaced(make_daemon, tmp_path):
    """An engine that stops answering (SIGSTOP: alive, silent) is found by its failed health
    checks, killed and started again; search is degraded meanwhile, then hybrid again."""
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config(extra="[engines]\nhealth_interval = 1.0\n"))
    with d:
        st = wait_embedded(d)
        pid = st["engines"]["embedding"]["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 60
            while True:
                e = d.call("status")["engines"]["embedding"]
                if e["pid"] != pid and e["state"] == "ready":
                    break
                assert time.monotonic() < deadline, e
                time.sleep(0.1)
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        assert "hung" in open(tmp_path / "data" / "ragd.log").read()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the hung one is gone, not orphaned
        res = d.call("search", query="make a task repeat", mode="hybrid")
        assert not res["degraded"] and res["results"]


def test_an_engine_that_stops_answering_does_not_hold_an_edit(make_daemon, tmp_path):
    """An edit's new texts are embedded before its commit when the engine is idle; an engine
    that stops answering then (SIGSTOP, health checks too slow to notice) must not hold the
    indexer for the client's whole timeout (120 s): the edit is searchable within seconds, its
    texts left to the embedder thread."""
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    extra=engine_config(extra="[engines]\nhealth_interval = 600.0\n"))
    with d:
        st = wait_embedded(d)
        pid = st["engines"]["embedding"]["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            (root / "Pangolins.md").write_text("# Pangolins\n\nPangolins eat ants at night.\n")
            # (no --wait: it waits for the embedder too while the engine is deemed up)
            deadline = time.monotonic() + 30  # the live embed gives up after LIVE_TIMEOUT
            while not (res := d.call("search", query="pangolins", mode="bm25"))["results"]:
                assert time.monotonic() < deadline, res
                time.sleep(0.2)
            assert res["results"][0]["path"].endswith("Pangolins.md"), res
        finally:
            os.kill(pid, signal.SIGCONT)


def test_a_huge_query_is_refused_at_once(make_daemon, tmp_path):
    """A 1 MB query (a pasted file) is a bad argument answered at once: it cost 24 s of BM25 and
    line matching on obsidian-hub, holding a core. One at the bounds still answers."""
    root = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}])
    with d:
        d.wait_idle()
        text = " ".join(p.read_text() for p in sorted(root.rglob("*.md")))
        huge = (text * (1 + (1 << 20) // len(text)))[:1 << 20]
        words = ("recurring task " * 600).strip()  # 1,200 words in 9 KB
        with d.client() as c:
            for query, op, arg in ((huge, "search", "query"), (words, "search", "query"),
                                   ("é" * 4097, "search", "query"), (huge, "ask", "question")):
                t0 = time.monotonic()
                with pytest.raises(P.DaemonError) as e:
                    c.call(op, **{arg: query})
                assert time.monotonic() - t0 < 2.0
                assert e.value.code == P.BAD_ARGS and "at most 8192 bytes and 1000 words" in \
                    e.value.message, e.value.message
                assert f"the {arg} is {len(query.encode())} bytes" in e.value.message
            at_bounds = " ".join(text.split()[:1000])[:8192]
            res = c.call("search", query=at_bounds, mode="bm25")
            assert res["results"] and res["query_chars"] == len(at_bounds)
        no_restarts(d.call("status"))


# -- other users ----------------------------------------------------------------------------------

def _open_to_others(top: Path) -> list[str]:
    out = []
    for folder, dirs, files in os.walk(top):
        for p in [folder, *(os.path.join(folder, f) for f in files)]:
            if os.path.basename(p) != "models" and "/models/" not in p \
                    and os.lstat(p).st_mode & 0o077:
                out.append(f"{p} {os.lstat(p).st_mode & 0o777:o}")
    return out


def test_what_ragd_writes_is_private_whatever_the_umask(make_daemon, tmp_path):
    """Started with umask 000 on a data dir that exists as 0755, holding an index and a log an
    older ragd left 0644: every file ragd writes there (index, WAL, tantivy index, logs) ends
    up its user's alone, and status warns that the data dir itself is open. (Before: the index
    was created 0644, readable by any user.) A data dir ragd creates is 0700, with no warning."""
    root = small_vault(tmp_path / "vault")
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)
    old = sqlite3.connect(data / "index.sqlite3")  # an index of an older ragd, 0644
    old.execute("PRAGMA user_version = 0")
    old.close()
    (data / "ragd.log").write_text("an older ragd's log\n")
    for f in ("index.sqlite3", "ragd.log"):
        os.chmod(data / f, 0o644)
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}],
                    wrap=["sh", "-c", 'umask 000 && exec "$@"', "sh"])
    with d:
        st = d.wait_idle()
        assert d.call("search", query="recurring", mode="bm25")["results"]
        assert (data / "index.sqlite3-wal").exists() and (data / "bm25").is_dir()
        assert _open_to_others(data) == [f"{data} 755"]
        hint = [h for h in st["hints"] if "open to other users" in h]
        assert hint and f"chmod 700 {data}" in hint[0], st["hints"]
        os.chmod(data, 0o700)  # as the hint says: the next status has nothing to say of it
        assert not any("open to other" in h for h in d.call("status")["hints"])
    assert "is open to other users (mode 755)" in (data / "ragd.log").read_text()
    # a data dir of its own making: private, nothing to say
    fresh = tmp_path / "fresh"
    (tmp_path / "config.toml").write_text((tmp_path / "config.toml").read_text().replace(
        f'data_dir = "{data}"', f'data_dir = "{fresh}"'))
    with d:
        st = d.wait_idle()
        assert _open_to_others(fresh) == [] and not any("open to other" in h for h in st["hints"])
        assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o700



def as_nobody(fn) -> str:
    """Run fn() in a forked child that has become uid/gid 65534 (nobody); what it returns (a
    str), or its error."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            out = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out = f"child: {e!r}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return data.decode()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_another_user_is_refused_in_their_encoding(make_daemon, tmp_path):
    """Another user's JSON-lines client gets the refusal as a JSON line (it was a msgpack frame
    it could not read), and ragctl as another user prints the reason (it printed "reply for
    id None, expected 1"). Only the uid check stands in the way: the modes are opened."""
    import tempfile
    run = Path(tempfile.mkdtemp(prefix="ragd-peer-", dir="/tmp"))
    try:
        d = make_daemon(socket=run / "ragd" / "ragd.sock",
                        sources=[{"name": "v", "path": str(small_vault(tmp_path / "v"))}])
        with d:
            os.chmod(run, 0o711)
            os.chmod(d.socket.parent, 0o711)
            os.chmod(d.socket, 0o666)

            def jsonl() -> str:
                with socket.socket(socket.AF_UNIX) as s:
                    s.settimeout(10)
                    s.connect(str(d.socket))
                    s.sendall(b'{"id": 1, "op": "ping"}\n')
                    data = b""
                    while chunk := s.recv(4096):
                        data += chunk
                return data.decode()

            import json
            line = as_nobody(jsonl)
            assert line.endswith("\n") and line.count("\n") == 1, line
            reply = json.loads(line)
            assert reply["id"] is None and reply["error"]["code"] == P.FORBIDDEN, reply
            assert "uid 65534 may not use this daemon" in reply["error"]["message"]

            def ragctl_status() -> str:  # ragctl's own main, as that user
                import io
                from ragctl import cli
                sys.stderr = io.StringIO()
                rc = cli.main(["--socket", str(d.socket), "status"])
                return f"{rc} {sys.stderr.getvalue()}"

            out = as_nobody(ragctl_status)
            assert out.startswith("1 ragctl: uid 65534 may not use this daemon (owned by uid "
                                  "0) (forbidden)"), out
            assert d.call("ping")["pid"] == d.proc.pid
    finally:
        import shutil
        shutil.rmtree(run, ignore_errors=True)


# -- the config ----------------------------------------------------------------------------------

def test_a_bad_save_of_the_config_loses_nothing(make_daemon, tmp_path):
    """A config saved empty, then cut short (one source of two), and reloaded: the empty one is
    refused (it named no source: before, it removed and purged every one); the short one sets
    the missing source aside, not purged; the config fixed, the source is back as it was at
    once, nothing read again but what changed meanwhile; across a restart too. `sources = []`
    said outright is taken; gc past the grace period deletes what was set aside."""
    a, b = tmp_path / "a", tmp_path / "b"
    for root, word in ((a, "aardvark"), (b, "bandicoot")):
        root.mkdir()
        for i in range(20):
            (root / f"note {i}.md").write_text(f"# Note {i}\n\nThe {word}{i} lives here.\n")
    d = make_daemon(sources=[{"name": "a", "path": str(a)}, {"name": "b", "path": str(b)}])
    whole = d.config.read_text()

    def reload():
        with d.client() as c:
            return c.call("reload")

    def found(word):
        return d.call("search", query=word, mode="bm25", k=50)["results"]

    with d:
        d.wait_idle()
        d.config.write_text("")
        with pytest.raises(P.DaemonError) as e:
            reload()
        assert e.value.code == P.BAD_CONFIG and "names no source at all" in e.value.message
        assert "sources = []" in e.value.message
        st = d.call("status")
        assert [s["name"] for s in st["sources"]] == ["a", "b"]
        assert any("names no source" in h for h in st["hints"])
        assert found("aardvark3") and found("bandicoot3")
        # cut short after the first source
        d.config.write_text(whole[:whole.index("[[sources]]", whole.index("[[sources]]") + 1)])
        res = reload()
        assert res["removed"] == ["b"] and res["restored"] == []
        d.wait_idle()
        assert not found("bandicoot3") and found("aardvark3")
        assert not any(f["source"] == "b" for f in d.call("files")["files"])
        st = d.call("status")
        assert any("'b' is no longer in the config: its 20 files are set aside" in h
                   for h in st["hints"]), st["hints"]
        # meanwhile, one of b's notes changes and one goes
        (b / "note 1.md").write_text("# Note 1\n\nThe wombat lives here now.\n")
        (b / "note 2.md").unlink()
        indexed = st["totals"]["files_indexed"]
        d.config.write_text(whole)
        res = reload()
        assert res["added"] == ["b"] and res["restored"] == ["b"]
        st = d.wait_idle()
        assert st["totals"]["files_indexed"] == indexed + 1  # note 1, not the 18 others
        assert found("bandicoot3") and found("wombat") and not found("bandicoot2")
        assert st["sources"][1]["files"] == 19
        assert not any("no longer in the config" in h for h in st["hints"])
        # said outright: every source goes (set aside)
        d.config.write_text("sources = []\n" + whole[:whole.index("[[sources]]")])
        assert sorted(reload()["removed"]) == ["a", "b"]
        d.wait_idle()
        assert not found("aardvark3")
    # set aside across a restart: back at start, read again for nothing
    d.config.write_text(whole)
    with d:
        st = d.wait_idle()
        assert st["totals"]["files_indexed"] == 0, st["totals"]
        assert found("aardvark3") and found("bandicoot3") and found("wombat")
        # past the grace period, gc deletes what is set aside
        d.config.write_text(whole[:whole.index("[[sources]]", whole.index("[[sources]]") + 1)])
        reload()
        d.wait_idle()
        assert d.call("gc", grace_hours=0)["purged_files"] == 19
        d.config.write_text(whole)
        assert reload()["restored"] == []
        st = d.wait_idle()
        assert st["totals"]["files_indexed"] == 19 and found("bandicoot3")
        # ragctl removing the last source says so outright (sources = []): taken
        for name in ("a", "b"):
            r = subprocess.run([sys.executable, "-m", "ragctl", "--config", str(d.config),
                                "sources", "remove", name], capture_output=True, text=True,
                               timeout=60)
            assert r.returncode == 0, r.stderr
        assert "sources = []" in d.config.read_text()
        st = d.wait_idle()
        assert st["sources"] == [] and not any("names no source" in h for h in st["hints"])
        no_restarts(st)
    consistent(db_of(tmp_path))

# -- where ragd is started from -------------------------------------------------------------------

def test_ragctl_start_from_a_folder_holding_a_folder_named_ragd(make_daemon, tmp_path):
    """`ragctl start` in a folder that holds a folder named ragd (a checkout, a project): the
    daemon started as `python -m ragd` imported that folder ("cannot import name '__version__'
    from 'ragd'") and never came up. It starts, with its working folder at /, and stops."""
    script = Path(sys.executable).parent / "ragctl"  # as a user runs it: the console script
    if not script.exists():
        pytest.fail(f"no ragctl console script beside {sys.executable} (pip install -e .)")
    d = make_daemon(sources=[{"name": "v", "path": str(small_vault(tmp_path / "vault"))}])
    here = tmp_path / "project"
    (here / "ragd").mkdir(parents=True)
    (here / "ragd" / "__init__.py").write_text("")  # a package that is not ragd
    (here / "ragd" / "__main__.py").write_text("raise SystemExit('the wrong ragd ran')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGD_")}

    def run(*args):
        return subprocess.run([str(script), "--config", str(d.config), *args], cwd=here,
                              env=env, capture_output=True, text=True, timeout=120)

    r = run("start")
    assert r.returncode == 0 and "ragd started" in r.stdout, (r.stdout, r.stderr)
    try:
        pid = d.call("ping")["pid"]
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
        d.wait_idle()
        assert d.call("search", query="recurring", mode="bm25")["results"]
    finally:
        r = run("stop")
    assert r.returncode == 0 and "stopped" in r.stdout, (r.stdout, r.stderr)


# -- more clients than the daemon takes -----------------------------------------------------------

def hold_connections(sock_path: Path, n: int, send: bytes = b"") -> list[socket.socket]:
    """n connections that send `send` (nothing, or part of a message) and then say nothing."""
    held = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(str(sock_path))
        if send:
            s.sendall(send)
        held.append(s)
    return held


def refused_in(sock_path: Path, jsonl: bool = False) -> tuple[float, dict]:
    """A new client's ping: (seconds until its reply, the reply)."""
    t0 = time.monotonic()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(120)
        s.connect(str(sock_path))
        try:
            s.sendall(b'{"id": 1, "op": "ping"}\n' if jsonl else _frame({"id": 1, "op": "ping"}))
        except BrokenPipeError:  # refused before the request went out: the reply is there
            pass
        reply = read_reply(s, jsonl)
    return time.monotonic() - t0, reply


def test_over_the_connection_limit_a_new_client_is_told_at_once(make_daemon, tmp_path):
    """300 connections held open saying nothing (the limit is 256), some of them half-way
    through a frame or a line: a new client is told at once that ragd is busy, in its own
    encoding, and ragctl prints it (before: the accept thread lingered 0.5 s on each refused
    connection, so a new client waited ~22 s, then got an `id: null` reply that ragctl called
    "reply for id None, expected 1"). The half-sent messages time out and free their slots."""
    d = make_daemon(sources=[{"name": "v", "path": str(small_vault(tmp_path / "vault"))}])
    with d:
        d.wait_idle()
        half_frames = hold_connections(d.socket, 30, P.HEADER.pack(100)[:2])
        half_lines = hold_connections(d.socket, 30, b'{"id": 1, "op": "pi')
        silent = hold_connections(d.socket, 240)
        try:
            took, reply = refused_in(d.socket)
            assert took < 3.0, took
            assert reply["id"] is None and reply["error"]["code"] == P.UNAVAILABLE
            assert reply["error"]["message"].startswith("ragd is busy: 256 connections "
                                                        "(limit 256)"), reply
            took, reply = refused_in(d.socket, jsonl=True)
            assert took < 3.0 and reply["error"]["code"] == P.UNAVAILABLE, (took, reply)
            r = subprocess.run([sys.executable, "-m", "ragctl", "--config", str(d.config),
                                "status"], capture_output=True, text=True, timeout=60)
            assert r.returncode == 1 and r.stderr.startswith(
                "ragctl: ragd is busy: 256 connections (limit 256)"), r.stderr
            with pytest.raises(P.DaemonError) as e:
                d.call("ping")
            assert e.value.code == P.UNAVAILABLE and "busy" in e.value.message
            # A message begun and left half-sent is dropped after server.FRAME_IDLE (10 s),
            # saying why; a connection that has sent nothing is left alone.
            for s in half_frames + half_lines:
                reply = read_reply(s, jsonl=s in half_lines)
                assert reply is not None and reply["error"]["code"] == P.BAD_FRAME, reply
                assert "incomplete" in reply["error"]["message"]
                assert s.recv(1) == b""  # then closed
                s.close()
            deadline = time.monotonic() + 10
            while True:  # their slots are free once the daemon has closed its ends
                try:
                    assert d.call("ping")["pid"] == d.proc.pid
                    break
                except P.DaemonError as e:
                    assert e.code == P.UNAVAILABLE and time.monotonic() < deadline, e
                    time.sleep(0.05)
            s = silent[0]
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(1)  # still open
        finally:
            for s in half_frames + half_lines + silent:
                s.close()
        deadline = time.monotonic() + 30
        while (conns := d.call("status")["connections"])["open"] > 1:  # (this one)
            assert time.monotonic() < deadline, conns
            time.sleep(0.05)
        assert conns == {"open": 1, "limit": 256}
        n, errors = hammer(d.socket, 20, 2.0)
        assert not errors and n > 20, errors[:3]
        no_restarts(d.call("status"))

