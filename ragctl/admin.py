"""Looking after the index: its sources and files, its events (watch), the embedding cache
(gc), the models, a re-index, and eval (retrieval quality on one's own questions). Each
``do_<op>`` here is the ``<op>`` on the wire."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ragd import protocol as P
from ragctl.client import Fail, _interactive, _ping, _socket, call, connect, emit
from ragctl.lifecycle import _add_sources, _progress
from ragctl.render import _one_line


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
        evaluate.relative(questions, roots)
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
        listed = configfile.sources(path)
        name = configfile.remove_source(path, name)
        folder = next((s["path"] for s in listed if s["name"] == name), None)
    except configfile.ConfigFileError as e:
        raise Fail(str(e), 2)
    print(f"removed source {name!r} from {path}")
    nested = folder and configfile.nested_in(path, str(folder))
    if running:
        try:
            call(args, "reload", timeout=60)
        except P.DaemonError as e:
            configfile.restore(path, before)
            raise Fail(f"ragd refused the new config ({e.message}); {path} is left as it was")
        how = (f" (its folder overlaps the source {nested!r}, so 'ragctl sources add' refuses "
               f"it: add its table back to {path} by hand)" if nested else "")
        print(f"ragd no longer searches it; its index rows are set aside for the GC grace "
              f"period, as its embeddings stay cached: added back under this name within "
              f"it{how}, it returns as it was, and under any name it embeds nothing")
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
                    # (padded as "chunks": the paths start in one column)
                    count = f"{f['chunks']:>4} chunk{'s' * (f['chunks'] != 1)}"
                    print(f"{f['status']:<8} {count:<11}  {_one_line(f['path'])}{why}")
            after = page.get("next")
            if not after:
                break
    if args.json:
        print(json.dumps({"files": every}, ensure_ascii=False))
    else:
        print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no files")
    return 0


def do_watch(args) -> int:
    """Print index events as they happen (Ctrl-C to stop), until ragd stops."""
    def show(e):
        if args.json:
            print(json.dumps(e, ensure_ascii=False), flush=True)
            return
        stamp = time.strftime("%H:%M:%S", time.localtime(e["time"]))
        # one line per event, as search -l and files print names (--json has them exact)
        what = _one_line(str(e.get("path") or e.get("message") or ""))
        extra = "".join(f" {k}={_one_line(str(e[k]))}"
                        for k in ("chunks", "from_path", "reason", "lost_before") if k in e)
        print(f"{stamp} {e['event']:<10} {what}{extra}".rstrip(), flush=True)

    with connect(args, timeout=None) as c:
        req = c.send("events")
        try:
            for reply in c.replies(req):
                show(reply["result"])
        except (ConnectionError, P.ProtocolError):
            # the stream ends when ragd stops: said as the last event, not as an error (it
            # said "lost the connection to ragd", exit 1); a daemon still answering is one
            if _ping(_socket(args)) is not None:
                raise
            show({"event": "stopped", "time": time.time(), "message": "ragd stopped"})
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
    for problem in res.get("config_problems") or ():
        lines.append(f"warning: the config file's {problem}")
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
        try:  # (and ragd hears it: else its status warns of the file's refused model)
            call(args, "reload", timeout=120)
        except P.DaemonError:
            pass
        raise Fail(f"{value} cannot be used: {res['embedding_error']}; the model in use stays "
                   f"and {path} is left as it was", 2)
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
                print(f"\rswitching {sw['from']} -> {sw['to']}: {sw['vectors']:,}/{sw['chunks']:,} "
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
