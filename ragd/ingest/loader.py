"""From a file on disk to a parsed Doc, by its type; the indexer's one entry into ingest."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ragd import dates
from ragd.config import Source
from ragd.ingest import documents, markdown, sources
from ragd.ingest.markdown import Doc

MARKDOWN = (".md", ".markdown")
# How files become Docs: another version reads every file again once (runtime._reading), so
# that what a new parser finds (2: a note's date, a document's title; 3: a number as a
# document's name; 4: arrows and mathematical signs as words; 5: ASCII operators too, ':='
# '->'; 6: an empty note as one chunk of its title; 7: a document's date from one header
# line) is in the index.
PARSER = 7
SLOW = (".pdf",)  # read through a helper program, which may take seconds: off the main lane
# A file this large is read and chunked off the main lane too, whatever its type: its chunking
# takes long enough to hold up the small notes saved after it
SLOW_BYTES = 1 << 20


def is_slow(rel: str, size: int | None = None) -> bool:
    return Path(rel).suffix.lower() in SLOW or (size is not None and size > SLOW_BYTES)


@dataclass
class Loaded:
    doc: Doc
    hash: str
    size: int
    mtime_ns: int


def parse(src: Source, rel: str, text: str) -> Doc:
    """Parse text as the file at rel would be parsed (an editor's unsaved buffer)."""
    title = sources.printable(Path(rel).stem)
    suffix = Path(rel).suffix.lower()
    if suffix == ".pdf":
        raise ValueError("a PDF has no text buffer")
    if text.startswith("\ufeff"):
        text = text[1:]
    if suffix in MARKDOWN:
        doc = markdown.parse(text, title, obsidian=src.kind == "obsidian")
    elif suffix == ".rst":
        doc = documents.parse_rst(text, title)
    else:
        doc = documents.parse_text(text, title)
    return _dated(doc, rel)


def _dated(doc: Doc, rel: str) -> Doc:
    """A note that states no date of its own is dated by its file name when it is a daily
    note's (2024-03-05.md)."""
    if doc.date is None and (when := dates.from_file_name(Path(rel).name)) is not None:
        doc.date, doc.date_from = when, "file name"
    return doc


def load(src: Source, rel: str, max_bytes: int) -> Loaded:
    """Read and parse one file. Raises sources.Unreadable (with the reason) when it cannot be
    indexed, or documents.NeedsTool when a helper program is missing."""
    path = src.root / rel
    sources.check_inside(src, path)
    title = sources.printable(Path(rel).stem)
    suffix = Path(rel).suffix.lower()
    # The file is opened once, inside its source, and everything is read from that descriptor
    # (pdftotext too): a folder swapped for a link meanwhile cannot lead the read out of it.
    if suffix == ".pdf":
        with sources.opened(path, max_bytes, src.root) as (fd, st):
            raw = sources.read_fd(fd, st, max_bytes)
            try:
                pages = documents.pdf_text(path, fd=fd)
            except ValueError as e:
                raise sources.Unreadable(str(e), retry=getattr(e, "retry", False)) from None
            info = documents.pdf_info(fd)
        doc = _dated(documents.with_pdf_info(documents.parse_pdf(pages, title), info), rel)
        if not any(p.strip() for p in pages):  # said, or it is silently never found
            doc.warnings.append(f"no text in its {len(pages)} page(s): a scan? ragd reads a "
                                f"PDF's text, not its images (no OCR)")
        return Loaded(doc, raw.hash, raw.size, raw.mtime_ns)
    content = sources.read(path, max_bytes, src.root)
    if suffix in MARKDOWN:
        doc = markdown.parse(content.text, title, obsidian=src.kind == "obsidian")
    elif suffix == ".rst":
        doc = documents.parse_rst(content.text, title)
    else:
        doc = documents.parse_text(content.text, title)
    if content.warning:
        doc.warnings.insert(0, content.warning)
    return Loaded(_dated(doc, rel), content.hash, content.size, content.mtime_ns)
