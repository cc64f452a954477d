"""Grounded answers: retrieve notes as `search` does, then let the generator (a chat model in
its own engine, ``[generator]``) answer from them alone, citing them.

    question ─ search (note level) ─ nothing relevant / low confidence ─→ "I don't know"
                  │
                  └ the best notes, numbered [1] [2] …, cut to fit the context
                      ─ /v1/chat/completions (stream) ─ the answer, token by token
                      ─ cites none of them ─→ "I don't know"

The prompt allows only the retrieved text and asks for citations ``[n]``. An answer that cites
no source is not shown as an answer: the reply says "I don't know from your notes" (the
model's text is kept apart, labelled ``ungrounded_answer``). So that nothing uncited reaches a
client as if it were grounded, the streamed text is held back until the answer has cited a
source; from then on each token is sent as it comes.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass

from ragd import protocol as P
from ragd.engines.client import EngineError, EngineUnavailable
from ragd.replies import OpError, Stream

DONT_KNOW = "I don't know from your notes."

SYSTEM = ("You answer questions using only the user's notes, numbered like [1]. Do not use "
          "anything else you know. Answer briefly, and end each sentence with the number of the "
          "note it comes from in brackets, e.g. [1]. If the notes do not contain the answer, "
          "reply only: " + DONT_KNOW)
# One worked example, as an earlier turn of the conversation: a small model follows a format it
# has seen far better than one it is told about (SmolLM2-135M cited 3 of 5 answerable test
# questions with it, 0 of 5 without). Its notes are made up and never among the sources.
EXAMPLE = [{"role": "user", "content": "Notes:\n\n[1] Cats\nOur cat sleeps about 15 hours a "
                                       "day and eats twice.\n\n[2] Plants\nWater the fern every "
                                       "Sunday.\n\nQuestion: How often do I water the fern?"},
           {"role": "assistant", "content": "Water the fern every Sunday [2]."}]

# Tokens kept free besides the counted text: the chat template's markers around each message
# and the generation prompt (ChatML: ~5 per message), with room to spare.
TEMPLATE_SLACK = 32
MIN_NOTE_TOKENS = 48  # a note cut shorter than this is left out instead
READ_TIMEOUT = 600.0  # seconds the engine may go without sending anything (a long prompt, or
# another ask ahead of this one in its single slot)
MIN_PROMPT_ROOM = 256  # max_tokens may take the context up to this
# Below this share of chunks with a vector, ask does not answer: the note that answers by
# meaning alone may not be embedded yet, and an answer from what is would look complete.
ASK_COVERAGE = 0.95

_CITE = re.compile(r"\[(\d{1,3}(?:\s*[,;]\s*\d{1,3})*)\]")
_WORDS = re.compile(r"[^\W\d_]{1,}|\d+", re.UNICODE)
_BULLET = re.compile(r"\s*(?:[-*+>]|\d+[.)])?\s*$")
# The made-up notes of EXAMPLE, as the prompt lists them: a small model that echoes the
# example ("[1] Cats [2] Plants") has not cited anything.
EXAMPLE_HEADERS = ("Cats", "Plants")


def citations(text: str, n: int, headers: tuple[str, ...] = (), final: bool = True
              ) -> list[int]:
    """The source numbers the text cites, each once, in order of first mention. A citation is
    a marker (``[2]``, ``[1, 3]``, ``[1][2]``) right after a claim, of a source given (1..n):

    - a marker that starts its line (a list item, "[1] Cats") cites nothing: it lists;
    - a marker followed by a note's header as the prompt shows it (``headers``: "[n] Title",
      and the example's) echoes the prompt's list of notes;
    - a Markdown link label or reference (``[Task Filters][1]``, ``[1]: url``, ``[1](url)``)
      is a link.

    While the answer is still coming (``final`` False), a marker whose following text could
    still become a header is not counted yet."""
    out: list[int] = []
    heads = [h.strip() for h in (*headers, *EXAMPLE_HEADERS) if h and h.strip()]
    prev_end, prev_ok = 0, False
    for m in _CITE.finditer(text):
        start, end = m.span()
        between = text[prev_end:start]
        adjacent = prev_ok and not between.strip()  # [1][2]: one group of citations
        line = text[text.rfind("\n", 0, start) + 1:start]
        after = text[end:text.find("\n", end) if "\n" in text[end:] else len(text)]
        nums = [int(x) for x in re.split(r"[,;]", m.group(1))]
        ok = all(1 <= k <= n for k in nums)
        if text[:start].endswith("]") and not adjacent:
            ok = False  # [label][1]: a reference link
        if re.match(r"\s*:\s|\(", after):
            ok = False  # [1]: url, [1](url)
        if not adjacent and (_BULLET.fullmatch(line) or not _WORDS.search(between if
                                                                          prev_end else line)):
            ok = False  # no claim before it: a list of the notes, not a citation
        rest = after.lstrip()
        if any(rest.lower().startswith(h.lower()) for h in heads):
            ok = False  # "[1] Cats": the prompt's list of notes, echoed
        elif not final and (not rest or any(h.lower().startswith(rest.lower()) for h in heads)):
            ok = False  # may still become an echo: not yet
        if ok:
            out.extend(k for k in nums if k not in out)
        prev_end, prev_ok = end, ok
    return out


@dataclass
class Note:
    """One retrieved note as the prompt shows it: its best passage, under its heading path,
    and its second best when it matched nearly as well (`also`: heading, line_start,
    line_end, text) — a tip beside the explanation it belongs to."""
    n: int
    path: str
    source: str
    title: str
    heading: str
    line_start: int
    line_end: int
    text: str
    cut: bool = False  # the passage was cut to fit the context
    also: dict | None = None

    def header(self) -> str:
        return f"[{self.n}] {self.heading or self.title}\n"

    def block(self) -> str:
        if not self.also:
            return self.header() + self.text
        head = self.also["heading"].split(" > ")[-1] if self.also["heading"] else ""
        return (self.header() + self.text + "\n\n" + (f"({head})\n" if head else "")
                + self.also["text"])

    def public(self) -> dict:
        return asdict(self)

    def cited(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k not in ("text", "cut", "also")}
        if self.also:
            out["also"] = {k: v for k, v in self.also.items() if k != "text"}
        return out


def _count(client, text: str) -> int:
    return len(client.tokenize(text))


def fit_notes(client, results: list[dict], question: str, context: int,
              max_tokens: int) -> list[Note]:
    """Number the results' best passages and keep those that fit in the context beside the
    instructions, the question and the answer; the last one may be cut (whole lines are not
    needed: tokens are). Counted with the generator's own tokenizer."""
    room = (context - max_tokens - TEMPLATE_SLACK - _count(client, SYSTEM)
            - sum(_count(client, m["content"]) + 8 for m in EXAMPLE)
            - _count(client, f"Notes:\n\n\n\nQuestion: {question}"))
    notes: list[Note] = []
    for r in results:
        note = Note(len(notes) + 1, r["path"], r["source"], r.get("title") or "",
                    r.get("heading") or "", r["line_start"], r["line_end"], r["text"],
                    also=r.get("second"))
        need = _count(client, note.block()) + 2  # the blank line between notes
        if need > room and note.also:  # its best passage alone, then
            note.also = None
            need = _count(client, note.block()) + 2
        if need <= room:
            notes.append(note)
            room -= need
            continue
        keep = room - 2 - _count(client, note.header())
        if keep >= MIN_NOTE_TOKENS:
            note.text = client.detokenize(client.tokenize(note.text)[:keep]).rstrip() + " …"
            note.cut = True
            notes.append(note)
        break
    return notes


def messages(question: str, notes: list[Note]) -> list[dict]:
    body = "\n\n".join(n.block() for n in notes)
    return [{"role": "system", "content": SYSTEM}, *EXAMPLE,
            {"role": "user", "content": f"Notes:\n\n{body}\n\nQuestion: {question}"}]


def dont_know(question: str, reason: str, search: dict, **extra) -> dict:
    return {"question": question, "answer": DONT_KNOW, "grounded": False, "reason": reason,
            "citations": [], "sources": [], "retrieved": len(search.get("results", [])),
            "used": 0, "search": _search_info(search), **extra}


def _search_info(res: dict) -> dict:
    return {k: res.get(k) for k in ("mode", "degraded", "confidence", "low_confidence",
                                    "below_threshold", "unknown_names", "vector_coverage",
                                    "elapsed_ms") if k in res}


def ask(search, cfg, engines, question: str, k: int | None, max_tokens: int | None,
        sources: list | None, path: str | None, tag: str | None):
    """The `ask` op (see docs/protocol.md): a final reply alone when the notes have nothing
    to say, else a Stream: the notes used, the answer's text as it comes, the final reply.
    `search`: the search op (ops/search.py), called as a client would."""
    t0 = time.perf_counter()
    if not question.strip():
        raise OpError(P.BAD_ARGS, "ask: empty question")
    k = cfg.generator_notes if k is None else k
    if not 1 <= k <= 50:  # a bad request is said first, whatever runs
        raise OpError(P.BAD_ARGS, f"ask: 'k' must be between 1 and 50, got {k}")
    if "generator" not in engines.configured:
        raise OpError(P.UNAVAILABLE, "ask: no generator (chat model) is configured: set "
                      "[generator] model in the config (e.g. \"smollm2-135m-instruct\") and "
                      "restart ragd")
    why = engines.unavailable("generator")
    engine = engines.gen_engine
    if why is None and (engine is None or not engine.ready):
        why = "the generator engine is starting"
    if why is not None:
        raise OpError(P.UNAVAILABLE, f"ask: {why}")
    context = engine.model.context
    if max_tokens is None:  # the configured length, within a context smaller than configured
        max_tokens = min(cfg.generator_max_tokens, context - MIN_PROMPT_ROOM)
    if not 1 <= max_tokens <= context - MIN_PROMPT_ROOM:
        raise OpError(P.BAD_ARGS, f"ask: 'max_tokens' must be between 1 and "
                      f"{context - MIN_PROMPT_ROOM} (the generator's context is {context})")

    found = search(query=question, k=k, mode=None, sources=sources, rerank=None,
                           wait=0, path=path, tag=tag, group="note", second=True)
    if not found["results"]:
        return dont_know(question, found.get("reason") or "nothing relevant in the notes",
                         found)
    if found.get("low_confidence"):
        why = ("no note mentions " + ", ".join(repr(n) for n in found["unknown_names"])
               if found.get("unknown_names") else
               "no note is close in meaning, and only some of the question's distinctive "
               "words are in the notes found" if found.get("below_threshold") else
               "few of the question's distinctive words are in the notes found")
        return dont_know(question, f"low confidence ({found.get('confidence')}): {why}", found)
    coverage = found.get("vector_coverage")
    if coverage is not None and coverage < ASK_COVERAGE:
        return dont_know(question, f"vectors are still being computed ({100 * coverage:.0f}% "
                         f"of the notes so far): a note that answers only by its meaning may not "
                         f"be found yet; ask again once 'ragctl status' shows every chunk "
                         f"embedded", found)
    client = engine.client
    try:
        notes = fit_notes(client, found["results"], question, context, max_tokens)
    except (EngineUnavailable, EngineError) as e:
        raise OpError(P.UNAVAILABLE, f"ask: the generator engine: {e}") from None
    if not notes:
        raise OpError(P.BAD_ARGS, f"ask: the question leaves no room for notes in the "
                      f"generator's context ({context} tokens, {max_tokens} for the answer)")
    body = {"messages": messages(question, notes), "max_tokens": max_tokens,
            "temperature": cfg.generator_temperature, "cache_prompt": True}
    retrieval_ms = (time.perf_counter() - t0) * 1e3
    state: dict = {"text": "", "timings": {}, "first_token": None, "first_shown": None,
                   "finish": None, "tokens": 0, "progress": 0.0}
    headers = tuple(n.heading or n.title for n in notes)

    def items():
        yield {"sources": [n.public() for n in notes], "retrieved": len(found["results"]),
               "used": len(notes)}
        shown = 0
        try:
            for event in client.chat_stream(body, timeout=READ_TIMEOUT):
                if event.get("timings"):
                    state["timings"] = event["timings"]
                choice = (event.get("choices") or [{}])[0]
                state["finish"] = choice.get("finish_reason") or state["finish"]
                delta = (choice.get("delta") or {}).get("content")
                if not delta:
                    continue
                state["text"] += delta
                state["tokens"] += 1
                if state["first_token"] is None:
                    state["first_token"] = time.perf_counter()
                    state["progress"] = time.monotonic()
                    yield {"writing": True}  # the model has begun (its text may be held back)
                if shown == 0 and not citations(state["text"], len(notes), headers,
                                                final=False):
                    # held back until it cites a source; a line of progress at most every
                    # second (and: is the client still there?)
                    now = time.monotonic()
                    if now - state["progress"] >= 1.0:
                        state["progress"] = now
                        yield {"writing": True, "tokens": state["tokens"]}
                    else:
                        yield None
                    continue
                if state["first_shown"] is None:
                    state["first_shown"] = time.perf_counter()
                yield {"delta": state["text"][shown:]}
                shown = len(state["text"])
        except EngineUnavailable as e:
            raise OpError(P.UNAVAILABLE, f"ask: the generator engine stopped while answering "
                          f"({e}); ragd restarts it: ask again in a moment") from None
        except EngineError as e:
            raise OpError(P.UNAVAILABLE, f"ask: the generator engine refused the request: "
                          f"{e}") from None

    def last() -> dict:
        text = state["text"].strip()
        cited = citations(text, len(notes), headers)
        t = state["timings"]

        def ms(when):
            return round((when - t0) * 1e3, 1) if when is not None else None

        timings = {"retrieval_ms": round(retrieval_ms, 1),
                   "first_token_ms": ms(state["first_token"]),
                   "first_shown_ms": ms(state["first_shown"]),
                   "total_ms": ms(time.perf_counter()),
                   "prompt_tokens": t.get("prompt_n"), "prompt_ms": t.get("prompt_ms"),
                   "tokens": t.get("predicted_n"),
                   "tokens_per_s": t.get("predicted_per_second")}
        out = {"question": question, "retrieved": len(found["results"]), "used": len(notes),
               "sources": [n.public() for n in notes], "search": _search_info(found),
               "finish_reason": state["finish"], "timings": timings}
        if not cited:
            return {**out, "answer": DONT_KNOW, "grounded": False, "citations": [],
                    "reason": (("the model's answer cites none of the notes" + (
                        f" (it was cut off at max_tokens, {max_tokens}, before citing one)"
                        if state["finish"] == "length" else "")) if text else
                        "the model gave no answer"),
                    "ungrounded_answer": text}
        return {**out, "answer": text, "grounded": True,
                "citations": [notes[n - 1].cited() for n in cited]}

    return Stream(items(), last)
