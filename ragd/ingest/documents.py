"""Document formats other than Markdown: plain text, reStructuredText and PDF, each turned into
the same Doc (lines + blocks) the chunker reads."""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
from pathlib import Path

from ragd import dates
from ragd.ingest.markdown import Block, Doc

RST_ADORN = re.compile(r"^([=\-~`:#\"^+*._'!$%&,;/<>?@\[\]{}|])\1{2,}\s*$")
PDFTOTEXT_HINT = ("install poppler-utils: apt install poppler-utils on Debian/Ubuntu, "
                  "brew install poppler on macOS")


class NeedsTool(Exception):
    """A format needs an external program that is not installed; the message says which."""


def paragraphs(lines: list[str], start: int = 0, end: int | None = None) -> list[Block]:
    out, i, end = [], start, len(lines) if end is None else end
    while i < end:
        if not lines[i].strip():
            i += 1
            continue
        j = i
        while j + 1 < end and lines[j + 1].strip():
            j += 1
        out.append(Block("para", i, j))
        i = j + 1
    return out


HEADER = re.compile(r"^([A-Za-z][A-Za-z0-9\-]*):(?:[ \t]+(.*))?$")  # ('Post-History:' empty)


def headers(lines: list[str], least: int = 2) -> dict[str, str]:
    """The RFC 822 style headers a document opens with, as a PEP's (`PEP: 572`, `Title:
    Assignment Expressions`, `Created: 28-Feb-2018`, continued on indented lines), up to the
    first blank line; {} when it does not open with at least `least` of them."""
    out: dict[str, str] = {}
    last = None
    for line in lines:
        if not line.strip():
            break
        m = HEADER.match(line)
        if m:
            last = m.group(1)
            out[last] = (m.group(2) or "").strip()
        elif line[:1] in (" ", "\t") and last is not None:
            out[last] += " " + line.strip()
        else:
            return {}
    return out if len(out) >= least else {}


def retitle(doc: Doc, title: str) -> None:
    """The document's own title for its note's; the file's name it had stays one of its names
    (an alias: its chunks' keywords), so that 'pep-0572' still finds it."""
    if doc.title and doc.title not in doc.aliases and doc.title != title:
        doc.aliases.append(doc.title)
    doc.title = title


def _with_headers(doc: Doc) -> Doc:
    """A document's headers (headers) name its title, date, and its number when its first
    header gives one ("PEP: 8": an alias "PEP 8", the name people look it up by)."""
    found = headers(doc.lines[:200])
    if found.get("Title"):
        retitle(doc, found["Title"])
    key, value = next(iter(found.items()), ("", ""))
    if value.isascii() and value.isdigit() and f"{key} {int(value)}" not in doc.aliases:
        doc.aliases.append(f"{key} {int(value)}")
    # One line alone is a header only when it dates the document ("Created: 2024-02-03",
    # then a blank line): "Note: call Bob" opening a text is no title, but a date line is
    # what it says, and --since would otherwise go by the file's modification time.
    lone = headers(doc.lines[:2], least=1) if not found else {}
    if (dated := dates.from_fields(found or lone, "header")) is not None:
        doc.date, doc.date_from = dated
    return doc


def parse_text(text: str, title: str) -> Doc:
    lines = text.split("\n")
    return _with_headers(Doc(lines=lines, blocks=paragraphs(lines), title=title))


# reStructuredText's inline markup in a title: ``literal``, :role:`text`, `text <target>`_ and
# backslash escapes ("\*\*kwargs", "``ExceptionGroup``\ s")
RST_LITERAL = re.compile(r"``(.+?)``")
RST_ROLE = re.compile(r":[\w.+-]+:`([^`]*)`")
RST_REF = re.compile(r"`([^`<]*?)\s*(?:<[^>`]*>)?`__?")


def rst_inline(text: str) -> str:
    """A title or heading without its reStructuredText inline markup, as docutils shows it:
    it is what a result's heading shows and what its chunks are embedded under."""
    text = RST_LITERAL.sub(r"\1", text)
    text = RST_ROLE.sub(r"\1", text)
    text = RST_REF.sub(r"\1", text)
    # an escaped character is itself, but an escaped space joins ("``X``\ s": "Xs")
    return re.sub(r"\\(.)", lambda m: "" if m.group(1) == " " else m.group(1), text)


def parse_rst(text: str, title: str) -> Doc:
    """Section titles (underlined, optionally overlined) become headings, levels in order of
    first appearance as in docutils; `::` literal blocks and directives stay whole."""
    lines = text.split("\n")
    styles: list[tuple[str, bool]] = []
    blocks: list[Block] = []
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        over = RST_ADORN.match(line) and i + 2 < n and RST_ADORN.match(lines[i + 2]) \
            and lines[i + 1].strip() and lines[i + 2][0] == line[0]
        under = (i + 1 < n and line.strip() and not line.startswith((" ", "\t"))
                 and RST_ADORN.match(lines[i + 1]) and len(lines[i + 1].rstrip()) >= len(line.rstrip()) * 0.8)
        if over or under:
            style = (lines[i + 2 if over else i + 1][0], bool(over))
            if style not in styles:
                styles.append(style)
            text_line = lines[i + 1] if over else line
            end = i + 2 if over else i + 1
            blocks.append(Block("heading", i, end, styles.index(style) + 1,
                                rst_inline(text_line.strip())))
            i = end + 1
            continue
        if not line.strip():
            i += 1
            continue
        # a paragraph, plus the indented block a `::` or a directive introduces
        j = i
        while j + 1 < n and lines[j + 1].strip() and not (
                j + 2 < n and RST_ADORN.match(lines[j + 2]) and not lines[j + 1].startswith(" ")):
            j += 1
        if lines[j].rstrip().endswith("::") or line.startswith(".. "):
            k = j + 1
            while k < n and (not lines[k].strip() or lines[k].startswith((" ", "\t"))):
                k += 1
            while k - 1 > j and not lines[k - 1].strip():
                k -= 1
            kind = "code" if k - 1 > j else "para"
            blocks.append(Block(kind, i, max(j, k - 1)))
            i = max(j, k - 1) + 1
            continue
        blocks.append(Block("para", i, j))
        i = j + 1
    doc = Doc(lines=lines, blocks=blocks, title=title)
    if (named := rst_title(blocks)) is not None:
        retitle(doc, named)
    doc = _with_headers(doc)
    doc.title = rst_inline(doc.title)  # (a PEP's Title: header is reStructuredText too)
    return doc


def rst_title(blocks: list[Block]) -> str | None:
    """The document title, as docutils takes it: the first section title, when its adornment
    style is used by no other (a lone overlined or underlined title above the sections; a PEP's
    first heading, 'Abstract', is one of many of its style, and is not)."""
    heads = [b for b in blocks if b.kind == "heading"]
    if not heads or sum(1 for b in heads if b.level == heads[0].level) > 1:
        return None
    return heads[0].title or None


PDFTOTEXT_TIMEOUT = 120  # seconds
NEEDS_PDFTOTEXT = "PDF skipped: pdftotext is not installed"


def said(stderr: str, limit: int = 200) -> str:
    """A tool's complaint as one line (a file's reason, an error reply): its distinct lines
    joined, cut at a word with "…" past `limit` characters (pdftotext repeats "Syntax Error:
    ..." per object; cut mid-word after 200 bytes, with its newlines, it was several lines)."""
    lines = list(dict.fromkeys(" ".join(ln.split()) for ln in stderr.splitlines()))
    text = "; ".join(ln for ln in lines if ln) or "(it said nothing)"
    if len(text) > limit:
        text = text[:limit].rsplit(" ", 1)[0].rstrip(";,:") + " …"
    return text


def pdf_text(path: Path, fd: int | None = None) -> list[str]:
    """The text of each page, by pdftotext; of the open file `fd` when given (handed to it as
    /dev/fd/N: the file opened, not whatever the path names by the time it runs)."""
    exe = shutil.which("pdftotext")
    if exe is None:
        raise NeedsTool(f"{NEEDS_PDFTOTEXT}; {PDFTOTEXT_HINT}")
    try:
        proc = subprocess.run([exe, "-enc", "UTF-8", str(path) if fd is None else
                               f"/dev/fd/{fd}", "-"], capture_output=True,
                              timeout=PDFTOTEXT_TIMEOUT, stdin=subprocess.DEVNULL,
                              pass_fds=() if fd is None else (fd,))
    except subprocess.TimeoutExpired:
        err = ValueError(f"pdftotext took over {PDFTOTEXT_TIMEOUT} s")
        err.retry = True  # a slow moment of the machine, not the file's fault: try again later
        raise err from None
    if proc.returncode != 0:
        raise ValueError(f"pdftotext failed: {said(proc.stderr.decode(errors='replace'))}")
    pages = proc.stdout.decode("utf-8", errors="replace").split("\f")
    if pages and not pages[-1].strip():
        pages.pop()
    return pages


PDF_NO_TITLE = re.compile(r"(untitled|microsoft \w+ - .*|.*\.(docx?|pdf|tex|dvi|odt|rtf|ps))",
                          re.I)  # what writers put in a PDF's Title for want of one


def pdf_info(fd: int) -> dict[str, str]:
    """A PDF's document information by pdfinfo (Title, CreationDate, ModDate, ...), of the open
    file `fd`; {} when pdfinfo is missing or fails: the text is indexed all the same."""
    exe = shutil.which("pdfinfo")
    if exe is None:
        return {}
    try:
        proc = subprocess.run([exe, "-enc", "UTF-8", "-isodates", f"/dev/fd/{fd}"],
                              capture_output=True, timeout=30, stdin=subprocess.DEVNULL,
                              pass_fds=(fd,))
    except subprocess.TimeoutExpired:
        return {}
    if proc.returncode != 0:
        return {}
    out = {}
    for line in proc.stdout.decode("utf-8", errors="replace").splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            out[key.strip()] = value.strip()
    return out


def with_pdf_info(doc: Doc, info: dict[str, str]) -> Doc:
    """A PDF's Title (unless it is a placeholder, a file name) is its note's title; its ModDate
    (else CreationDate) its date."""
    title = " ".join(info.get("Title", "").split())
    if title and not PDF_NO_TITLE.fullmatch(title):
        retitle(doc, title)
    for key in ("ModDate", "CreationDate"):
        when = dates.from_pdf(info.get(key, ""))
        if when is not None:
            doc.date, doc.date_from = when, f"pdf {key}"
            break
    return doc


def parse_pdf(pages: list[str], title: str) -> Doc:
    """Pages become lines tagged with their page number. Running headers and footers (the same
    first or last line, digits aside, on at least half the pages) and bare page numbers are
    dropped; words
    hyphenated across line ends are joined again."""
    page_lines = [[ln.rstrip() for ln in p.split("\n")] for p in pages]
    edges: collections.Counter[str] = collections.Counter()
    for lines in page_lines:
        content = [ln.strip() for ln in lines if ln.strip()]
        for ln in {*content[:1], *content[-1:]}:
            edges[re.sub(r"\d+", "#", ln)] += 1
    running = {k for k, c in edges.items() if len(page_lines) >= 2 and c >= max(2, len(page_lines) / 2)}
    lines: list[str] = []
    pages_of: list[int] = []
    blocks: list[Block] = []
    for pno, plines in enumerate(page_lines, 1):
        first = len(lines)
        blocks.append(Block("page", first, first, pno))  # chunks do not cross pages
        for ln in plines:
            s = ln.strip()
            if re.fullmatch(r"(page\s*)?\d+(\s*(/|of)\s*\d+)?", s, re.I):
                continue
            if s and re.sub(r"\d+", "#", s) in running:
                continue
            if lines and re.search(r"[A-Za-z]-$", lines[-1]) and re.match(r"^[a-z]", s) \
                    and pages_of[-1] == pno:
                lines[-1] = lines[-1][:-1] + s  # hyphenated line end joined again
                continue
            lines.append(s)
            pages_of.append(pno)
        lines.append("")
        pages_of.append(pno)
        blocks += paragraphs(lines, first, len(lines))
    return Doc(lines=lines, blocks=blocks, title=title, pages=pages_of)
