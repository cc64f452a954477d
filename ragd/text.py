"""Text analysis shared by every stage: the words and symbols of a text as the index sees
them, the query's parts, its content words and names, the columns' weights, and the counts of
a word in the index (its document frequency). Ingest writes with it (a chunk's keywords and
symbols), the index (FTS5, tantivy, Milvus, editors' buffers) tokenizes with it, and search
asks with it; it imports none of them.
"""

from __future__ import annotations

import re
import sqlite3

from ragd.protocol import signs


def symbols(text: str) -> list[str]:
    """The signs of a text, in order: its symbol characters, Unicode's other symbols (So: emoji,
    dingbats — the ⛔ 📅 ✅ of a task line) and mathematical ones (Sm: arrows and signs, → ≤ ∅),
    then its ASCII operators (protocol.OPERATORS: ':=', '->', '!='). FTS5's tokenizer drops
    them all, so a search for one found nothing where grep finds it: the tantivy index keeps
    each as a token of its own (index/textindex.py), and FTS5 sees each as a word
    (symbol_words) in the keywords of the chunk holding it."""
    return signs(text)


def sign_word(sign: str) -> str:
    """The word FTS5 holds a sign by: "sym26d4" for ⛔, "op3a3d" for ':='."""
    if len(sign) == 1:
        return f"sym{ord(sign):x}"
    return "op" + "".join(f"{ord(ch):x}" for ch in sign)


def symbol_words(text: str) -> str:
    """Each sign of a text as a word FTS5 keeps (sign_word), space-separated."""
    return " ".join(sign_word(sign) for sign in symbols(text))


def with_symbols(heading: str, keywords: str, body: str) -> str:
    """A chunk's keywords: its note's aliases and tags, then the symbols of its heading path
    (the title's too), keywords and body as words (see symbols)."""
    signs = symbol_words(f"{heading}\n{keywords}\n{body}")
    return f"{keywords} {signs}" if keywords and signs else keywords or signs


def note_keywords(heading: str, keywords: str, body: str) -> str:
    """The note's own keywords out of a chunk's (with_symbols undone: the words it added are
    ASCII, so the symbols counted again are the same)."""
    signs = symbol_words(f"{heading}\n{keywords}\n{body}")
    return keywords[:-len(signs)].rstrip() if signs and keywords.endswith(signs) else keywords


# A query is free text: quoted "phrases" are kept as phrases, everything else becomes terms.
# Terms are OR-ed (BM25 semantics: every matching term adds to the score).
PHRASE = re.compile(r'"([^"]+)"')
WORD = re.compile(r"\w+", re.UNICODE)


def name_key(text: str) -> str:
    """A note's name (its title, an alias) as it is looked up, and a query compared with it:
    its words casefolded, a number padded to three digits or more without its zeros
    ("pep-0008" and "PEP 8" are both "pep 8")."""
    return " ".join(str(int(w)) if len(w) >= 3 and w[0] == "0" and w.isascii() and w.isdigit()
                    else w for w in WORD.findall(text.casefold()))


# Weights of the FTS columns (heading, keywords, body) in bm25(): a word of the heading path or
# of the note's aliases and tags counts a little more than one in the body.
HEADING_WEIGHT = 1.5
KEYWORDS_WEIGHT = 1.5
TEXT_WEIGHT = 1.0
WEIGHTS = f"{HEADING_WEIGHT}, {KEYWORDS_WEIGHT}, {TEXT_WEIGHT}"


def query_parts(text: str) -> list[str]:
    """The quoted FTS5 phrases of a free-text query: "phrases" as given, then each distinct
    word."""
    parts: list[str] = []
    for phrase in PHRASE.findall(text):
        words = WORD.findall(phrase)
        if words:
            parts.append('"' + " ".join(words) + '"')
    rest = PHRASE.sub(" ", text)
    seen: set[str] = set()
    for word in WORD.findall(rest):
        w = word.lower()
        if w not in seen:
            seen.add(w)
            parts.append(f'"{w}"')
    return parts


def symbol_parts(text: str) -> list[str]:
    """Each distinct symbol of a query as the FTS5 phrase of the word FTS5 holds it by
    (symbol_words: '"sym26d4"' for ⛔)."""
    return [f'"{sign_word(sign)}"' for sign in dict.fromkeys(symbols(text))]


def fts_parts(text: str) -> list[str]:
    """query_parts, then symbol_parts."""
    return query_parts(text) + symbol_parts(text)


def fts_query(text: str) -> str:
    """Turn free text into a safe FTS5 MATCH expression ('' when nothing is searchable)."""
    return " OR ".join(query_parts(text))


TEMP_TABLES = (
    # NOTE: the tokenizer must match chunks_fts in ragd/index/store.py.
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.stem_q USING fts5("
    "x, tokenize = 'porter unicode61 remove_diacritics 2')",
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.stem_v USING fts5vocab(temp, stem_q, row)",
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.stem_i USING fts5vocab(temp, stem_q, instance)",
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.chunks_v USING fts5vocab(main, chunks_fts, row)",
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.notes_v USING fts5vocab(main, notes_fts, row)",
)


def prepare(db: sqlite3.Connection) -> None:
    """Per connection, in its temp schema: a one-row FTS5 table with the index's tokenizer, to
    stem query words exactly as the index did, and vocabulary views to read their counts.
    Statement by statement (executescript would commit the caller's read transaction: a
    search reads one snapshot), and only once per connection."""
    try:
        db.execute("SELECT 1 FROM temp.stem_i LIMIT 0")
        return
    except sqlite3.OperationalError:
        pass
    for sql in TEMP_TABLES:
        db.execute(sql)


def doc_freq(db: sqlite3.Connection, phrase: str) -> int:
    """Rows of the index containing the rarest token of the phrase (as the index tokenizes)."""
    return doc_freqs(db, [phrase])[0]


def chunk_rows(db: sqlite3.Connection) -> int:
    """Chunks in the index (kept by triggers: store.m005; no counting)."""
    return db.execute("SELECT COALESCE(SUM(n), 0) FROM counts WHERE key = 'chunks'").fetchone()[0]


def doc_freqs(db: sqlite3.Connection, phrases: list[str], vocab: str = "chunks_v") -> list[int]:
    """doc_freq of each phrase, their words stemmed in one insert (an insert per phrase costs
    a statement each); vocab "notes_v": the notes holding it."""
    prepare(db)
    db.execute("DELETE FROM temp.stem_q")
    db.executemany("INSERT INTO temp.stem_q (rowid, x) VALUES (?, ?)",
                   [(i, p.strip('"')) for i, p in enumerate(phrases)])
    terms: dict[int, list[str]] = {}
    for doc, term in db.execute("SELECT doc, term FROM temp.stem_i"):
        terms.setdefault(doc, []).append(term)
    db.execute("DELETE FROM temp.stem_q")
    counts = {}
    for t in {t for ts in terms.values() for t in ts}:  # one lookup each: IN scans the vocab
        row = db.execute(f"SELECT doc FROM temp.{vocab} WHERE term = ?", (t,)).fetchone()
        counts[t] = row[0] if row else 0
    return [min((counts.get(t, 0) for t in terms.get(i, ())), default=0)
            for i in range(len(phrases))]


# A query word found in more than this share of the rows is dropped (see prune_common): in
# BM25 alone, words FTS5 scores at IDF ~0; inside hybrid search, also the filler of natural
# questions, which the vectors cover.
COMMON_SHARE = 0.5
HYBRID_COMMON_SHARE = 0.25


def prune_common(db: sqlite3.Connection, parts: list[str],
                 share: float = COMMON_SHARE, dfs: dict | None = None) -> list[str]:
    """Drop words found in over `share` of the rows, unless nothing else is left.

    Past half the rows FTS5 clamps a word's IDF to 1e-6: it adds nothing to any score, yet
    every row containing it is visited and scored, so dropping it keeps the ranking. Hybrid
    search drops words in over a quarter of the rows too: their IDF is at most ln 3 (a content
    word's is 5-10), yet each costs a visit of a quarter of the index — the "how", "do", "my"
    of natural questions, which the vectors cover. BM25 alone keeps half: there a vault's own
    frequent words ("task") carry meaning (docs/quality.md).
    """
    if len(parts) < 2:
        return parts
    prepare(db)
    rows = db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    counts = doc_freqs(db, parts)
    if dfs is not None:
        dfs.update(zip(parts, counts))
    kept = [p for p, df in zip(parts, counts) if df <= rows * share]
    return kept or parts


def index_tokens(db: sqlite3.Connection, texts: list[str]) -> list[str]:
    """Each text as the index's tokenizer sees it: its stemmed words, in order, space-separated
    (what a store backend is given, so that its BM25 matches words as FTS5 does)."""
    prepare(db)
    db.execute("DELETE FROM temp.stem_q")
    db.executemany("INSERT INTO temp.stem_q (rowid, x) VALUES (?, ?)", enumerate(texts))
    words: list[list[str]] = [[] for _ in texts]
    for doc, term in db.execute("SELECT doc, term FROM temp.stem_i ORDER BY doc, offset"):
        words[doc].append(term)
    db.execute("DELETE FROM temp.stem_q")
    return [" ".join(w) for w in words]


# A query word's stems (index_tokens), kept: the tokenizer is fixed, and a search asks for the
# same few words over and over (three SQL statements each time otherwise).
_WORD_TOKENS: dict[str, str] = {}
WORD_TOKENS_KEPT = 4096


def word_tokens(db: sqlite3.Connection, words: list[str]) -> list[str]:
    """index_tokens of short texts (query words), from what is kept when asked before."""
    new = [w for w in dict.fromkeys(words) if w not in _WORD_TOKENS]
    if new:
        if len(_WORD_TOKENS) + len(new) > WORD_TOKENS_KEPT:
            _WORD_TOKENS.clear()
        _WORD_TOKENS.update(zip(new, index_tokens(db, new)))
    return [_WORD_TOKENS[w] if w in _WORD_TOKENS else index_tokens(db, [w])[0] for w in words]


# Weights of notes_fts's columns (title, aliases and tags, headings, body), as the chunks'.
NOTE_COLUMN_WEIGHTS = (HEADING_WEIGHT, KEYWORDS_WEIGHT, HEADING_WEIGHT, TEXT_WEIGHT)
NOTE_WEIGHTS = ", ".join(map(str, NOTE_COLUMN_WEIGHTS))


# The note-level BM25 keeps only the query words found in at most this share of the chunks:
# FTS5 scores every note holding a word it is given, so the common ones cost a walk of most
# notes, and the rare words are what it adds (docs/quality.md: 0.1 gave the same quality as
# 0.25 at half the cost; 0.07 the same hybrid quality as 0.1, a tenth cheaper again).
NOTE_COMMON_SHARE = 0.07
# ... and words while their chunk counts add up to at most this: what the walk costs is bounded
# whatever the index's size. Under 10k chunks it never binds.
NOTE_POSTINGS = 20_000
# A word in at most this many chunks counts whatever the share: in a vault of a few dozen notes
# every word is in over 10% of the chunks.
NOTE_FEW = 50


def note_terms(db: sqlite3.Connection, query: str, dfs: dict | None = None,
               note_freq=None) -> list[str]:
    """The query parts the note-level BM25 uses: those in at most NOTE_COMMON_SHARE of the
    chunks or of the notes (or NOTE_FEW), the rarest first while their counts add up to
    NOTE_POSTINGS. `dfs`: the parts' chunk counts when the chunk ranking has them (tantivy's
    cost nothing; FTS5's vocabulary walks each word's list). `note_freq`: part -> the notes
    holding it, when the notes' tantivy index serves (else FTS5's vocabulary counts them)."""
    parts = query_parts(query)
    signs = list(dict.fromkeys(symbols(query)))
    if not parts and not signs:
        return []
    rows = chunk_rows(db)
    counts = ([dfs[p] for p in parts] if dfs is not None and all(p in dfs for p in parts)
              else doc_freqs(db, parts))
    signed = symbol_parts(query)  # (as FTS5 holds them, in the order of signs)
    # a symbol: the chunks holding it as tantivy counted them, else as FTS5 does
    counts += [dfs[ch] if dfs and ch in dfs else doc_freqs(db, [w])[0]
               for ch, w in zip(signs, signed)]
    parts = parts + signed
    notes = db.execute("SELECT COALESCE(SUM(n), 0) FROM counts WHERE key = 'indexed'"
                       ).fetchone()[0]
    kept, walked = [], 0
    for df, p in sorted(zip(counts, parts)):  # the rarest first, within the budget
        if walked + df > NOTE_POSTINGS:
            break
        if df > max(rows * NOTE_COMMON_SHARE, NOTE_FEW):
            # common among the chunks, maybe not among the notes: one long note can hold a
            # word in a thousand chunks. Its notes are counted (a walk of at most df entries),
            # unless it is a filler word ("how", "the": in most notes anyway).
            if p.strip('"') in STOPWORDS:
                continue
            ndf = note_freq(p) if note_freq is not None else doc_freqs(db, [p], "notes_v")[0]
            walked += ndf
            if ndf > max(notes * NOTE_COMMON_SHARE, NOTE_FEW) or walked + ndf > NOTE_POSTINGS:
                continue
            df = ndf
        kept.append(p)
        walked += df
    return kept


# Words that say nothing of what is asked (question and filler words). A query whose only
# BM25 matches are on these has nothing relevant on the keyword side.
STOPWORDS = frozenset("""
a about above after again all also am an and any are as at be because been before being
below between both but by can could did do does doing down during each either else ever
few for from further get gets got had has have having he her here hers him his how i if in
into is it its itself just let like may me might mine more most much must my myself no nor
not now of off on once one only or other our ours out over own please same shall she should
so some such than that the their theirs them then there these they this those through to
too under until up upon us very was way we were what when where whether which while who
whom whose why will with within without would yes yet you your yours yourself
""".split())


def names(query: str) -> list[str]:
    """The words a query writes as names: with a capital letter where a sentence does not
    start ("Todoist", "Google Calendar"), or one inside ("OAuth2", "iPhone", "PDF"), or an
    identifier's underscore ("pg_upgrade", "max_connections"); each once, lowercased."""
    out: list[str] = []
    for m in WORD.finditer(query):
        w = m.group(0)
        if len(w) < 2 or w.isdigit():
            continue
        before = query[:m.start()].rstrip()
        starts = not before or before[-1] in ".?!:;\"'(\u201c\u2018"
        if any(c.isupper() for c in w[1:]) or (w[0].isupper() and not starts) \
                or "_" in w.strip("_"):
            if w.lower() not in out and w.lower() not in STOPWORDS:
                out.append(w.lower())
    return out


def plain_words(query: str) -> list[str]:
    """The query's distinct words outside its quoted phrases, lowercased."""
    return list(dict.fromkeys(w.lower() for w in WORD.findall(PHRASE.sub(" ", query))))


def content_terms(query: str) -> list[str]:
    """The query's words that carry its meaning (not question or filler words)."""
    return [w for w in plain_words(query) if w not in STOPWORDS] + \
        [f'"{p}"' for p in PHRASE.findall(query)]
