"""A real daemon over a document folder: Markdown, text, reStructuredText, PDF, ignore rules and
bad files; coverage through `ragctl files`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conftest import BM25_ONLY, Daemon, engine_config, make_pdf, ragctl, write_config


def make_folder(root: Path) -> Path:
    root.mkdir()
    (root / "notes.md").write_text("---\naliases: [Quagga Handbook]\ntags: [zoo]\n---\n"
                                   "# Care\n\nFeed twice a day.\n")
    (root / "readme.txt").write_text("Plain text about the axolotl.\n\nSecond paragraph.\n")
    (root / "guide.rst").write_text("Guide\n=====\n\nIntro.\n\nPangolin Section\n----------------\n\n"
                                    "Scales and more scales.\n")
    make_pdf(root / "paper.pdf", [["Journal of Okapi Studies", "The okapi lives in the Ituri",
                                   "rainforest of Congo.", "1"],
                                  ["Journal of Okapi Studies",
                                   "Its stripes help calves follow their mothers.", "2"]])
    (root / "binary.md").write_bytes(b"\x00\x01 binary")
    (root / "notes.md.swp").write_text("debris")
    (root / "drafts").mkdir()
    (root / "drafts" / "wip.md").write_text("work in progress about the okapi")
    (root / ".ragignore").write_text("drafts/\n")
    return root


def test_document_folder(make_daemon, tmp_path):
    root = make_folder(tmp_path / "docs")
    d = make_daemon(sources=[{"name": "docs", "path": str(root),
                              "include": ["**/*.md", "**/*.txt", "**/*.rst", "**/*.pdf", "**/*.swp"]}])
    with d:
        st = d.wait_idle()
        assert st["hints"] == []
        r = ragctl("--config", d.config, "files", "--json")
        files = {Path(f["path"]).name: f for f in json.loads(r.stdout)["files"]}
        assert set(files) == {"notes.md", "readme.txt", "guide.rst", "paper.pdf", "binary.md"}
        assert files["binary.md"]["status"] == "skipped"
        assert files["binary.md"]["reason"] == "binary file (contains NUL bytes)"
        # no embedding model here: related says so (it said "the embedding engine is
        # starting", for ever)
        r = ragctl("--config", d.config, "related", root / "notes.md")
        assert r.returncode == 2 and "no embedding model is configured" in r.stderr, r.stderr
        for name in ("notes.md", "readme.txt", "guide.rst", "paper.pdf"):
            assert files[name]["status"] == "indexed" and files[name]["chunks"] >= 1, files[name]
        r = ragctl("--config", d.config, "files", "--status", "skipped")
        assert "binary.md" in r.stdout and "1 skipped" in r.stdout
        # one column for the paths, "1 chunk" or "12 chunks" (a fresh-user walk)
        rows = ragctl("--config", d.config, "files").stdout.splitlines()[:-1]
        assert len({row.index("/") for row in rows}) == 1 and len(rows) > 3, rows

        hit = d.call("search", query="stripes calves", k=1)["results"][0]
        assert hit["path"].endswith("paper.pdf")
        assert (hit["line_start"], hit["line_end"]) == (2, 2)  # the page
        hit = d.call("search", query="rainforest congo", k=1)["results"][0]
        assert hit["path"].endswith("paper.pdf") and hit["line_start"] == 1
        assert hit["match_lines"] == [1]  # pages too (it was [2]: page 1 + the text's 2nd line)
        r = ragctl("--config", d.config, "search", "rainforest congo", "-k", "1")
        assert "paper.pdf:1\n" in r.stdout and "p.1: rainforest of Congo." in r.stdout, \
            r.stdout
        assert "Journal of Okapi Studies" not in hit["text"]  # running header dropped
        hit = d.call("search", query="quagga handbook", k=1)["results"][0]
        assert hit["path"].endswith("notes.md") and hit["line_start"] == 7  # found by alias
        hit = d.call("search", query="pangolin scales", k=1)["results"][0]
        assert hit["path"].endswith("guide.rst")
        assert hit["heading"] == "Guide > Pangolin Section"  # its rst title
        assert all("drafts" not in h["path"]  # .ragignore
                   for h in d.call("search", query="work in progress okapi", k=10)["results"])


def test_without_pdftotext_pdfs_are_skipped_with_how_to_install(tmp_path):
    root = make_folder(tmp_path / "docs")
    cfg = write_config(tmp_path / "c.toml", tmp_path / "data", tmp_path / "run" / "s.sock",
                       [{"name": "docs", "path": str(root)}], BM25_ONLY)
    env = dict(os.environ, PATH=str(Path(sys.executable).parent))  # no pdftotext on it
    d = Daemon(cfg, tmp_path / "run" / "s.sock", tmp_path / "log", env=env)
    with d:
        st = d.wait_idle()
        assert any("apt install poppler-utils" in h for h in st["hints"])
        files = {Path(f["path"]).name: f for f in d.call("files")["files"]}
        assert files["paper.pdf"]["status"] == "skipped"
        assert files["paper.pdf"]["reason"].startswith("PDF skipped: pdftotext is not installed")
        assert files["readme.txt"]["status"] == "indexed"
        assert d.call("search", query="axolotl", k=1)["results"]


def test_a_broken_pdf_is_skipped_with_one_line_of_reason(tmp_path):
    """pdftotext's complaint about a damaged PDF is many lines ("Syntax Error: ..." per
    object); the reason was its first 200 bytes, newlines and all, cut mid-word."""
    from ragd.ingest import documents
    bad = tmp_path / "corrupt.pdf"
    bad.write_bytes(b"%PDF-1.4\n" + bytes(range(1, 256)) * 12 + b"\n(unclosed <5c5c> hex")
    with pytest.raises(ValueError) as e:
        documents.pdf_text(bad)
    said = str(e.value)
    assert said.startswith("pdftotext failed: ") and "\n" not in said, said
    assert len(said) <= len("pdftotext failed: ") + 202
    assert documents.said("a\nb b\na\n" + "word " * 60).endswith(" …")
    assert documents.said("Syntax Error: x\nSyntax Error: x\n") == "Syntax Error: x"


def test_a_pdf_without_text_says_so(make_daemon, tmp_path):
    """A scanned PDF (pages of images) was 'indexed, 0 chunks' with no reason: silently never
    found. Its reason now says why."""
    root = tmp_path / "docs"
    root.mkdir()
    make_pdf(root / "scan.pdf", [[], []])
    d = make_daemon(sources=[{"name": "docs", "path": str(root), "include": ["**/*.pdf"]}],
                    extra=BM25_ONLY)
    with d:
        d.wait_idle()
        r = ragctl("--config", d.config, "files", "--json")
        f = json.loads(r.stdout)["files"][0]
        assert f["chunks"] == 0 and "no text in its 2 page(s)" in f["reason"], f


def test_related_of_a_skipped_file_says_why(make_daemon, tmp_path):
    """related of a file skipped as binary said "the note has no text to compare"."""
    root = tmp_path / "docs"
    root.mkdir()
    (root / "notes.md").write_text("# Okapi\n\nThe okapi lives in the Ituri rainforest.\n")
    (root / "binary.md").write_bytes(b"\x00\x01 binary")
    d = make_daemon(sources=[{"name": "docs", "path": str(root)}], extra=engine_config())
    with d:
        d.wait_idle(120, vectors=True)
        r = ragctl("--config", d.config, "related", root / "binary.md")
        assert r.returncode == 2 and "is not indexed: skipped, binary file" in r.stderr, \
            r.stderr
