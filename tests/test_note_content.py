"""What a note says about itself, through a real daemon: its date (frontmatter, a daily note's
file name, a document's headers, a PDF's metadata) for --since/--before, a document's title
(a PEP's headers, an rst title, a PDF's Title), and the lines that hold a quoted phrase."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from conftest import VAULTS, make_pdf, ragctl
from ragd import protocol as P

OLD = datetime.datetime(2019, 1, 1).timestamp()  # a file time long before every note's date


def _dated_vault(root: Path) -> Path:
    root.mkdir()
    yesterday = (datetime.date.today() - datetime.timedelta(days=1)).isoformat()
    notes = {
        "old.md": "---\ncreated: 2020-01-05\n---\n# Old\n\nThe wombat digs at night.\n",
        "edited.md": f"---\ncreated: 2020-01-01\nupdated: {yesterday}\n---\n# Edited\n\n"
                     "The wombat was seen again.\n",
        "2021-06-01.md": "# Daily\n\nA wombat in the garden.\n",
        "undated.md": "# Undated\n\nA wombat, undated.\n",
    }
    for name, text in notes.items():
        (root / name).write_text(text)
    for name in ("old.md", "edited.md", "2021-06-01.md"):  # copied, synced: the time is new
        os.utime(root / name)
    os.utime(root / "undated.md", (OLD, OLD))
    return root


def _names(res) -> set[str]:
    return {Path(r["path"]).name for r in res["results"]}


def test_date_filters_read_the_notes_own_date(make_daemon, tmp_path):
    """A copied vault (every file time new) is filtered by the dates its notes state; a note
    states none, its file time counts; '7d', 'yesterday', 'today' are read by the daemon and
    passed through by ragctl; each result says which date it used."""
    root = _dated_vault(tmp_path / "v")
    (root / "far.md").write_text("---\ndate: 9999-12-31\n---\nA wombat of the far future.\n")
    os.utime(root / "far.md", (OLD, OLD))  # (past what a filter reaches: its file's time)
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}])
    with d:
        d.wait_idle()
        res = d.call("search", query="wombat", mode="bm25", k=10)
        dated = {Path(r["path"]).name: (r["date"], r["date_from"]) for r in res["results"]}
        yesterday = (datetime.date.today() - datetime.timedelta(days=1)).isoformat()
        assert dated["old.md"] == ("2020-01-05", "frontmatter created")
        assert dated["edited.md"] == (yesterday, "frontmatter updated")  # updated wins
        assert dated["2021-06-01.md"] == ("2021-06-01", "file name")
        assert dated["undated.md"] == dated["far.md"] == ("2019-01-01T00:00", "file modified")

        for since, found in (("7d", {"edited.md"}), ("yesterday", {"edited.md"}),
                             ("today", set()), ("2021-05-01", {"edited.md", "2021-06-01.md"})):
            res = d.call("search", query="wombat", mode="bm25", k=10, since=since)
            assert _names(res) == found, (since, res["results"])
        res = d.call("search", query="wombat", mode="bm25", k=10, before="2021-01-01")
        assert _names(res) == {"old.md", "undated.md", "far.md"}
        res = d.call("search", query="wombat", mode="bm25", k=10, since="2021-06-01",
                     before="2021-06-02")  # a day: its daily note
        assert _names(res) == {"2021-06-01.md"}
        with pytest.raises(P.DaemonError, match=r"7d, 2w.*'last tuesday'"):
            d.call("search", query="wombat", since="last tuesday")

        r = ragctl("--config", d.config, "search", "wombat", "--since", "2w", "--json")
        out = json.loads(r.stdout)
        assert [Path(x["path"]).name for x in out["results"]] == ["edited.md"], r.stdout
        assert out["results"][0]["date_from"] == "frontmatter updated"
        date = out["results"][0]["date"]
        # the plain output shows which date the filter read
        r = ragctl("--config", d.config, "search", "wombat", "--since", "2w")
        assert f"({date}, frontmatter updated)" in r.stdout.splitlines()[0], r.stdout

        # a daily note renamed to another day is of that day
        (root / "2021-06-01.md").rename(root / "2021-07-09.md")
        d.call("wait", timeout=30)
        res = d.call("search", query="wombat", mode="bm25", k=10, since="2021-07-01",
                     before="2021-08-01", wait=10)
        assert _names(res) == {"2021-07-09.md"}


def test_an_index_of_an_older_parser_is_read_again_once(make_daemon, tmp_path):
    """An index written before notes had dates (note_date_ns NULL, read by parser 1) is read
    again at the next start, so its dates are there; a start after it reads nothing again."""
    root = _dated_vault(tmp_path / "v")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}])
    with d:
        d.wait_idle()
    db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
    db.execute("UPDATE files SET note_date_ns = NULL, meta = json_remove(meta, '$.date', "
               "'$.date_from')")
    reading = json.loads(db.execute("SELECT value FROM meta WHERE key = 'reading'").fetchone()[0])
    reading["v"].pop("parser")
    db.execute("UPDATE meta SET value = ? WHERE key = 'reading'", (json.dumps(reading),))
    db.commit()
    db.close()
    with d:
        d.wait_idle()
        res = d.call("search", query="wombat", mode="bm25", k=10, before="2021-01-01")
        assert _names(res) == {"old.md", "undated.md"}
        assert d.call("status")["totals"]["files_indexed"] == 4  # each read again
    with d:
        assert d.wait_idle()["totals"]["files_indexed"] == 0  # and once only
    db = sqlite3.connect(tmp_path / "data" / "index.sqlite3")
    assert db.execute("SELECT COUNT(*) FROM files WHERE note_date_ns IS NULL").fetchone()[0] == 1
    db.close()


def test_document_titles(make_daemon, tmp_path):
    """A PEP's Title header, an rst document title and a PDF's Title metadata are the notes'
    titles (the results' `title`, the first part of their heading); a PEP is dated by its
    Created header, a PDF by its ModDate."""
    root = tmp_path / "docs"
    root.mkdir()
    for pep in ("pep-0572.rst", "pep-0001.rst"):  # (the second: "pep" is in both)
        shutil.copy(VAULTS / "python-peps" / pep, root)
    (root / "guide.rst").write_text(".. a comment\n\n=================\nThe Pangolin Guide\n"
                                    "=================\n\nIntro.\n\nScales\n------\n\n"
                                    "Pangolin scales are keratin.\n")
    (root / "notes.txt").write_text("Title: Okapi Sightings\nCreated: 2022-04-01\n\n"
                                    "The okapi was seen near the river.\n")
    make_pdf(root / "report.pdf", [["The aardvark eats termites."]],
             {"Title": "Aardvark Field Report", "ModDate": "D:20230510120000Z"})
    make_pdf(root / "draft.pdf", [["The aardvark sleeps by day."]],
             {"Title": "Microsoft Word - draft3.docx"})
    d = make_daemon(sources=[{"name": "docs", "path": str(root), "kind": "folder",
                              "include": ["**/*.rst", "**/*.txt", "**/*.pdf"]}])
    with d:
        d.wait_idle()
        top = d.call("search", query="walrus operator", mode="bm25", k=1)["results"][0]
        assert Path(top["path"]).name == "pep-0572.rst"
        assert top["title"] == "Assignment Expressions"
        assert top["heading"].startswith("Assignment Expressions > "), top["heading"]
        assert (top["date"], top["date_from"]) == ("2018-02-28", "header Created")
        top = d.call("search", query="assignment expressions", mode="bm25", k=1)["results"][0]
        assert Path(top["path"]).name == "pep-0572.rst"  # the title's words find it
        top = d.call("search", query="pep-0572", mode="bm25", k=1)["results"][0]
        assert Path(top["path"]).name == "pep-0572.rst"  # and its file's name still does

        top = d.call("search", query="pangolin keratin", mode="bm25", k=1)["results"][0]
        assert top["title"] == "The Pangolin Guide"
        assert top["heading"] == "The Pangolin Guide > Scales"
        top = d.call("search", query="okapi river", mode="bm25", k=1)["results"][0]
        assert top["title"] == "Okapi Sightings" and top["date"] == "2022-04-01"

        hits = {Path(r["path"]).name: r for r in d.call(
            "search", query="aardvark", mode="bm25", k=5)["results"]}
        assert hits["report.pdf"]["title"] == "Aardvark Field Report"
        assert hits["report.pdf"]["date_from"] == "pdf ModDate"
        assert hits["report.pdf"]["date"].startswith("2023-05-10T12:00")
        assert hits["draft.pdf"]["title"] == "draft"  # a placeholder title: the file's name

        r = ragctl("--config", d.config, "search", "walrus operator", "--mode", "bm25", "-k", "1")
        assert "Assignment Expressions — " in r.stdout, r.stdout


def test_a_phrase_shows_the_lines_that_hold_it(make_daemon, tmp_path):
    """For a quoted phrase the lines shown are those holding the phrase, not the note's first
    lines nor lines with one of its words; a code block's lines only when they hold it."""
    root = tmp_path / "v"
    root.mkdir()
    note = "202210122014 - Forward Proxy.md"
    shutil.copy(VAULTS / "dwarvesf-brain" / "00_fleeting" / note, root)
    (root / "nginx.md").write_text(
        "# Nginx\n\nSetting up nginx takes a minute.\n\n```nginx\nlocation / {\n"
        "    proxy_pass http://app;\n}\n```\n\nHere nginx is the reverse\nproxy of the app.\n")
    d = make_daemon(sources=[{"name": "v", "path": str(root), "kind": "obsidian"}])
    with d:
        d.wait_idle()
        hits = {Path(r["path"]).name: r for r in d.call(
            "search", query='"reverse proxy"', mode="bm25", k=5)["results"]}
        lines = (root / note).read_text().split("\n")
        at = hits[note]["match_lines"]
        assert 14 in at and all("reverse" in lines[n - 1].lower() and "proxy" in
                                lines[n - 1].lower() for n in at), at
        assert hits["nginx.md"]["match_lines"] == [11, 12]  # across a line end; not the code
        r = ragctl("--config", d.config, "search", '"reverse proxy"', "--mode", "bm25")
        assert "   14: **reverse proxy:**" in r.stdout and "    8:" not in r.stdout, r.stdout
        assert "proxy_pass" not in r.stdout
