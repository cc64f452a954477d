"""The get op over the real socket, and `ragctl get`: a file of a source, or lines of it; never
a file outside the sources, whatever the path says."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from ragd import protocol as P
from ragd.ingest.excerpt import MAX_TEXT_BYTES

from conftest import make_pdf, ragctl, small_vault


@pytest.fixture
def docs(make_daemon, tmp_path):
    """A daemon over one folder source with ordinary, hidden, ignored, linked and odd files,
    next to a secret outside it."""
    root = tmp_path / "docs"
    small_vault(root)
    (root / "plain.txt").write_text("one\ntwo\nthree\nfour\nfive\n")
    (root / "empty.md").write_text("")
    (root / "no final newline.md").write_text("alpha\nbeta")
    (root / "crlf.md").write_bytes(b"one\r\ntwo\r\n")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "note.md").write_text("hidden\n")
    (root / "drafts").mkdir()
    (root / "drafts" / "wip.md").write_text("work in progress\n")
    (root / ".ragignore").write_text("drafts/\n")
    (root / "binary.md").write_bytes(b"\x00\x01okapi")
    (tmp_path / "secret.md").write_text("the password is swordfish\n")
    (root / "leak.md").symlink_to(tmp_path / "secret.md")
    (root / "alias.md").symlink_to(root / "plain.txt")
    make_pdf(root / "paper.pdf", [["Page one says okapi"], ["Page two says zebra"],
                                  ["Page three says quokka"]])
    d = make_daemon(sources=[{"name": "docs", "path": str(root), "kind": "folder"}])
    with d:
        d.wait_idle()
        yield d, root


def err(d, **args) -> P.DaemonError:
    with pytest.raises(P.DaemonError) as e:
        d.call("get", **args)
    return e.value


def test_a_search_hit_reads_back_exactly(docs):
    d, root = docs
    hit = d.call("search", query="chrono library reads dates very flexibly", k=1)["results"][0]
    got = d.call("get", path=hit["path"], line_start=hit["line_start"], line_end=hit["line_end"])
    assert got["path"] == hit["path"] and got["source"] == "docs" and got["unit"] == "line"
    assert (got["line_start"], got["line_end"]) == (hit["line_start"], hit["line_end"])
    assert got["text"].strip() == hit["text"]
    whole = open(hit["path"], encoding="utf-8").read()
    assert got["lines_total"] == whole.count("\n") + (not whole.endswith("\n"))
    everything = d.call("get", path=hit["path"])
    assert everything["text"] == whole.removesuffix("\n") and not everything["truncated"]
    assert (everything["line_start"], everything["line_end"]) == (1, got["lines_total"])


def test_line_ranges(docs):
    d, root = docs
    plain = str(root / "plain.txt")
    assert d.call("get", path=plain, line_start=2, line_end=3)["text"] == "two\nthree"
    tail = d.call("get", path=plain, line_start=4, line_end=99)  # past the end: to the end
    assert (tail["text"], tail["line_end"], tail["lines_total"]) == ("four\nfive", 5, 5)
    assert d.call("get", path=plain, line_start=5)["text"] == "five"
    assert d.call("get", path=str(root / "no final newline.md"))["lines_total"] == 2
    empty = d.call("get", path=str(root / "empty.md"))
    assert (empty["text"], empty["lines_total"], empty["line_end"]) == ("", 0, 0)
    assert err(d, path=plain, line_start=6).code == P.BAD_ARGS
    assert "past the end" in err(d, path=plain, line_start=6).message
    assert err(d, path=plain, line_start=3, line_end=2).code == P.BAD_ARGS
    assert err(d, path=plain, line_start=0).code == P.BAD_ARGS
    assert err(d, path=plain, line_start="2").code == P.BAD_ARGS
    assert err(d, path=plain, lines="2-3").code == P.BAD_ARGS
    assert err(d).code == P.BAD_ARGS


def test_paths_outside_the_sources_are_refused(docs, tmp_path):
    d, root = docs
    secret = tmp_path / "secret.md"
    for path in (secret, root / "leak.md", root / ".." / "secret.md",
                 root / "How To" / ".." / ".." / "secret.md", "/etc/passwd",
                 tmp_path / "no such file.md"):  # outside: refused before looking at the file
        e = err(d, path=str(path))
        assert e.code == P.FORBIDDEN, (path, e)
        assert "not inside a configured source" in e.message
        assert "swordfish" not in e.message
    for path in (root / ".hidden" / "note.md", root / "drafts" / "wip.md"):
        e = err(d, path=str(path))
        assert e.code == P.FORBIDDEN and "excluded" in e.message, (path, e)
    assert err(d, path=str(root / "missing.md")).code == P.NOT_FOUND
    e = err(d, path=str(root / "plain.txt:abc"))  # a bad range is no file, not "excluded"
    assert e.code == P.NOT_FOUND and "no file" in e.message
    assert err(d, path=str(root / "How To")).code == P.NOT_FOUND
    # relative, or holding a NUL: refused as every op refuses them (ops/args.py: absolute), NUL first
    e = err(d, path="plain.txt")
    assert e.code == P.BAD_ARGS and e.message == ("get: path must be absolute (as search "
                                                  "results give it), got 'plain.txt'")
    for path in (f"{root}/plain.txt\0", "plain.txt\0", "~\0/plain.txt"):
        e = err(d, path=path)
        assert (e.code, e.message) == (P.BAD_ARGS, "get: path contains a NUL character"), path
    e = err(d, path=str(root / "binary.md"))
    assert e.code == P.BAD_ARGS and "binary" in e.message
    # A name no file system holds (over 255 bytes: 'é' is two) or a path over 4096 bytes,
    # inside a source: a bad argument, not ENAMETOOLONG as an internal error
    for path, what in ((root / ("x" * 256), "256 bytes"), (root / ("é" * 128) / "a.md",
                                                          "256 bytes"),
                       (root.joinpath(*["folder"] * 700, "a.md"), "the path is")):
        e = err(d, path=str(path))
        assert e.code == P.BAD_ARGS and what in e.message, (e.code, e.message)
    assert d.call("get", path=str(root / ("é" * 127) / ".." / "plain.txt"), line_end=1)
    # ... and search does not show it either: a link out of a source is not indexed
    skipped = {f["path"]: f for f in d.call("files", status="skipped", limit=100)["files"]}
    reason = skipped[str(root / "leak.md")]["reason"]
    assert "a link to a file outside the source" in reason, reason
    res = d.call("search", query="password swordfish", mode="bm25")
    assert not any("swordfish" in r["text"] for r in res["results"])
    # A link that stays inside its source is followed, and the reply names the real file.
    alias = d.call("get", path=str(root / "alias.md"))
    assert alias["path"] == str(root / "plain.txt") and alias["lines_total"] == 5
    # ... but it is not indexed a second time: the note it links to is (under its own name,
    # where its edits are heard), and the link is skipped saying so
    reason = skipped[str(root / "alias.md")]["reason"]
    assert reason == "a link to plain.txt, which is indexed under its own name", reason
    hits = d.call("search", query="one two three four five", mode="bm25")["results"]
    paths = [h["path"] for h in hits]
    assert str(root / "plain.txt") in paths and str(root / "alias.md") not in paths, paths
    # The connection survives every refusal.
    with d.client() as c:
        for _ in range(3):
            with pytest.raises(P.DaemonError):
                c.call("get", path=str(secret))
        assert c.call("get", path=str(root / "plain.txt"), line_end=1)["text"] == "one"


def test_a_long_range_is_cut_at_a_line_and_continues(docs):
    d, root = docs
    big = root / "big.txt"
    lines = [f"{i:05d} " + "x" * 94 for i in range(1, 4001)]  # 100 bytes a line, 400 kB
    big.write_text("\n".join(lines) + "\n")
    first = d.call("get", path=str(big))
    assert first["truncated"] and first["lines_total"] == 4000
    assert first["line_end"] == len(first["text"].split("\n")) < 4000
    assert len(first["text"].encode()) <= MAX_TEXT_BYTES
    rest = d.call("get", path=str(big), line_start=first["line_end"] + 1)
    assert not rest["truncated"] and rest["line_end"] == 4000
    assert first["text"] + "\n" + rest["text"] == "\n".join(lines)
    one_line = root / "one line.txt"
    one_line.write_text("y" * (MAX_TEXT_BYTES + 100))
    cut = d.call("get", path=str(one_line))
    assert cut["truncated"] and cut["line_end"] == 1 and len(cut["text"]) == MAX_TEXT_BYTES


@pytest.mark.skipif(shutil.which("pdftotext") is None, reason="needs pdftotext")
def test_a_pdf_is_read_by_pages(docs):
    d, root = docs
    got = d.call("get", path=str(root / "paper.pdf"), line_start=2, line_end=2)
    assert got["unit"] == "page" and got["lines_total"] == 3
    assert "zebra" in got["text"] and "okapi" not in got["text"] and "quokka" not in got["text"]
    hit = d.call("search", query="quokka", k=1)["results"][0]
    assert hit["path"] == got["path"]
    page = d.call("get", path=hit["path"], line_start=hit["line_start"], line_end=hit["line_end"])
    assert "quokka" in page["text"]


def test_ragctl_get(docs, tmp_path):
    d, root = docs
    cfg = str(d.config)
    r = ragctl("--config", cfg, "get", f"{root / 'plain.txt'}:2-3")
    assert (r.returncode, r.stdout, r.stderr) == (0, "two\nthree\n", "")
    r = ragctl("--config", cfg, "get", f"{root / 'plain.txt'}:4")
    assert r.stdout == "four\nfive\n"
    r = ragctl("--config", cfg, "get", "--json", str(root / "plain.txt"))
    out = json.loads(r.stdout)
    assert out["lines_total"] == 5 and out["text"].endswith("five") and out["final_newline"]
    # The whole file comes back byte for byte, with its last newline or without one.
    for name in ("plain.txt", "no final newline.md", "crlf.md"):
        raw = subprocess.run([sys.executable, "-m", "ragctl", "--config", cfg, "get",
                              str(root / name)], capture_output=True, timeout=60)
        assert raw.stdout == (root / name).read_bytes(), name
    r = ragctl("--config", cfg, "get", f"{root / 'no final newline.md'}:1")
    assert r.stdout == "alpha\nbeta"
    r = ragctl("--config", cfg, "get", f"{root / 'no final newline.md'}:1-1")
    assert r.stdout == "alpha\n"
    # A relative path is taken from the current folder, as in any shell command.
    r = ragctl_in(root, "--config", cfg, "get", "plain.txt:1-1")
    assert r.stdout == "one\n", r.stderr
    r = ragctl("--config", cfg, "get", str(tmp_path / "secret.md"))
    assert r.returncode == 1 and "not inside a configured source" in r.stderr
    assert "swordfish" not in r.stdout + r.stderr
    # Past what a reply holds, ragctl asks for the rest itself: the whole file, or range
    big = root / "big.txt"
    whole = "".join(f"line {i} " + "z" * 200 + "\n" for i in range(1, 3001))  # ~620 KB
    big.write_text(whole)
    r = ragctl("--config", cfg, "get", str(big))
    assert (r.returncode, r.stderr) == (0, "") and r.stdout == whole
    r = ragctl("--config", cfg, "get", f"{big}:2-2999")
    assert r.stdout == "".join(whole.splitlines(keepends=True)[1:2999])
    big.write_text("z" * 1000 + "\n" + "w" * (MAX_TEXT_BYTES + 10) + "\nlast")
    r = ragctl("--config", cfg, "get", str(big))  # a line longer than a reply: its start
    assert r.returncode == 0 and r.stdout == "z" * 1000 + "\n" + "w" * MAX_TEXT_BYTES + "\nlast"
    assert r.stderr == "ragctl: line 2 is longer than a reply holds: cut\n"


def ragctl_in(cwd, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ragctl", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=60)
