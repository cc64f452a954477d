"""Reading the notes: search, related, ask and get, and mcp, which serves them to agents.
Each ``do_<op>`` here is the ``<op>`` on the wire."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ragd import protocol as P
from ragctl.client import Fail, call, connect, emit
from ragctl.paths import split_range
from ragctl.render import (_Progress, _bold, _count, _excerpt, _explain, _head, _jump, _lines,
                           _mark, _one_line, _pattern, _terms, print_jumps)


def do_search(args) -> int:
    query = " ".join(args.query)
    if not query.strip():
        raise Fail("empty query: say what to search for", 2)
    kw = {"query": query}
    for key in ("mode", "k", "rerank", "wait", "path", "tag", "since", "before", "group"):
        if getattr(args, key, None) is not None:
            kw[key] = getattr(args, key)
    if args.source:
        kw["sources"] = args.source
    res = call(args, "search", timeout=90, **kw)
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")

    def human(res):
        notes = []
        if res.get("degraded"):
            notes.append(f"keywords only: {res.get('reason')}")
        elif res.get("vector_coverage") is not None and res["vector_coverage"] < 1:
            pct = 100 * res["vector_coverage"]
            shown = f"{pct:.0f}%" if pct < 99.5 else f"{pct:.1f}%"  # (99.94 is not "100%")
            found = res.get("candidate_coverage")
            # the rule is the share of the keywords' first chunks that have theirs, when
            # known: the index's share may be past 95% while theirs is not
            theirs = "" if found is None else \
                f", {100 * found:.0f}% of the best keyword matches"
            if str(res.get("fusion", "")).startswith("bm25 order"):
                how = (f"{theirs}: results keep keyword order until 95% of "
                       f"{'those' if theirs else 'the index'} have vectors (those that do are "
                       f"ordered by meaning too, and a clear match by meaning is moved near "
                       f"the top)")
            elif found is not None and found >= 0.95:
                how = f"{theirs}: the rest are being embedded"
            else:
                how = ": the rest are being embedded"
            notes.append(f"vectors cover {shown} of the index so far{how}")
        if res.get("files_pending") and not res.get("waited"):
            notes.append(f"{_count(res['files_pending'], 'file')} still being indexed: not in "
                         f"these results yet (--wait SECONDS waits for them)")
        if res.get("waited") and not res["waited"]["fresh"]:
            notes.append(f"waited {res['waited']['ms'] / 1000:.1f} s: changes are still being "
                         f"indexed, and may not be in these results yet")
        # (while vectors are coming, no close match among the chunks embedded so far is no
        # finding yet: the coverage line says how far they are)
        # (weak_meaning: the best cosine just above the threshold is as good as none; the
        # results then hold the query's words, not its meaning, as below the threshold)
        below = (res.get("below_threshold") or res.get("weak_meaning")) and not (
            res.get("vector_coverage") is not None and res["vector_coverage"] < 1)
        if below and res.get("mode") == "vector":  # (its results are the nearest, not words)
            notes.append(f"no close meaning match: the best similarity "
                         f"{res.get('best_similarity')} is below the threshold; these are the "
                         f"nearest by meaning, and --mode bm25 lists the notes holding the words")
        elif below:
            unheld = ", ".join(repr(w) for w in res.get("unheld_words") or ())
            notes.append("no close meaning match: these results match the query's words" + (
                f", only some of them (no note holds {unheld}): the notes may not answer this"
                if unheld and res["results"] else
                f", only some of them (confidence {res.get('confidence')}): the notes may not "
                f"answer this" if res.get("low_confidence") and res["results"] else ""))
        elif res.get("under_threshold"):
            n, thr = res["under_threshold"], res.get("threshold")
            notes.append(f"{n} of these {_count(len(res['results']), 'result')} "
                         f"{'is' if n == 1 else 'are'} below the similarity threshold {thr}: "
                         f"the nearest by meaning, not close")
        if res.get("rerank_reason"):
            notes.append(f"not reranked: {res['rerank_reason']}")
        if res.get("unknown_names") and res["results"]:
            names = ", ".join(repr(n) for n in res["unknown_names"])
            notes.append(f"low confidence: no note mentions {names}: the notes may not answer "
                         f"this")
        elif res.get("low_confidence") and res["results"] and not below:
            notes.append(f"low confidence ({res.get('confidence')}): the notes may not answer "
                         f"this; few of its distinctive words are in them")
        for note in notes:  # on stderr: stdout holds the results alone
            print(f"({note})", file=sys.stderr)
        if not res["results"]:  # (with -l, stdout holds nothing but paths)
            print(f"no results ({res.get('reason') or 'nothing matched'})",
                  file=sys.stderr if args.paths else sys.stdout)
        if args.paths:  # a line per result: `| head -3` is three, `| xargs`, an editor's list
            print_jumps(res["results"])
            return
        terms = _terms(query)
        for i, r in enumerate(res["results"], 1):
            lines = r["text"].split("\n")
            at = r.get("match_lines") or []
            title = _one_line(r.get("title") or Path(r["path"]).stem)  # (a newline in a name)
            head = _head(r["heading"], title)
            more = f"  (+{r['more']} more in this note)" if r.get("more") else ""
            stale = "" if not r.get("stale") else "  (changed since indexed)" \
                if os.path.exists(r["path"]) else "  (gone from disk since indexed)"
            unsaved = "  (unsaved)" if r.get("unsaved") else ""
            # filtered by date: which date of the note the filter read
            dated = f"  ({r['date']}, {r['date_from']})" if (args.since or args.before) \
                and r.get("date") else ""
            name = _bold(title, color)
            print(f"{i:>2}. {name}{' — ' + head if head else ''}  [{r['score']:.3f}]"
                  f"{more}{stale}{unsaved}{dated}")
            print(f"    {_jump(r)}")
            if r["path"].lower().endswith(".pdf"):  # a page: its lines holding the words
                held = [ln for ln in lines if terms and _pattern(terms).search(ln)] or \
                    [ln for ln in lines if ln.strip()]
                shown = [(f"p.{r['line_start']}", ln) for ln in held[:3]]
            else:
                # no line holds a word of the query (the match was in a heading, a tag, or by
                # meaning): the passage's first lines, but not one without a word (an emoji
                # alone, a rule) while the passage has others
                said = [r["line_start"] + k for k, ln in enumerate(lines) if ln.strip()]
                worded = [n for n in said if any(c.isalnum() for c in lines[n - r["line_start"]])]
                at_lines = [n for n in at if r["line_start"] <= n <= r["line_end"]][:3] or \
                    (worded or said)[:2]
                shown = [(n, lines[n - r["line_start"]] if 0 <= n - r["line_start"] < len(lines)
                          else "") for n in at_lines]
            for n, text in shown:
                text = text.strip()
                print(f"    {n:>5}: {_mark(_excerpt(_one_line(text), terms), terms, color)}")
            if args.explain:
                print(f"    why: {_explain(r['scores'], res.get('weights'))}")
        if args.explain and res.get("cut_below_threshold"):
            print(f"({res['cut_below_threshold']} chunks found by meaning alone were left out: "
                  f"their similarity is below the threshold)")
        if args.explain and res.get("trusted"):
            t = res["trusted"]
            which = (f"result {t['result']} holds the chunk" if t.get("result") else
                     f"the chunk ({_count(len(res['results']), 'result')} shown, not it)")
            print(f"({which} the vectors rank first for the query itself, cosine "
                  f"{t['cosine']}, clear of the threshold and of other notes: kept in the top "
                  f"{t['rank']}" + (f"; it ranked {t['lifted_from']} before)"
                                    if t.get("lifted_from") else ")"))
        if args.explain and res.get("feedback"):
            print(f"(vector ranks are of the query moved towards the first fusion's "
                  f"{res['feedback']['chunks']} best chunks, weight "
                  f"{res['feedback']['weight']})")

    out = {k: res[k] for k in ("query", "mode", "elapsed_ms", "results")}
    out.update({k: v for k, v in res.items() if k not in out})
    emit(args, out, human)
    return 0 if res["results"] else 1  # as grep: 1 when nothing was found


def do_related(args) -> int:
    """The notes closest in meaning to a note (or a text), in search's output forms."""
    if (args.note is None) == (args.text is None):
        raise Fail("related: give a note's PATH or --text TEXT" +
                   (", not both" if args.note is not None else ""), 2)
    kw = {"text": args.text} if args.text is not None else \
        _path_arg(os.path.abspath(os.path.expanduser(args.note)))
    if args.k is not None:
        kw["k"] = args.k
    res = call(args, "related", timeout=90, **kw)
    what = _one_line(res.get("of") or args.note or "the text given")

    def human(res):
        cover = res.get("vector_coverage")
        if cover is not None and cover < 1:  # on stderr: stdout holds the results alone
            pct = 100 * cover
            shown = f"{pct:.0f}%" if pct < 99.5 else f"{pct:.1f}%"  # (99.94 is not "100%")
            print(f"(vectors cover {shown} of the index so far: notes not embedded yet are not "
                  f"compared)", file=sys.stderr)
        if not res["results"]:  # (with -l, stdout holds nothing but paths)
            print(f"no related notes ({res.get('reason') or 'none found'})",
                  file=sys.stderr if args.paths else sys.stdout)
        if args.paths:
            print_jumps(res["results"])
            return
        for i, r in enumerate(res["results"], 1):
            title = _one_line(r.get("title") or Path(r["path"]).stem)
            head = _head(r["heading"], title)
            frm = r.get("link", {}).get("from") or {}
            near = (f"  (close to {_lines(frm['line_start'], frm['line_end'])} of {what})"
                    if frm else "")
            print(f"{i:>2}. {title}{' — ' + head if head else ''}  [{r['score']:.3f}]{near}")
            print(f"    {_jump(r)}")
            lines = r["text"].split("\n")
            shown = [(r["line_start"] + n, ln) for n, ln in enumerate(lines) if ln.strip()][:2]
            for n, text in shown:
                print(f"    {n:>5}: {_excerpt(_one_line(text.strip()), [])}")

    emit(args, res, human)
    return 0 if res["results"] else 1  # as grep: 1 when nothing was found


def do_ask(args) -> int:
    """A grounded answer from the notes, streamed as it comes, then its sources."""
    question = " ".join(args.question)
    if not question.strip():
        raise Fail("empty question: say what to ask", 2)
    kw = {"question": question}
    for key in ("k", "max_tokens", "path", "tag"):
        if getattr(args, key, None) is not None:
            kw[key] = getattr(args, key)
    if args.source:
        kw["sources"] = args.source
    stream = not args.json
    result = None
    wrote = False
    progress = _Progress(sys.stderr) if stream else None
    with connect(args, timeout=None) as c:
        req = c.send("ask", **kw)
        try:
            for reply in c.replies(req):
                item = reply["result"]
                if reply.get("final", True):
                    result = item
                elif stream and "delta" in item:
                    progress.clear()
                    sys.stdout.write(item["delta"])
                    sys.stdout.flush()
                    wrote = True
                elif stream and "sources" in item and not wrote:
                    progress.show(f"ragd: {item['used']} of the {item['retrieved']} notes found "
                                  f"given to the model; waiting for its answer…", first=True)
                elif stream and item.get("writing") and not wrote:
                    tokens = item.get("tokens")
                    progress.show("ragd: the model is writing" + (
                        f" ({tokens} tokens, shown once it cites a note)…" if tokens else "…"))
        except P.DaemonError:
            if wrote:  # the error goes on a line of its own, after the broken-off answer
                print("\n[the answer was cut off]")
            raise
        finally:
            if progress is not None:
                progress.clear()
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
        return 0
    if not result.get("grounded"):
        print(("\n" if wrote else "") + result["answer"])
        print(f"({result.get('reason')})")
        return 0
    if not wrote:  # an answer streamed by none of the replies (an older daemon)
        sys.stdout.write(result["answer"])
    print()
    print()
    used, found = result.get("used", 0), result.get("retrieved", 0)
    print(f"Cited ({len(result['citations'])} of the {used} notes given to the model, of "
          f"{found} found"
          + ("; the last one cut to fit" if any(s.get("cut") for s in result["sources"])
             else "") + "):")
    for cit in result["citations"]:
        print(f"  [{cit['n']}] {_one_line(cit['path'])}:{cit['line_start']}-{cit['line_end']}")
    return 0


def do_get(args) -> int:
    path, start, end = split_range(args.path)
    where = os.path.abspath(os.path.expanduser(path))
    kw = _path_arg(where)
    kw.update({k: v for k, v in (("line_start", start), ("line_end", end)) if v is not None})
    res = call(args, "get", **kw)

    def human(res):
        # The whole range, in as many replies as its size needs (each holds at most 256 KiB).
        while True:
            # As the file is: a last line without a newline is written without one (a reply
            # from an older ragd has no final_newline: a newline after any text, as before).
            sys.stdout.write(res["text"] + ("\n" if res.get("final_newline", bool(res["text"]))
                                            else ""))
            if not res["truncated"] or (end is not None and res["line_end"] >= end):
                return
            if res.get("line_cut"):
                print(f"ragctl: {res['unit']} {res['line_end']} is longer than a reply holds: "
                      f"cut", file=sys.stderr)
            more = {**_path_arg(where), "line_start": res["line_end"] + 1}
            if end is not None:
                more["line_end"] = end
            res = call(args, "get", **more)

    emit(args, res, human)
    return 0


def _path_arg(path: str) -> dict:
    """A path for get and related: as text, or, when its name is not UTF-8 (a file named in Latin-1, given
    by the shell as bytes), as those bytes (path_bytes, base64)."""
    try:
        path.encode("utf-8")
        return {"path": path}
    except UnicodeEncodeError:
        import base64
        return {"path_bytes": base64.b64encode(os.fsencode(path)).decode("ascii")}


def do_mcp(args) -> int:
    from ragctl import mcp  # only this command needs it
    return mcp.run(args.socket, args.config, verbose=args.verbose)
