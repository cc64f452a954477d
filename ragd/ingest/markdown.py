"""Markdown and Obsidian notes: frontmatter, structure, and the note's own syntax.

parse() turns a note into a Doc: its lines, its blocks (headings, paragraphs, fenced code,
tables, callouts/quotes, comments) with exact line numbers, and metadata (title, aliases, tags,
outgoing links, embeds, block ids, warnings). Chunks keep the raw lines for display; what is
searched and embedded is clean_text() of them: Obsidian syntax made readable.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field

from ragd import dates

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.+?)\s*#*\s*$")
TABLE = re.compile(r"^\s*\|")
QUOTE = re.compile(r"^\s{0,3}>")

WIKILINK = re.compile(r"(!?)\[\[([^\]\|#\^]*)(#\^?[^\]\|]*|\^[^\]\|]*)?(?:\|([^\]]*))?\]\]")
MDLINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]*)(?:\s+\"[^\"]*\")?\)")
TAG = re.compile(r"(?<![\w/&#])#([A-Za-z_][\w\-/]*)")
COMMENT = re.compile(r"%%.*?%%", re.S)
BLOCK_ID = re.compile(r"\s\^([A-Za-z0-9\-]+)\s*$")
HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)  # not shown by Obsidian (chunker.chunk_doc)
HTML_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9\-]*(?:\s[^<>]*)?/?>")
CALLOUT = re.compile(r"^([ \t]{0,3}>[ \t]*)\[!([\w\-]+)\][+\-]?[ \t]*", re.M)
MEDIA = (".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp", ".bmp", ".pdf", ".mp3", ".mp4",
         ".webm", ".wav", ".ogg", ".mov", ".excalidraw")


@dataclass
class Block:
    kind: str  # heading | para | code | table | quote | comment | page (a PDF page break)
    start: int  # 0-based first line
    end: int  # 0-based last line, inclusive
    level: int = 0
    title: str = ""


@dataclass
class Doc:
    lines: list[str]
    blocks: list[Block]
    title: str
    aliases: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    embeds: list[str] = field(default_factory=list)
    block_ids: list[tuple[str, int]] = field(default_factory=list)  # (id, 1-based line)
    warnings: list[str] = field(default_factory=list)
    obsidian: bool = False
    pages: list[int] | None = None  # PDFs: the page of each line
    date: datetime.datetime | None = None  # the note's own date (ragd/dates.py)
    date_from: str = ""  # where it says so: "frontmatter updated", "file name", ...

    def meta(self) -> dict:
        out = {"title": self.title}
        if self.date is not None:
            out["date"], out["date_from"] = dates.shown(self.date), self.date_from
        for key in ("aliases", "tags", "links", "embeds", "block_ids", "warnings"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out


# -- frontmatter --------------------------------------------------------------------------------

class FrontmatterError(ValueError):
    pass


def _scalar(v: str):
    v = v.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
        return v[1:-1]
    if v[:1] in ("\"", "'"):
        raise FrontmatterError(f"unterminated quote in {v[:30]!r}")
    if v.startswith("[") and not v.endswith("]"):
        raise FrontmatterError(f"unterminated list in {v[:30]!r}")
    if v.startswith("[") and v.endswith("]"):
        inner = v[1:-1].strip()
        return [_scalar(x) for x in _split_inline(inner)] if inner else []
    if v in ("", "~", "null"):
        return None
    return v


def _split_inline(s: str) -> list[str]:
    out, cur, quote = [], "", None
    for ch in s:
        if quote:
            cur += ch
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
            cur += ch
        elif ch == ",":
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if quote:
        raise FrontmatterError("unterminated quote in an inline list")
    out.append(cur)
    return [x for x in out if x.strip()]


def parse_frontmatter(lines: list[str]) -> dict:
    """The common YAML of notes: `key: scalar`, quoted strings, `[inline, lists]`, and `- item`
    lists; nested maps are kept as raw text. Raises FrontmatterError when a line fits none."""
    data: dict = {}
    key = None
    for i, line in enumerate(lines, 2):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        item = re.match(r"^\s*-\s*(.*)$", line)
        if item and key is not None:
            if not isinstance(data.get(key), list):
                data[key] = []
            value = _scalar(item.group(1))
            if value is not None:
                data[key].append(value)
            continue
        kv = re.match(r"^([A-Za-z0-9_][\w\- .]*?)\s*:(?:\s+(.*))?$", line)
        if kv:
            key = kv.group(1)
            data[key] = _scalar(kv.group(2) or "")
            continue
        if line.startswith((" ", "\t")) and key is not None:  # nested or folded text
            prev = data.get(key)
            data[key] = f"{prev or ''} {line.strip()}".strip() if not isinstance(prev, list) else prev
            continue
        raise FrontmatterError(f"line {i}: cannot read {line.strip()[:40]!r}")
    return data


def _as_list(v) -> list[str]:
    if v is None:
        return []
    if isinstance(v, list):
        return [str(x).strip() for x in v if x is not None and str(x).strip()]
    return [x.strip() for x in re.split(r"[,\s]+" if "," not in str(v) else r",", str(v))
            if x.strip()]


# -- structure ----------------------------------------------------------------------------------

def blocks_of(lines: list[str], start: int) -> list[Block]:
    out: list[Block] = []
    i, n = start, len(lines)
    while i < n:
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        m = FENCE.match(line)
        if m:
            mark = m.group(1)
            j = i + 1
            while j < n and not re.match(rf"^\s{{0,3}}{re.escape(mark[0])}{{{len(mark)},}}\s*$",
                                         lines[j]):
                j += 1
            end = min(j, n - 1)
            out.append(Block("code", i, end))
            i = end + 1
            continue
        if line.lstrip().startswith("%%"):
            j = i  # a %% comment ends on this line, or on the next line holding %%
            if "%%" not in line.lstrip()[2:]:
                j += 1
                while j < n and "%%" not in lines[j]:
                    j += 1
            end = min(j, n - 1)
            out.append(Block("comment", i, end))
            i = end + 1
            continue
        h = HEADING.match(line)
        if h:
            out.append(Block("heading", i, i, len(h.group(1)), h.group(2).strip()))
            i += 1
            continue
        for kind, pattern in (("table", TABLE), ("quote", QUOTE)):
            if pattern.match(line):
                j = i
                while j + 1 < n and pattern.match(lines[j + 1]):
                    j += 1
                out.append(Block(kind, i, j))
                i = j + 1
                break
        else:
            j = i
            while (j + 1 < n and lines[j + 1].strip() and not FENCE.match(lines[j + 1])
                   and not HEADING.match(lines[j + 1]) and not TABLE.match(lines[j + 1])
                   and not QUOTE.match(lines[j + 1])
                   and not lines[j + 1].lstrip().startswith("%%")):
                j += 1
            out.append(Block("para", i, j))
            i = j + 1
    return out


def parse(text: str, title: str, obsidian: bool = True) -> Doc:
    lines = text.split("\n")
    doc = Doc(lines=lines, blocks=[], title=title, obsidian=obsidian)
    body_start = 0
    if lines and lines[0].strip() == "---":
        close = next((i for i in range(1, len(lines)) if lines[i].strip() in ("---", "...")), None)
        if close is None:
            doc.warnings.append("frontmatter is not closed; indexed as text")
        else:
            try:
                fm = parse_frontmatter(lines[1:close])
            except FrontmatterError as e:
                doc.warnings.append(f"malformed frontmatter ({e}); indexed as text")
            else:
                body_start = close + 1
                if isinstance(fm.get("title"), str) and fm["title"].strip():
                    doc.title = fm["title"].strip()
                doc.aliases = _as_list(fm.get("aliases", fm.get("alias")))
                doc.tags = [t.lstrip("#") for t in _as_list(fm.get("tags", fm.get("tag")))]
                if (dated := dates.from_fields(fm, "frontmatter")) is not None:
                    doc.date, doc.date_from = dated
    doc.blocks = blocks_of(lines, body_start)
    if obsidian:
        _scan_syntax(doc)
    return doc


def _scan_syntax(doc: Doc) -> None:
    """Record links, embeds, inline tags and block ids (outside code and comments)."""
    links, embeds, tags = dict.fromkeys(doc.links), dict.fromkeys(doc.embeds), dict.fromkeys(doc.tags)
    for b in doc.blocks:
        if b.kind in ("code", "comment"):
            continue
        for i in range(b.start, b.end + 1):
            line = doc.lines[i]
            if "[[" not in line and "#" not in line and "^" not in line:
                continue  # most lines: nothing to find
            if "%%" in line:
                line = COMMENT.sub("", line)
            if "[[" in line:
                for m in WIKILINK.finditer(line):
                    target = m.group(2).strip()
                    if target:
                        (embeds if m.group(1) else links)[target] = None
            if "#" in line:
                # links first: [[#Heading]] and (url#anchor) are not tags, nor is `code`
                bare = MDLINK.sub(" ", WIKILINK.sub(" ", re.sub(r"`[^`]*`", "", line)))
                for m in TAG.finditer(bare):
                    tags[m.group(1)] = None
            if "^" in line:
                bid = BLOCK_ID.search(line)
                if bid:
                    doc.block_ids.append((bid.group(1), i + 1))
    doc.links, doc.embeds, doc.tags = list(links), list(embeds), list(tags)


# -- search text ----------------------------------------------------------------------------------

def _wikilink_text(m: re.Match) -> str:
    embed, target, sub, shown = m.group(1), m.group(2).strip(), m.group(3), m.group(4)
    if embed and target.lower().endswith(MEDIA):
        return ""  # an image / PDF embed is not text
    if shown:
        return shown.strip()
    sub = (sub or "").lstrip("#^").strip()
    if sub and (m.group(3) or "").startswith(("#^", "^")):
        sub = ""  # a block reference reads as the note's name
    return " ".join(x for x in (target, sub) if x)


def clean_text(text: str, obsidian: bool = True) -> str:
    """Readable text for search and embedding: links as their words, comments and markup out.
    (Each pattern runs only when its marker occurs: most text has none.)"""
    if obsidian:
        if "%%" in text:
            text = COMMENT.sub(" ", text)
        if "[[" in text:
            text = WIKILINK.sub(_wikilink_text, text)
        if "[!" in text:
            text = CALLOUT.sub(lambda m: f"{m.group(1)}{m.group(2)}: ", text)
        if "^" in text:
            text = "\n".join(BLOCK_ID.sub("", line) for line in text.split("\n"))
        if "#" in text:
            text = TAG.sub(lambda m: m.group(1).replace("/", " "), text)
    if ">" in text:
        text = re.sub(r"(?m)^[ \t]{0,3}>[ \t]?", "", text)  # quote and callout markers
    if "](" in text:
        text = MDLINK.sub(lambda m: "" if m.group(1) and m.group(3).lower().endswith(MEDIA)
                          else m.group(2), text)
    if "<" in text:
        text = HTML_TAG.sub(" ", text)
    return re.sub(r"[ \t]{2,}", " ", text).strip()
