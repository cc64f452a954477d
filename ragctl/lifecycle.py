"""The daemon's life: start (and its progress line), stop, reload, status, and service (ragd
run by systemd or launchd). Each ``do_<op>`` here is the ``<op>`` on the wire."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ragd import protocol as P
from ragctl.client import Down, Fail, _interactive, _ping, _socket, call, emit, where_it_runs
from ragctl.render import _ago, _count, _one_line


START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0


def do_start(args) -> int:
    if args.socket:
        # ragd has no --socket flag: its config sets where it listens. Refuse rather than start
        # a daemon that listens elsewhere than where we would wait for it.
        raise Fail("--socket cannot choose where a new daemon listens; set daemon.socket in "
                   "the config instead", 2)
    env = {k: v for k, v in os.environ.items() if k != "RAGD_SOCKET"}
    path = where_it_runs(args.config, P.socket_path(None, args.config, env))
    info = _ping(path)
    if info is not None:
        if args.source:  # add them to the running daemon (its config), or say why not
            return _add_sources(args, args.source, running=True, starting=True)
        print(f"ragd is already running (pid {info['pid']})")
        return 0
    if args.source:  # the config is the truth: the folders go into it, then ragd starts
        _add_sources(args, args.source, running=False, starting=True)
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
        upgrading = P.upgrading_path(path)
        told = False
        while True:
            if time.monotonic() >= deadline:
                # an index upgrade (once) can outlast the timeout: waited for, said so, and
                # the start after it given the usual time
                try:
                    what = upgrading.read_text().strip()
                except OSError:
                    what = None
                if what is None and told != "upgrading":
                    break
                if what is not None and not told:
                    print(f"ragd is upgrading its index ({what}; once): waiting for it",
                          file=sys.stderr, flush=True)
                told = "upgrading" if what is not None else "upgraded"
                deadline = time.monotonic() + START_TIMEOUT
            if proc.poll() is not None:
                err.seek(0)
                msg = err.read().decode(errors="replace").strip()
                # ragd's own exit 2 is a config it refused (a value out of range): ragctl's 2
                raise Fail(msg or f"ragd exited with status {proc.returncode} before answering",
                           2 if proc.returncode == 2 else 1)
            info = _ping(path)
            if info is not None:
                print(f"ragd started (pid {info['pid']}, socket {path})")
                if args.no_wait:
                    if not args.json:
                        print("indexing in the background; `ragctl status` to follow")
                elif _interactive(args):
                    _progress(args, path)
                else:
                    # a script's next command searches: returned at once, `start && search`
                    # answered "nothing relevant" from an index still being filled
                    _wait_indexed(args, path)
                return 0
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        raise Fail(f"ragd (pid {proc.pid}) did not answer within {START_TIMEOUT:.0f}s; "
                   f"see its log")


def _progress(args, sock, what: str = "indexing") -> None:
    """A progress line while ragd indexes (files, chunks, vectors, rate, ETA), until the
    keyword index is complete; then one line on the embedding still to come. Ctrl-C stops
    watching, not ragd."""
    t0 = time.monotonic()
    first_vectors = None
    read = False  # files were read while the first texts were embedded
    try:
        with P.Client(sock, timeout=30) as c:
            while True:
                st = c.call("status")
                read = read or bool(st["pending"]) or not st["idle"]
                files = sum(s["files"] for s in st["sources"])
                chunks = sum(s["chunks"] for s in st["sources"])
                e = st.get("engines", {}).get("embedding", {})
                vectors = e.get("vectors", 0)
                elapsed = time.monotonic() - t0
                line = f"{what}: {files} files, {chunks} chunks"
                if st["pending"] and any(s.get("scanning") for s in st["sources"]):
                    # the folders are still being listed: what is queued is not what is left
                    # ("500 files, 318 to go", then "500 files, 82 to go")
                    line += f", {st['pending']} queued, listing folders"
                elif st["pending"]:
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
            st = _counted(c, st)
        print()
        rate = None
        if first_vectors and time.monotonic() > first_vectors[0] + 1:
            rate = (vectors - first_vectors[1]) / (time.monotonic() - first_vectors[0])
        print(_next_step(st, rate, shared=read))
    except KeyboardInterrupt:
        print("\nragd goes on in the background ('ragctl status' shows where it is)")
    except (OSError, P.ProtocolError, P.DaemonError):
        print()


def _counted(c, st: dict) -> dict:
    """The status once the daemon knows what is left to embed: the vectors are loaded first
    (a restart embeds nothing it embedded before), a few seconds, not a guess from chunks -
    vectors; at most 15 s."""
    deadline = time.monotonic() + 15
    while st.get("engines", {}).get("embedding", {}).get("pending_texts", 0) is None \
            and time.monotonic() < deadline:
        time.sleep(0.5)
        st = c.call("status")
    return st


def _wait_indexed(args, sock) -> None:
    """Until the keyword index holds every file (the daemon's own wait: nothing polls); then
    say what follows. Vectors are not waited for: they follow in the background."""
    try:
        with P.Client(sock, timeout=3630) as c:
            st = c.call("status")
            read = bool(st["pending"]) or not st["idle"]
            while True:
                c.call("wait", timeout=3600, vectors=False)
                st = c.call("status")
                if st["idle"] and st["pending"] == 0 and not any(
                        s["scanning"] for s in st["sources"]):
                    st = _counted(c, st)
                    break
                time.sleep(0.05)  # (what is still to do was asked for while it waited)
    except (OSError, P.ProtocolError, P.DaemonError) as e:
        raise Fail(f"ragd started, but waiting for its keyword index failed: {e}; "
                   f"`ragctl status` says where it is") from None
    if not args.json:
        print(_next_step(st, shared=read))


def _next_step(st: dict, rate: float | None = None, shared: bool = False) -> str:
    """Once the keyword index is complete: what happens next, and how long it may take (from
    the daemon's embedding pace, else the vectors/s watched here, else no estimate). `shared`:
    files were read meanwhile, and the first batches' pace, sharing the cores with the
    indexer, is slower than what follows."""
    e = st.get("engines", {}).get("embedding")
    if not e:
        return "keyword index ready; no embedding model: search ranks by keywords"
    chunks = sum(s["chunks"] for s in st["sources"])
    todo = e.get("pending_texts")
    if todo is None:  # not counted yet: the engine is being prepared or started
        doing = st.get("doing") or "the embedding engine is starting"
        return (f"keyword index ready ({chunks:,} chunks); vectors: {doing}; search works now, "
                f"on keywords until the vectors are in; `ragctl status` to follow")
    if not todo:
        return "index ready: keywords and vectors of every chunk"
    if e.get("eta_s") or rate:
        eta = f"~{max(1, round((e.get('eta_s') or todo / rate) / 60))} min"
        if shared:
            eta += ", or less: the first batches shared the cores with reading the files"
    else:
        eta = "no estimate yet"
    doing = st.get("doing") or ""
    if e.get("state") != "ready":
        eta += f"; {doing or 'the embedding engine is starting'}"
    return (f"keyword index ready; embedding {_count(todo, 'chunk')} in the background ({eta}); "
            f"search works now, on keywords until the vectors are in; `ragctl status` to follow")


def _add_sources(args, folders: list[str], running: bool, starting: bool = False) -> int:
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
        restored = [n for n in res.get("restored") or () if n in res["added"]]
        fresh = [n for n in res["added"] if n not in restored]
        if restored:
            print(f"ragd restored {', '.join(restored)} as it was when removed (its files set "
                  f"aside, kept for the GC grace period): only changes since are read")
        if fresh:
            print(f"ragd is indexing {', '.join(fresh)} now")
        if _interactive(args):
            _progress(args, _socket(args))
        elif starting and not args.no_wait:  # (start, as above)
            _wait_indexed(args, _socket(args))
    elif added and not starting:
        print("'ragctl start' indexes it")
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


def _alive(pid: int) -> bool:
    """Whether the process still runs. An exited one that its parent has not reaped yet (a
    zombie: ragd's parent is init, which in a container may reap it a second or two later)
    has stopped, though a signal 0 still finds it."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # pid (comm) state ...: comm may hold spaces and parentheses, so after the last ")"
            return f.read().rpartition(b")")[2].split()[:1] != [b"Z"]
    except OSError:  # (no /proc, as on macOS: signal 0 is all there is)
        return True


def do_stop(args) -> int:
    try:
        result = call(args, "stop")
    except Down as e:
        # Nothing to stop is what a stop asks for: exit 0, as systemctl stop does, so that
        # `ragctl stop && ragctl start` (the README's restart) starts a ragd that was not
        # running. (The start hint is no answer to a stop.)
        message = str(e).split(";")[0]
        emit(args, {"running": False, "stopped": False, "message": message},
             lambda r: print(f"{message}: nothing to stop"))
        return 0
    except Fail as e:  # a config to fix first, or a socket ragctl may not use
        if args.json:
            print(json.dumps({"running": False, "message": str(e)}))
            return e.code
        raise
    pid = result["pid"]
    t0 = time.monotonic()
    deadline = t0 + STOP_TIMEOUT
    if not args.json:  # (ragd stops within seconds: said, so the wait is not a silent one)
        print(f"stopping ragd (pid {pid})…", flush=True)
    while time.monotonic() < deadline:
        if not _alive(pid):
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
        for overlap in r.get("overlaps") or ():
            print(f"  warning: {overlap}")
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
        for problem in r.get("next_start") or ():
            print(f"  warning: {problem} (its engine will not start)")
        if r["restart_needed"]:
            print(f"  a restart is needed for: {', '.join(r['restart_needed'])} "
                  f"('ragctl stop && ragctl start')")

    emit(args, res, human)
    return 0


def do_status(args) -> int:
    st = call(args, "status")

    def human(st):
        state = st.get("doing")  # (an older ragd: from the indexer's state)
        if state is None:
            state = st.get("indexer", "idle" if st["idle"] else "indexing")
            todo = st.get("engines", {}).get("embedding", {}).get("pending_texts")
            if state == "idle" and todo:  # the files are indexed; their vectors are coming
                state = f"embedding ({todo} texts to go)"
        pending = f", {_count(st['pending'], 'file')} pending" if st["pending"] else ""
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
            extra = "".join(f", {s[k]:,} {k}" for k in ("skipped", "failed") if s[k])
            files = f"{s['files']:>7,} file{'s' if s['files'] != 1 else ' '}"
            chunks = f"{s['chunks']:>9,} chunk{'s' if s['chunks'] != 1 else ' '}"
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
                        f"{_count(todo, 'text')} to embed{eta}, "
                        f"{e.get('order') or 'in index order'}"
                        if todo else "every chunk embedded")
                # (the space may hold vectors of texts no chunk uses any more, until GC: never
                # "100%" while texts are still to embed)
                share = 100 * min(e["vectors"], chunks) / chunks if chunks else 0.0
                share = min(share, 99.0) if todo else share
                pct = f" ({share:.0f}%)" if chunks else ""
                line += f"  {e['vectors']:,} vectors{pct}, {left} ({e['embedder']})"
            if role == "generator" and e.get("context"):
                line += f"  context {e['context']}"
            print(line)
            sw = e.get("switch")
            if sw and sw.get("engine") == "failed":
                why = (sw.get("engine_reason") or "").splitlines()
                print(f"    switching to {sw['to']} is stalled: its engine failed"
                      f"{': ' + why[0] if why else ''}; {sw['from']} answers meanwhile "
                      f"('ragctl models use --cancel' gives up the switch)")
            elif sw:
                eta = f", ~{sw['eta_s'] / 60:.0f} min left" if sw.get("eta_s") else ""
                print(f"    switching to {sw['to']}: {sw['vectors']:,}/{sw['chunks']:,} chunks "
                      f"({100 * sw['progress']:.0f}%){eta}; {sw['from']} answers meanwhile "
                      f"('ragctl models use --cancel' stops it)")
            for note in (e.get("space_note"), e.get("reason")):
                if note:
                    print("    " + note.replace("\n", "\n    "))
            for which, eng in ((role, e), ("query", e.get("query_engine") or {})):
                if eng.get("state") == "failed" and eng.get("next_try"):
                    print(f"    {which} engine: next try in "
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
                        f"chunks and notes to add"
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
