"""``ragctl``: the thin command-line client of ragd.

It imports nothing from ragd but the protocol module, and finds the socket the same way ragd
does (--socket, $RAGD_SOCKET, else --config / $RAGD_CONFIG / the XDG config). Each ``do_<op>``
here is the ``<op>`` on the wire.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import select
import subprocess
import shutil
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

from ragd import protocol as P
from ragctl.paths import split_range

START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0


class Fail(Exception):
    """A one-line failure for the user; ragctl exits with its code."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


_warned: set[str] = set()


def _socket(args) -> Path:
    """Where the daemon listens. A config file that is not valid TOML (being edited) still
    names it: a running daemon goes on with the config it read before, and can be asked, told
    to reload or stopped; ragctl says why it read the file leniently, once."""
    def broken(why: str) -> None:
        if why not in _warned:
            _warned.add(why)
            print(f"ragctl: warning: {why}. Its [daemon] socket read as written; a running "
                  f"ragd goes on with the config it read before (fix the file, then 'ragctl "
                  f"reload')", file=sys.stderr)
    return P.socket_path(args.socket, args.config, broken=broken)


def connect(args, timeout: float | None = 30.0) -> P.Client:
    path = _socket(args)
    try:
        return P.Client(path, timeout=timeout)
    except P.NotRunning:
        if _warned:  # its config is not valid TOML: that is what to fix first
            raise Fail(f"{sorted(_warned)[0]}; and no ragd answers at {path}", 2)
        raise Fail(f"ragd is not running (no daemon at {path}); start it with 'ragctl start'")
    except PermissionError:
        raise Fail(f"permission denied on {path}: is ragd running as another user?")


def call(args, op: str, timeout: float | None = 30.0, **kw):
    with connect(args, timeout) as c:
        return c.call(op, **kw)


def emit(args, obj, human) -> None:
    if args.json:
        print(json.dumps(obj, ensure_ascii=False, indent=None))
    else:
        human(obj)


# ---------------------------------------------------------------------------------------------

def _ping(path) -> dict | None:
    """The daemon's ping reply, or None when nothing answers at path."""
    try:
        with P.Client(path, timeout=5) as c:
            return c.call("ping")
    except (P.NotRunning, OSError, P.ProtocolError):
        return None


def do_start(args) -> int:
    if args.socket:
        # ragd has no --socket flag: its config sets where it listens. Refuse rather than start
        # a daemon that listens elsewhere than where we would wait for it.
        raise Fail("--socket cannot choose where a new daemon listens; set daemon.socket in "
                   "the config instead", 2)
    env = {k: v for k, v in os.environ.items() if k != "RAGD_SOCKET"}
    path = P.socket_path(None, args.config, env)
    info = _ping(path)
    if info is not None:
        if args.source:  # add them to the running daemon (its config), or say why not
            return _add_sources(args, args.source, running=True)
        print(f"ragd is already running (pid {info['pid']})")
        return 0
    if args.source:  # the config is the truth: the folders go into it, then ragd starts
        _add_sources(args, args.source, running=False)
    # -P: the current folder is not put on sys.path, so a folder named ragd in it (a checkout)
    # cannot shadow the installed package ("cannot import name '__version__' from 'ragd'").
    cmd = [sys.executable, "-P", "-m", "ragd", "--background"]
    found = P.find_config(args.config)  # named on the command line: whose daemon it is
    if found is not None:
        cmd += ["--config", os.path.abspath(found)]
    with tempfile.TemporaryFile() as err:
        # cwd "/": a daemon does not keep the folder it was started from busy (a disk that
        # could not be unmounted); every path it is given is absolute
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True, cwd="/")
        deadline = time.monotonic() + START_TIMEOUT
        delay = 0.01
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                err.seek(0)
                msg = err.read().decode(errors="replace").strip()
                # ragd's own exit 2 is a config it refused (a value out of range): ragctl's 2
                raise Fail(msg or f"ragd exited with status {proc.returncode} before answering",
                           2 if proc.returncode == 2 else 1)
            info = _ping(path)
            if info is not None:
                print(f"ragd started (pid {info['pid']}, socket {path})")
                if _interactive(args):
                    _progress(args, path)
                elif not args.json:
                    print("indexing in the background; `ragctl status` to follow")
                return 0
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        raise Fail(f"ragd (pid {proc.pid}) did not answer within {START_TIMEOUT:.0f}s; "
                   f"see its log")


def _interactive(args) -> bool:
    """Progress lines only for a person at a terminal: not when piped, not with --json."""
    return not args.json and sys.stdout.isatty()


def _progress(args, sock, what: str = "indexing") -> None:
    """A progress line while ragd indexes (files, chunks, vectors, rate, ETA), until the
    keyword index is complete; then one line on the embedding still to come. Ctrl-C stops
    watching, not ragd."""
    t0 = time.monotonic()
    first_vectors = None
    try:
        with P.Client(sock, timeout=30) as c:
            while True:
                st = c.call("status")
                files = sum(s["files"] for s in st["sources"])
                chunks = sum(s["chunks"] for s in st["sources"])
                e = st.get("engines", {}).get("embedding", {})
                vectors = e.get("vectors", 0)
                elapsed = time.monotonic() - t0
                line = f"{what}: {files} files, {chunks} chunks"
                if st["pending"]:
                    rate = files / elapsed if elapsed > 0 else 0
                    eta = f", ~{st['pending'] / rate:.0f} s left" if rate else ""
                    line += f", {st['pending']} files to go ({rate:.0f} files/s{eta})"
                if e and not vectors:  # (a first start or a restart: not "0 vectors")
                    line += ("; vectors once the embedding engine is up"
                             if e.get("state") != "ready" or e.get("embedder") in (
                                 "waiting for engine", "loading vectors")
                             else "; the first vectors are being embedded")
                elif e:
                    line += f"; {vectors} vectors"
                print(f"\r{line[:150]:<150}", end="", flush=True)
                if st["idle"] and st["pending"] == 0:
                    break
                if first_vectors is None and vectors:
                    first_vectors = (time.monotonic(), vectors)
                time.sleep(0.5)
        print()
        rate = None
        if first_vectors and time.monotonic() > first_vectors[0] + 1:
            rate = (vectors - first_vectors[1]) / (time.monotonic() - first_vectors[0])
        print(_next_step(st, rate))
    except KeyboardInterrupt:
        print("\nragd goes on in the background ('ragctl status' shows where it is)")
    except (OSError, P.ProtocolError, P.DaemonError):
        print()


def _next_step(st: dict, rate: float | None = None) -> str:
    """Once the keyword index is complete: what happens next, and how long it may take (from
    the daemon's embedding pace, else the vectors/s watched here, else no estimate)."""
    e = st.get("engines", {}).get("embedding")
    if not e:
        return "keyword index ready; no embedding model: search ranks by keywords"
    chunks = sum(s["chunks"] for s in st["sources"])
    todo = e.get("pending_texts")
    if todo is None:  # not counted yet: the engine is being prepared or started
        todo = max(0, chunks - e.get("vectors", 0))
    if not todo:
        return "index ready: keywords and vectors of every chunk"
    if e.get("eta_s"):
        eta = f"~{max(1, round(e['eta_s'] / 60))} min"
    elif rate:
        eta = f"~{max(1, round(todo / rate / 60))} min"
    else:
        eta = "no estimate yet"
    doing = st.get("doing") or ""
    if e.get("state") != "ready":
        eta += f"; {doing or 'the embedding engine is starting'}"
    return (f"keyword index ready; embedding {todo:,} chunks in the background ({eta}); search "
            f"works now, on keywords until the vectors are in; `ragctl status` to follow")


def _add_sources(args, folders: list[str], running: bool) -> int:
    """Add folders as sources to the config file (the running daemon's, else the one ragd
    would read, created from the documented default when missing) and reload a running
    daemon. A folder that cannot be added fails the command with the reason."""
    from ragctl import configfile  # tomlkit: only the commands that edit need it
    info = None
    if running:
        st = call(args, "status")
        info = st.get("config")
    path = configfile.target(args.config, info)
    before = path.read_text(encoding="utf-8") if path.exists() else None
    added = []
    try:
        for folder in folders:
            name, new = configfile.add_source(path, Path(folder), getattr(args, "name", None),
                                              getattr(args, "kind", None))
            if new:
                added.append(name)
                print(f"added source {name!r} ({Path(folder).expanduser().resolve()}) to "
                      f"{path}")
            else:
                print(f"{Path(folder).expanduser().resolve()} is already the source {name!r} "
                      f"in {path}")
    except configfile.ConfigFileError as e:
        configfile.restore(path, before)
        raise Fail(str(e), 2)
    if running and added:
        try:
            res = call(args, "reload", timeout=60)
        except P.DaemonError as e:
            configfile.restore(path, before)
            raise Fail(f"ragd refused the new config ({e.message}); {path} is left as it was", 1)
        print(f"ragd is indexing {', '.join(res['added'])} now")
        if _interactive(args):
            _progress(args, _socket(args))
    elif added:
        print("'ragctl start' indexes it" if not running else "")
    return 0


def do_service(args) -> int:
    from ragctl import service
    if args.action == "install":
        sock = P.socket_path(args.socket, args.config)
        running = _ping(sock) is not None and not args.no_start

        def handover() -> None:  # once the service manager took the unit, before it starts
            if running:
                print("stopping the ragd started by 'ragctl start': the service runs it from "
                      "now on")
                do_stop(args)
        # The config this ragctl uses (--config, $RAGD_CONFIG, else the XDG one), named in the
        # unit: the service manager's environment is not this shell's.
        found = P.find_config(args.config)
        if found is not None and (why := P.not_a_file(found)):  # (--socket skips the above)
            raise P.ConfigUnreadable(why)
        config = os.path.abspath(found) if found is not None else None
        try:
            done = service.install(config, start=not args.no_start, handover=handover)
        except RuntimeError as e:
            raise Fail(str(e))
    else:
        done, failed = service.uninstall()
        emit(args, {"done": done, "failed": failed}, lambda r: print("\n".join(r["done"])))
        if failed:
            raise Fail("service uninstall: " + "; ".join(failed))
        return 0
    emit(args, {"done": done}, lambda r: print("\n".join(r["done"])))
    return 0


def do_eval(args) -> int:
    from ragctl import evaluate
    questions = []
    try:
        for f in args.files:
            questions += evaluate.load(Path(f))
    except evaluate.EvalError as e:
        raise Fail(str(e), 2)
    modes = ["bm25", "vector", "hybrid"] if args.mode == "all" else [args.mode]
    with connect(args, timeout=120) as c:
        roots = {s["name"]: s["path"] for s in c.call("sources")}
        gone = evaluate.missing(questions, roots)
        if gone:
            print(f"ragctl: eval: {len(gone)} relevant path{'s' * (len(gone) > 1)} in no "
                  f"source (their questions can only miss): {', '.join(gone[:5])}"
                  + (" …" if len(gone) > 5 else ""), file=sys.stderr)
        results = [evaluate.run(c, questions, m, args.source, roots) for m in modes]
    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0], ensure_ascii=False))
    else:
        print(evaluate.table(results))
        if args.misses:
            for res in results:
                for r in res["rows"]:
                    if r.get("hit@5") == 0.0:
                        print(f"miss [{res['mode']}] {r['id']} ({r['kind']}): {r['question']}\n"
                              f"    got: {', '.join(r['top'][:3]) or 'nothing'}")
    return 0


def do_stop(args) -> int:
    try:
        result = call(args, "stop")
    except Fail as e:
        if args.json:
            print(json.dumps({"running": False, "message": str(e).split(";")[0]}))
            return 1
        raise Fail(str(e).split(";")[0])
    pid = result["pid"]
    t0 = time.monotonic()
    deadline = t0 + STOP_TIMEOUT
    if not args.json:  # (ragd stops within seconds: said, so the wait is not a silent one)
        print(f"stopping ragd (pid {pid})…", flush=True)
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            break
        time.sleep(0.02)
    else:
        raise Fail(f"ragd (pid {pid}) is still stopping after {STOP_TIMEOUT:.0f}s")
    took = time.monotonic() - t0
    emit(args, {"stopped": True, "pid": pid, "seconds": round(took, 2)},
         lambda r: print(f"ragd stopped (pid {pid}, {took:.1f} s)"))
    return 0


def do_reload(args) -> int:
    res = call(args, "reload", timeout=60)

    def human(r):
        print(f"reloaded {r['config'] or 'the built-in defaults'}")
        renamed = r.get("renamed") or []
        for a, b in renamed:
            print(f"  source renamed: {a} -> {b} (its files are listed again under the new "
                  f"name; nothing is embedded again)")
        said = {name for pair in renamed for name in pair}
        for key, label in (("added", "sources added"),
                           ("removed", "sources removed (set aside for the GC grace period)"),
                           ("restored", "sources restored as they were (set aside when "
                                        "removed)"),
                           ("moved", "sources moved (listed again at their new path)"),
                           ("changed", "sources changed (re-read)")):
            names = [n for n in r.get(key) or () if n not in said]
            if names:
                print(f"  {label}: {', '.join(names)}")
        for name in r.get("missing") or ():
            print(f"  source {name}: its folder is not there (yet): its indexed files are kept, "
                  f"and it is watched once the folder exists ('ragctl status')")
        if r.get("applied"):
            print(f"  settings applied: {', '.join(r['applied'])}")
        if r.get("engines_retried"):
            print(f"  failed engines tried again: {', '.join(r['engines_retried'])}")
        if r.get("rechunk"):
            print("  chunk size changed: every file is re-chunked")
        if r.get("embedding"):  # e.g. "switching to NAME", or why the model stays
            more = " ('ragctl status' shows the progress)" if "switching" in r["embedding"] \
                else ""
            print(f"  embedding model: {r['embedding']}{more}")
        if r["restart_needed"]:
            print(f"  a restart is needed for: {', '.join(r['restart_needed'])} "
                  f"('ragctl stop && ragctl start')")

    emit(args, res, human)
    return 0


def _ago(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.0f} min"


def do_status(args) -> int:
    st = call(args, "status")

    def human(st):
        state = st.get("doing")  # (an older ragd: from the indexer's state)
        if state is None:
            state = st.get("indexer", "idle" if st["idle"] else "indexing")
            todo = st.get("engines", {}).get("embedding", {}).get("pending_texts")
            if state == "idle" and todo:  # the files are indexed; their vectors are coming
                state = f"embedding ({todo} texts to go)"
        pending = f", {st['pending']} files pending" if st["pending"] else ""
        print(f"ragd {st['version']}  pid {st['pid']}  up {_ago(st['uptime_s'])}  "
              f"{state}{pending}")
        print(f"config {st.get('config') or 'built-in defaults'}")
        print(f"data {st['data_dir']}\nsocket {st['socket']}")
        if st.get("log"):
            print(f"log {st['log']}")
        if not st["sources"]:
            print("no sources: add one with 'ragctl sources add PATH'")
        for hint in st.get("hints", []):
            print(hint)
        for s in st["sources"]:
            extra = "".join(f", {s[k]} {k}" for k in ("skipped", "failed") if s[k])
            files = f"{s['files']:>7} file{'s' if s['files'] != 1 else ' '}"
            chunks = f"{s['chunks']:>8} chunk{'s' if s['chunks'] != 1 else ' '}"
            print(f"  {s['name']:<20} {files} {chunks}{extra}  {s['kind']}  {s['path']}")
            watched = "watched" if s.get("watched") else "not watched"
            print(f"    {watched}, index lag {_ago(s.get('lag_s') or 0.0)}"
                  + (f", last scan {time.strftime('%H:%M:%S', time.localtime(s['last_scan']))}"
                     if s.get("last_scan") else ""))
            if s.get("watch_error"):
                print(f"    not watched: {s['watch_error']}")
            if s.get("last_error") and not (  # (the folder not there: said once, above)
                    s.get("watch_error") and "is not there" in s["watch_error"]
                    and "is missing" in s["last_error"]):
                print(f"    last error: {_one_line(s['last_error'])}")
        for role, e in st.get("engines", {}).items():
            line = f"{role} engine: {e.get('state')}  model {e.get('model')}"
            if role == "embedding" and "vectors" in e:
                chunks = sum(s["chunks"] for s in st["sources"]) or 0
                todo = e.get("pending_texts")
                eta = "" if not e.get("eta_s") else f", ~{e['eta_s']} s left" \
                    if e["eta_s"] < 90 else f", ~{round(e['eta_s'] / 60)} min left"
                left = ("counting the texts to embed" if todo is None else
                        f"{todo} texts to embed{eta}, {e.get('order') or 'in index order'}"
                        if todo else "every chunk embedded")
                # (the space may hold vectors of texts no chunk uses any more, until GC: never
                # "100%" while texts are still to embed)
                share = 100 * min(e["vectors"], chunks) / chunks if chunks else 0.0
                share = min(share, 99.0) if todo else share
                pct = f" ({share:.0f}%)" if chunks else ""
                line += f"  {e['vectors']} vectors{pct}, {left} ({e['embedder']})"
            if role == "generator" and e.get("context"):
                line += f"  context {e['context']}"
            print(line)
            sw = e.get("switch")
            if sw:
                eta = f", ~{sw['eta_s'] / 60:.0f} min left" if sw.get("eta_s") else ""
                print(f"    switching to {sw['to']}: {sw['vectors']}/{sw['chunks']} chunks "
                      f"({100 * sw['progress']:.0f}%){eta}; {sw['from']} answers meanwhile "
                      f"('ragctl models use --cancel' stops it)")
            for note in (e.get("space_note"), e.get("reason")):
                if note:
                    print("    " + note.replace("\n", "\n    "))
            for which, eng in ((role, e), ("query", e.get("query_engine") or {})):
                if eng.get("state") == "failed" and eng.get("next_try"):
                    print(f"    {which} engine tried again in "
                          f"{max(0, eng['next_try'] - time.time()):.0f} s, or now by "
                          f"'ragctl reload'")
        store = st.get("store") or {}
        if store.get("backend", "sqlite") != "sqlite":
            line = f"store: {store['backend']} at {store.get('uri')}  {store.get('state')}"
            if store.get("pending"):
                line += f", {store['pending']}{'+' if store['pending'] >= 2048 else ''} " \
                        f"chunks to push"
            if store.get("collection"):
                line += f"  collection {store['collection']}"
            else:
                line += "  (search reads SQLite meanwhile)"
            print(line)
            if store.get("error"):
                print(f"    last error: {_one_line(store['error'])}")
        text = st.get("bm25_index") or {}
        if text.get("engine") == "tantivy":
            line = f"bm25: tantivy, {text.get('state')}"
            if text.get("pending"):
                line += f", {text['pending']}{'+' if text['pending'] >= 8192 else ''} " \
                        f"chunks to add"
            if not text.get("serving"):
                line += "  (FTS5 answers meanwhile)"
            print(line)
            if text.get("error"):
                print(f"    last error: {_one_line(text['error'])}")
        bad = [t for t in st.get("threads", []) if t["restarts"] or t["state"] != "running"]
        for t in bad:
            print(f"thread {t['name']}: {t['state']}, {t['restarts']} restarts"
                  + (f"; last error: {t['last_error']}" if t.get("last_error") else ""))

    emit(args, st, human)
    return 0


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
            how = ("ranked by keywords until 95% are in (meaning matches after them, a "
                   "clear one among the first)"
                   if str(res.get("fusion", "")).startswith("bm25 order")
                   else "the rest are being embedded")
            notes.append(f"vectors cover {shown} of the index so far: {how}")
        if res.get("waited") and not res["waited"]["fresh"]:
            notes.append(f"waited {res['waited']['ms'] / 1000:.1f} s: changes are still being "
                         f"indexed, and may not be in these results yet")
        # (while vectors are coming, no close match among the chunks embedded so far is no
        # finding yet: the coverage line says how far they are)
        below = res.get("below_threshold") and not (
            res.get("vector_coverage") is not None and res["vector_coverage"] < 1)
        if below:
            notes.append("no close meaning match: these results match the query's words" + (
                f", only some of them (confidence {res.get('confidence')}): the notes may not "
                f"answer this" if res.get("low_confidence") and res["results"] else ""))
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
            for r in res["results"]:
                print(_jump(r))
            return
        terms = _terms(query)
        for i, r in enumerate(res["results"], 1):
            lines = r["text"].split("\n")
            at = r.get("match_lines") or []
            title = _one_line(r.get("title") or Path(r["path"]).stem)  # (a newline in a name)
            head = _one_line(r["heading"].split(" > ", 1)[1] if " > " in r["heading"] else "")
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
                at_lines = [n for n in at if r["line_start"] <= n <= r["line_end"]][:3] or \
                    [r["line_start"] + k for k, ln in enumerate(lines) if ln.strip()][:2]
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
            print(f"(the chunk the vectors rank first for the query itself, cosine "
                  f"{t['cosine']}, clears the threshold by a clear margin: its note is kept in "
                  f"the top {t['rank']}" + (f"; it ranked {t['lifted_from']} before)"
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
        {"path": os.path.abspath(os.path.expanduser(args.note))}
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
            for r in res["results"]:
                print(_jump(r))
            return
        for i, r in enumerate(res["results"], 1):
            title = _one_line(r.get("title") or Path(r["path"]).stem)
            head = _one_line(r["heading"].split(" > ", 1)[1] if " > " in r["heading"] else "")
            frm = r.get("link", {}).get("from") or {}
            near = (f"  (close to lines {frm['line_start']}-{frm['line_end']} of {what})"
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


class _Progress:
    """One line of progress on stderr while the model thinks: rewritten in place on a
    terminal and cleared once the answer shows; elsewhere (a log) only its first line."""

    def __init__(self, out):
        self.out = out
        self.tty = out.isatty()
        self.shown = False

    def show(self, text: str, first: bool = False) -> None:
        if not self.tty and not first:
            return
        if self.tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.out.write("\r\033[K" + text[:width])
        else:
            self.out.write(text + "\n")
        self.out.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown and self.tty:
            self.out.write("\r\033[K")
            self.out.flush()
        self.shown = False


def _explain(scores: dict, weights: dict | None) -> str:
    """Each signal's rank and score for one result (search --explain)."""
    out = []
    for name in ("bm25", "vector"):
        if f"{name}_rank" in scores:
            w = f", weight {weights[name]}" if weights and name in weights else ""
            out.append(f"{name} rank {scores[name + '_rank']} (score {scores[name]}{w})")
        elif weights and name in weights:
            out.append(f"{name}: not in its top candidates")
    for name, label in (("fused", "fused (convex: the scores scaled over their lists)"),
                        ("rrf", "fused (RRF)")):
        if name in scores:
            out.append(f"{label} {scores[name]}")
    if "note_bm25_rank" in scores:
        out.append(f"whole note bm25 rank {scores['note_bm25_rank']} (score "
                   f"{scores['note_bm25']}, adds {scores['note_bm25_added']})")
    for name, label in (("note", "note score (best chunk, length-damped"
                         + (", + whole note)" if "note_bm25_rank" in scores else ")")),
                        ("rerank", "reranker")):
        if name in scores:
            out.append(f"{label} {scores[name]}")
    return "; ".join(out)


_STOP = frozenset("a an and are as at be by can do does for from has have how i if in is it "
                  "its my of on or so that the this to was what when where which who why will "
                  "with you your".split())


def _terms(query: str) -> list[str]:
    """The query's words to mark in results, cut to a stem-ish prefix (FTS5 stems with
    porter: 'repeating' matched 'repeat'), and its symbols (emoji: words to the index too)."""
    out = []
    for w in re.findall(r"\w+", query.lower()):
        if w in _STOP or len(w) < 2:
            continue
        for suffix in ("ing", "ed", "es", "s"):
            if len(w) > len(suffix) + 3 and w.endswith(suffix):
                w = w[: -len(suffix)]
                break
        out.append(w)
    out += [ch for ch in query if ch > "\x7f" and unicodedata.category(ch) == "So"]
    return sorted(set(out), key=len, reverse=True)


def _pattern(terms: list[str]) -> re.Pattern:
    """Where terms match: a word at a word's start (and the rest of that word), a symbol
    anywhere."""
    return re.compile("|".join(rf"\b{re.escape(t)}\w*" if re.match(r"\w", t) else re.escape(t)
                               for t in terms), re.I)


def _mark(text: str, terms: list[str], color: bool) -> str:
    if not terms or not color:
        return text
    return _pattern(terms).sub(lambda m: f"\033[1;31m{m.group(0)}\033[0m", text)


def _excerpt(line: str, terms: list[str], width: int = 160) -> str:
    """At most `width` characters of a line, around its first match when it is longer: cuts
    are shown with "…"."""
    if len(line) <= width:
        return line
    m = _pattern(terms).search(line) if terms else None
    start = max(0, min((m.start() if m else 0) - width // 3, len(line) - width))
    cut = line[start:start + width]
    return ("…" if start else "") + cut + ("…" if start + width < len(line) else "")


def _bold(text: str, color: bool) -> str:
    return f"\033[1m{text}\033[0m" if color else text


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
    """A path for get: as text, or, when its name is not UTF-8 (a file named in Latin-1, given
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


def do_reindex(args) -> int:
    res = call(args, "reindex", source=args.source)
    emit(args, res, lambda r: print(f"reindexing {', '.join(r['queued']) or 'nothing'}"))
    if _interactive(args):
        _progress(args, _socket(args), "reindexing")
    return 0


def do_sources(args) -> int:
    if args.action == "add":
        if not args.path:
            raise Fail("usage: ragctl sources add PATH [--name NAME] [--kind obsidian|folder]", 2)
        running = _ping(_socket(args)) is not None
        return _add_sources(args, [args.path], running)
    if args.action == "remove":
        if not args.path:
            raise Fail("usage: ragctl sources remove NAME", 2)
        return _remove_source(args, args.path)
    try:
        res = call(args, "sources")
        where = "ragd"
    except Fail:  # not running: the config file says what they are
        from ragctl import configfile
        path = configfile.target(args.config, None)
        try:
            res = configfile.sources(path)
        except configfile.ConfigFileError as e:
            raise Fail(str(e), 2)
        where = str(path) if path.exists() else None

    def human(rows):
        if not rows:
            print("no sources configured: add one with 'ragctl sources add PATH'")
        for s in rows:
            print(f"{s['name']:<20} {s['kind']:<9} {s['path']}")
        if where != "ragd":
            print(f"(ragd is not running; from {where or 'the built-in defaults'})")

    emit(args, res, human)
    return 0


def _remove_source(args, name: str) -> int:
    from ragctl import configfile
    sock = _socket(args)
    running = _ping(sock) is not None
    path = configfile.target(args.config, call(args, "status").get("config") if running else None)
    before = path.read_text(encoding="utf-8") if path.exists() else None
    try:
        name = configfile.remove_source(path, name)
    except configfile.ConfigFileError as e:
        raise Fail(str(e), 2)
    print(f"removed source {name!r} from {path}")
    if running:
        try:
            call(args, "reload", timeout=60)
        except P.DaemonError as e:
            configfile.restore(path, before)
            raise Fail(f"ragd refused the new config ({e.message}); {path} is left as it was")
        print("ragd no longer searches it; its index rows are set aside for the GC grace "
              "period, as its embeddings stay cached: added back under this name within it, it "
              "returns as it was, and under any name it embeds nothing")
    return 0


def do_files(args) -> int:
    kw = {k: getattr(args, k) for k in ("source", "status") if getattr(args, k)}
    counts: dict[str, int] = {}
    every: list[dict] = []
    with connect(args) as c:
        after = None
        while True:  # page by page: a vault of any size fits the frame limit
            page = c.call("files", **kw, **({"after": after} if after else {}))
            for f in page["files"]:
                counts[f["status"]] = counts.get(f["status"], 0) + 1
                if args.json:
                    every.append(f)
                else:
                    why = f"  ({_one_line(f['reason'])})" if f["reason"] else ""
                    print(f"{f['status']:<8} {f['chunks']:>4} chunk{'s' * (f['chunks'] != 1)} "
                          f" {_one_line(f['path'])}{why}")
            after = page.get("next")
            if not after:
                break
    if args.json:
        print(json.dumps({"files": every}, ensure_ascii=False))
    else:
        print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no files")
    return 0


def _jump(r: dict) -> str:
    """A result's path:line, its best matching line (a terminal or editor jumps there)."""
    at = r.get("match_lines") or []
    return f"{_one_line(r['path'])}:{at[0] if at else r['line_start']}"


def _one_line(text: str) -> str:
    """A name or reason on one terminal line: control characters (a newline in a file name)
    and invisible format ones shown escaped. Spaces of every kind stay as they are (a no-break
    space or an ideographic one is ordinary text, and a printed path must open the file)."""
    return "".join(ch if ch.isprintable() or unicodedata.category(ch) == "Zs"
                   else repr(ch)[1:-1] for ch in text)


def do_watch(args) -> int:
    """Print index events as they happen (Ctrl-C to stop)."""
    with connect(args, timeout=None) as c:
        req = c.send("events")
        for reply in c.replies(req):
            e = reply["result"]
            if args.json:
                print(json.dumps(e, ensure_ascii=False), flush=True)
                continue
            stamp = time.strftime("%H:%M:%S", time.localtime(e["time"]))
            what = e.get("path") or e.get("message") or ""
            extra = "".join(f" {k}={e[k]}" for k in ("chunks", "from_path", "reason", "lost_before")
                            if k in e)
            print(f"{stamp} {e['event']:<10} {what}{extra}", flush=True)
    return 0


def do_gc(args) -> int:
    kw = {"grace_hours": args.grace_hours} if args.grace_hours is not None else {}
    res = call(args, "gc", timeout=None, **kw)
    emit(args, res, lambda r: print(
        f"gc: {r['deleted']} unused cache entries deleted ({r['bytes_freed']} bytes freed); "
        f"{r['waiting']} unused entries kept for the grace period"
        + (f"; {r['purged_files']} files of removed sources deleted" if r.get("purged_files")
           else "")))
    return 0


def do_models(args) -> int:
    if args.action == "pull":
        if not args.name:
            raise Fail("usage: ragctl models pull NAME", 2)
        return _pull(args, args.name)
    if args.action == "use":
        return _use(args)
    res = call(args, "models")
    emit(args, res, lambda r: print("\n".join(models_lines(r))))
    return 0


def models_lines(res: dict) -> list[str]:
    """`ragctl models` for people. A registry entry whose source was never checked says so:
    its repo or file name may be wrong, and nothing pins what the download must be."""
    lines = [f"models folder: {res['dir']}"]
    for m in res["models"]:
        mark = "installed" if m["installed"] else "         "
        role = m.get("role") or "?"
        dims = f"{m['dims']}-d" if m.get("dims") else ""
        if m.get("verified") is False:
            check = "UNVERIFIED source (not checked against the hub)"
        elif m.get("verified") and m.get("sha256_pinned"):
            check = "sha256 pinned"
        elif m.get("verified"):
            check = "sha256 from the hub at download"
        else:
            check = ""  # a local file, or a daemon too old to say
        lines.append(f"  {mark}  {m['name']:<24} {role:<9} {dims:<6} {m['source']}"
                     + (f"  [{check}]" if check else ""))
    for role, value in res["configured"].items():
        lines.append(f"configured {role}: {value or '(none)'}")
    return lines


def _use(args) -> int:
    """Switch the embedding model without downtime: set [embedding] model in the config and
    reload; the model in use answers until the new one's vectors are complete."""
    from ragctl import configfile
    st = call(args, "status")
    switch = st.get("engines", {}).get("embedding", {}).get("switch")
    if args.cancel:
        if not switch:
            raise Fail("no model switch is under way")
        value = switch["from_value"]
    elif not args.name:
        raise Fail("usage: ragctl models use NAME|PATH  (or --cancel)", 2)
    else:
        value = args.name
        if os.sep in value or value.endswith(".gguf"):
            value = os.path.abspath(os.path.expanduser(value))
    path = configfile.target(args.config, st.get("config"))
    before = path.read_text(encoding="utf-8") if path.exists() else None
    try:
        configfile.set_value(path, "embedding", "model", value)
    except configfile.ConfigFileError as e:
        raise Fail(str(e), 2)
    try:
        res = call(args, "reload", timeout=120)
    except P.DaemonError as e:
        configfile.restore(path, before)
        raise Fail(f"ragd refused the new config ({e.message}); {path} is left as it was")
    if res.get("embedding_error"):  # ragd keeps the model in use: so does the config file
        configfile.restore(path, before)
        raise Fail(f"{value} cannot be used: {res['embedding_error']}; the model in use stays "
                   f"and {path} is left as it was")
    note = res.get("embedding") or "unchanged"
    emit(args, {"config": str(path), "model": value, "embedding": note},
         lambda r: print(f"[embedding] model = {value!r} in {path}: {note}"))
    if _interactive(args) and note.startswith("switching"):
        _switch_progress(args)
    return 0


def _switch_progress(args) -> None:
    """A progress line while the new model's vectors are built (Ctrl-C stops watching)."""
    try:
        with connect(args) as c:
            while True:
                e = c.call("status")["engines"].get("embedding", {})
                sw = e.get("switch")
                if not sw:
                    print(f"\rswitch done: {e.get('model')} answers now{'':<60}")
                    return
                eta = f", ~{sw['eta_s'] / 60:.0f} min left" if sw.get("eta_s") else ""
                print(f"\rswitching {sw['from']} -> {sw['to']}: {sw['vectors']}/{sw['chunks']} "
                      f"chunks ({100 * sw['progress']:.0f}%){eta}; {sw['from']} answers "
                      f"meanwhile   ", end="", flush=True)
                time.sleep(1)
    except KeyboardInterrupt:
        print("\nthe switch goes on in the background ('ragctl status' shows it)")


def _pull(args, name: str) -> int:
    bar = not args.json and sys.stderr.isatty()
    with connect(args, timeout=None) as c:
        req = c.send("models_pull", name=name)
        result = None
        for reply in c.replies(req):
            if reply.get("final", True):
                result = reply["result"]
            elif bar:
                done, total = reply["result"]["done"], reply["result"]["total"]
                if total:
                    filled = int(30 * done / total)
                    print(f"\r[{'#' * filled}{'-' * (30 - filled)}] {done / 1e6:7.1f}/"
                          f"{total / 1e6:.1f} MB", end="", file=sys.stderr, flush=True)
                else:
                    print(f"\r{done / 1e6:7.1f} MB", end="", file=sys.stderr, flush=True)
        if bar:
            print(file=sys.stderr)
    emit(args, result, lambda r: print(f"{r['name']}: {r['path']} ({r['bytes']} bytes)"))
    return 0


# ---------------------------------------------------------------------------------------------

def _common(top: bool) -> argparse.ArgumentParser:
    # The same options work before and after the command ('ragctl --json status' and 'ragctl
    # status --json'); on the subcommands they default to SUPPRESS so they cannot overwrite
    # what was given before the command.
    common = argparse.ArgumentParser(add_help=False)
    kw = {} if top else {"default": argparse.SUPPRESS}
    common.add_argument("--config", metavar="PATH", **kw,
                        help="ragd config file (default: $RAGD_CONFIG, else the XDG one)")
    common.add_argument("--socket", metavar="PATH", **kw,
                        help="the daemon's socket (default: $RAGD_SOCKET, else from the config)")
    common.add_argument("--json", action="store_true", help="print JSON for machines", **kw)
    return common


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("ragd")
    except PackageNotFoundError:
        return "unknown"


class _Parser(argparse.ArgumentParser):
    """A wrong command line is said as every other error is: one line on stderr, or with
    --json one JSON object ({"error": "bad_args", ...}); exit 2. (argparse's own: its usage,
    then the error, on several lines.)"""

    json_errors = False

    def error(self, message: str):
        message = f"{self.prog}: {message} (see `{self.prog} -h`)"
        if _Parser.json_errors:
            message = json.dumps({"error": P.BAD_ARGS, "message": message}, ensure_ascii=False)
        print(message, file=sys.stderr)
        raise SystemExit(2)

    _commands = None  # the subparsers action, once added

    def add_subparsers(self, **kw):
        self._commands = super().add_subparsers(**kw)
        return self._commands

    def parse_args(self, args=None, namespace=None):
        # argparse says "unrecognized arguments" from the top parser, naming neither the
        # command nor its options: the command's parser says it here, with the nearest option.
        args, extra = self.parse_known_args(args, namespace)
        if extra:
            where = self._commands.choices.get(args.command, self) if self._commands else self
            options = [o for a in where._actions for o in a.option_strings]
            near = next((m[0] for x in extra if x.startswith("-")
                         for m in [difflib.get_close_matches(x.split("=")[0], options, n=1)]
                         if m), None)
            where.error(f"unrecognized arguments: {' '.join(extra)}"
                        + (f"; did you mean `{near}`?" if near else ""))
        return args

    def _check_value(self, action, value):
        # A typo'd command or choice gets the nearest one named (argparse's own suggestion
        # is 3.14's, and off by default); the error stays one line.
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError:
            choices = [str(c) for c in action.choices]
            near = difflib.get_close_matches(str(value), choices, n=1)
            hint = f"; did you mean `{near[0]}`?" if near else ""
            if isinstance(action, argparse._SubParsersAction):  # (-h lists the commands)
                raise argparse.ArgumentError(None, f"unknown command {str(value)!r}{hint}"
                                             ) from None
            raise argparse.ArgumentError(action, f"invalid choice {str(value)!r}{hint} "
                                                 f"(choose from {', '.join(choices)})") from None


class _Commands(argparse._SubParsersAction):
    """Each command's one-line help is also the description its own --help starts with."""

    def add_parser(self, name, **kw):
        kw.setdefault("description", kw.get("help"))
        return super().add_parser(name, **kw)


def parser() -> argparse.ArgumentParser:
    common = _common(top=False)
    ap = _Parser(prog="ragctl", parents=[_common(top=True)],
                 description="Talk to the ragd retrieval daemon.")
    ap.add_argument("--version", action="version", version=f"ragctl {_version()}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND", action=_Commands,
                            help="`ragctl COMMAND -h` for its options")

    p = sub.add_parser("start", parents=[common], help="start ragd in the background")
    p.add_argument("--source", metavar="PATH", action="append", default=[],
                   help="add this folder to the config's sources (created from the documented "
                        "default when missing) and index it; on a running ragd too "
                        "(repeatable)")
    p.set_defaults(func=do_start)
    p = sub.add_parser("service", parents=[common],
                       help="run ragd as a user service (systemd, launchd): install, uninstall")
    p.add_argument("action", choices=["install", "uninstall"],
                   help="install: write the unit and start it; uninstall: stop it and remove it")
    p.add_argument("--no-start", action="store_true",
                   help="install: only write the unit file")
    p.set_defaults(func=do_service)
    p = sub.add_parser("eval", parents=[common],
                       help="retrieval quality on your own questions (JSON lines: question, "
                            "relevant)")
    p.add_argument("files", nargs="+", metavar="QUESTIONS.jsonl",
                   help="JSON lines of {\"question\", \"relevant\": [paths in a source], "
                        "\"kind\"}")
    p.add_argument("--mode", choices=["hybrid", "vector", "bm25", "all"], default=None,
                   help="ranking (default: the daemon's; all: each in turn)")
    p.add_argument("--source", action="append", metavar="NAME",
                   help="search only this source (repeatable)")
    p.add_argument("--misses", action="store_true", help="list the questions missed in the top 5")
    p.set_defaults(func=do_eval)
    p = sub.add_parser("reload", parents=[common],
                       help="read the config again: sources added, removed or changed apply now")
    p.set_defaults(func=do_reload)
    p = sub.add_parser("stop", parents=[common], help="stop ragd")
    p.set_defaults(func=do_stop)
    p = sub.add_parser("status", parents=[common], help="what ragd is doing and holds")
    p.set_defaults(func=do_status)
    p = sub.add_parser("search", parents=[common],
                       help="search the notes: by their words and their meaning, best first")
    p.add_argument("query", nargs="+", help="free text (quotes optional); \"quoted phrases\" "
                   "stay phrases")
    p.add_argument("-k", type=int, help="number of results (default: search.k in the config)")
    p.add_argument("--mode", choices=["hybrid", "vector", "bm25"],
                   help="ranking (default: search.mode in the config, hybrid)")
    p.add_argument("--rerank", action=argparse.BooleanOptionalAction, default=None,
                   help="rerank with the cross-encoder (default: when one is configured)")
    p.add_argument("--source", action="append", metavar="NAME",
                   help="search only this source (repeatable)")
    p.add_argument("--wait", type=float, metavar="SECONDS",
                   help="first wait (at most this long) for pending changes to be indexed")
    p.add_argument("--path", metavar="GLOB",
                   help="only files whose path (relative to its source) matches, e.g. "
                        "'Projects/*', or a folder: 'Projects'; an absolute one inside a "
                        "source's folder is taken relative to it (and searches only it)")
    p.add_argument("--tag", metavar="TAG", help="only notes with this tag (a/b matches a)")
    p.add_argument("--since", metavar="DATE",
                   help="only notes dated since: YYYY-MM-DD, today, yesterday, 7d, 2w, 3m, 1y "
                        "(a note's date: its frontmatter's updated, date or created, a daily "
                        "note's file name, else the file's time; --json says which)")
    p.add_argument("--before", metavar="DATE",
                   help="only notes dated before (the same forms as --since)")
    p.add_argument("--group", choices=["note", "chunk"],
                   help="note (default): one result per note, its best part; chunk: every "
                        "matching part")
    p.add_argument("--explain", action="store_true",
                   help="say why each result ranked: each signal's rank and score")
    p.add_argument("-l", "--paths", action="store_true",
                   help="print only each result's path:line, one per line (for scripts)")
    p.set_defaults(func=do_search)
    p = sub.add_parser("related", parents=[common],
                       help="the notes closest in meaning to a note, or to a text (needs "
                            "[embedding])")
    p.add_argument("note", nargs="?", metavar="PATH",
                   help="a note inside a source (its unsaved editor buffer counts, if any)")
    p.add_argument("--text", metavar="TEXT",
                   help="a passage instead of a note: the notes closest to it")
    p.add_argument("-k", type=int, help="number of notes (1-100, default 10)")
    p.add_argument("-l", "--paths", action="store_true",
                   help="print only each note's path:line, one per line (for scripts)")
    p.set_defaults(func=do_related)
    p = sub.add_parser("ask", parents=[common],
                       help="a grounded answer from your notes, citing them (needs [generator])")
    p.add_argument("question", nargs="+", help="the question (quotes optional)")
    p.add_argument("-k", type=int, help="notes to retrieve (default: generator.notes)")
    p.add_argument("--max-tokens", type=int, dest="max_tokens", metavar="N",
                   help="longest answer in tokens (default: generator.max_tokens)")
    p.add_argument("--source", action="append", metavar="NAME",
                   help="only notes of this source (repeatable)")
    p.add_argument("--path", metavar="GLOB", help="only files whose path matches, e.g. "
                                                  "'Projects/*', or a folder: 'Projects' "
                                                  "(as for search)")
    p.add_argument("--tag", metavar="TAG", help="only notes with this tag")
    p.set_defaults(func=do_ask)
    p = sub.add_parser("get", parents=[common],
                       help="print a file of a source, or lines of it (PATH:START-END)")
    p.add_argument("path", metavar="PATH[:START[-END]]",
                   help="a file inside a source; :START-END picks lines (1-based, inclusive)")
    p.set_defaults(func=do_get)
    p = sub.add_parser("mcp", parents=[common],
                       help="serve ragd to agents: a Model Context Protocol server on stdio")
    p.add_argument("-v", "--verbose", action="store_true", help="log every message to stderr")
    p.set_defaults(func=do_mcp)
    p = sub.add_parser("reindex", parents=[common], help="re-read and re-chunk every file")
    p.add_argument("--source", metavar="NAME", help="only this source")
    p.set_defaults(func=do_reindex)
    p = sub.add_parser("sources", parents=[common],
                       help="list the sources; 'sources add PATH', 'sources remove NAME'")
    p.add_argument("action", nargs="?", choices=["list", "add", "remove"], default="list",
                   help="list (default), add a folder, or remove a source")
    p.add_argument("path", nargs="?", metavar="PATH|NAME",
                   help="add: the folder; remove: the source's name")
    p.add_argument("--name", help="add: the source's name (default: the folder's name)")
    p.add_argument("--kind", choices=["obsidian", "folder"],
                   help="add: default obsidian if the folder has .obsidian/, else folder")
    p.set_defaults(func=do_sources)
    p = sub.add_parser("files", parents=[common],
                       help="every file ragd has seen: status, reason, chunks")
    p.add_argument("--source", metavar="NAME", help="only the files of this source")
    p.add_argument("--status", choices=["indexed", "skipped", "failed"],
                   help="only the files in this state (skipped and failed say why)")
    p.set_defaults(func=do_files)
    p = sub.add_parser("watch", parents=[common], help="print index events as they happen")
    p.set_defaults(func=do_watch)
    p = sub.add_parser("gc", parents=[common],
                       help="delete embedding cache entries nothing uses any more")
    p.add_argument("--grace-hours", type=float, metavar="H",
                   help="only those unused for at least H hours (default: [gc] grace_hours)")
    p.set_defaults(func=do_gc)
    p = sub.add_parser("models", parents=[common],
                       help="list models; 'models pull NAME' downloads one, 'models use NAME' "
                            "embeds with it")
    p.add_argument("action", nargs="?", choices=["list", "pull", "use"], default="list",
                   help="list (default), pull (download) a model, or use one for embedding")
    p.add_argument("name", nargs="?", help="registry name, or OWNER/REPO/FILE.gguf on the hub "
                   "(pull); a registry name or a .gguf path (use)")
    p.add_argument("--cancel", action="store_true",
                   help="use: cancel the switch under way (the model in use stays)")
    p.set_defaults(func=do_models)
    return ap


def _stdout_closed() -> bool:
    """Has the reader of our stdout gone away (`ragctl files | head`)?"""
    try:
        fd = sys.stdout.fileno()
        p = select.poll()
        p.register(fd, select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in p.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:  # `ragctl` alone: what it can do
        parser().print_help(sys.stderr)
        return 2
    _Parser.json_errors = "--json" in argv
    args = parser().parse_args(argv)

    def fail(message: str, rc: int, code: str = "failed", said: bool = False) -> int:
        """An error for the user on stderr: a line (with the daemon's code when `said`), or
        with --json one JSON object (what a script reads: {"error": code, "message": ...});
        stdout stays for results."""
        if getattr(args, "json", False):
            print(json.dumps({"error": code, "message": message}, ensure_ascii=False),
                  file=sys.stderr)
        else:
            print(f"ragctl: {message}" + (f" ({code})" if said else ""), file=sys.stderr)
        return rc

    # (get's path may be any file name: it goes as its bytes, path_bytes)
    named = {args.path} if getattr(args, "func", None) is do_get else set()
    for arg in argv:  # a byte that is not UTF-8 (a Latin-1 file name): said, not a traceback
        if arg in named:
            continue
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = os.fsencode(arg).decode("utf-8", "backslashreplace")
            return fail(f"argument '{shown}' is not valid UTF-8 (ragd takes names and text "
                        f"as UTF-8)", 2, "bad_args")

    try:
        return args.func(args)
    except BrokenPipeError as e:
        if _stdout_closed():  # not an error: the reader had enough
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # so the exit flush does not complain
            return 0
        return fail(f"lost the connection to ragd: {e}", 1, "connection")
    except Fail as e:  # exit 2: a wrong command line or config, as the daemon's bad_args
        return fail(str(e), e.code, "bad_args" if e.code == 2 else "failed")
    except P.DaemonError as e:  # exit 2 for a value of the command line it refused, or a
        # config it cannot read (a reload), as for ragctl's own
        return fail(e.message, 2 if e.code in (P.BAD_ARGS, P.BAD_CONFIG) else 1, e.code,
                    said=True)
    except (ConnectionError, TimeoutError, P.ProtocolError) as e:
        return fail(f"lost the connection to ragd: {e}", 1, "connection")
    except P.ConfigUnreadable as e:
        return fail(str(e), 2, "bad_config")
    except OSError as e:
        return fail(str(e), 2)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
