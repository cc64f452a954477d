"""``ragctl``: the thin command-line client of ragd.

It imports nothing from ragd but the protocol module, and finds the socket the same way ragd
does (--socket, $RAGD_SOCKET, else --config / $RAGD_CONFIG / the XDG config). Each ``do_<op>``
here is the ``<op>`` on the wire.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import tempfile
import time
import tomllib
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


def connect(args, timeout: float | None = 30.0) -> P.Client:
    path = P.socket_path(args.socket, args.config)
    try:
        return P.Client(path, timeout=timeout)
    except P.NotRunning:
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
        print(f"ragd is already running (pid {info['pid']})")
        return 0
    cmd = [sys.executable, "-m", "ragd", "--background"]
    if args.config:
        cmd += ["--config", os.path.abspath(args.config)]
    for s in args.source:
        cmd += ["--source", s]
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        delay = 0.01
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                err.seek(0)
                msg = err.read().decode(errors="replace").strip()
                raise Fail(msg or f"ragd exited with status {proc.returncode} before answering")
            info = _ping(path)
            if info is not None:
                print(f"ragd started (pid {info['pid']}, socket {path})")
                return 0
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        raise Fail(f"ragd (pid {proc.pid}) did not answer within {START_TIMEOUT:.0f}s; "
                   f"see its log")


def do_stop(args) -> int:
    try:
        result = call(args, "stop")
    except Fail as e:
        raise Fail(str(e).split(";")[0])
    pid = result["pid"]
    deadline = time.monotonic() + STOP_TIMEOUT
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
    print(f"ragd stopped (pid {pid})")
    return 0


def do_status(args) -> int:
    st = call(args, "status")

    def human(st):
        print(f"ragd {st['version']}  pid {st['pid']}  up {st['uptime_s']:.0f}s  "
              f"pending {st['pending']}{'' if st['idle'] else '  (indexing)'}")
        print(f"data {st['data_dir']}\nsocket {st['socket']}")
        if not st["sources"]:
            print("no sources configured: add [[sources]] to your config.toml")
        for hint in st.get("hints", []):
            print(hint)
        for s in st["sources"]:
            extra = "".join(f", {s[k]} {k}" for k in ("skipped", "failed") if s[k])
            print(f"  {s['name']:<20} {s['files']:>7} files {s['chunks']:>8} chunks{extra}"
                  f"  {s['kind']}  {s['path']}")
            if s.get("lag_s"):
                print(f"    index lag: {s['lag_s']:.1f}s")
            if s.get("watch_error"):
                print(f"    not watched: {s['watch_error']}")
            if s.get("last_error"):
                print(f"    last error: {s['last_error']}")
        for role, e in st.get("engines", {}).items():
            line = f"{role} engine: {e.get('state')}  model {e.get('model')}"
            if role == "embedding" and "vectors" in e:
                line += (f"  {e['vectors']} vectors, {e['pending_texts']} texts to embed "
                         f"({e['embedder']})")
            print(line)
            for note in (e.get("space_note"), e.get("reason")):
                if note:
                    print("    " + note.replace("\n", "\n    "))

    emit(args, st, human)
    return 0


def do_search(args) -> int:
    kw = {"query": args.query}
    for key in ("mode", "k", "rerank", "wait"):
        if getattr(args, key) is not None:
            kw[key] = getattr(args, key)
    if args.source:
        kw["sources"] = args.source
    res = call(args, "search", **kw)

    def human(res):
        notes = []
        if res.get("degraded"):
            notes.append(f"degraded to BM25: {res.get('reason')}")
        if res.get("rerank_reason"):
            notes.append(f"not reranked: {res['rerank_reason']}")
        for note in notes:
            print(f"({note})")
        if not res["results"]:
            print(f"no results ({res.get('reason') or 'nothing matched'})")
        for i, r in enumerate(res["results"], 1):
            head = f" — {r['heading']}" if r["heading"] else ""
            stale = "  (changed since indexed)" if r.get("stale") else ""
            print(f"{i:>2}. {r['path']}:{r['line_start']}-{r['line_end']}  "
                  f"[{r['score']:.3f}]{head}{stale}")
            snippet = " ".join(r["text"].split())
            print(f"    {snippet[:200]}{'…' if len(snippet) > 200 else ''}")

    out = {k: res[k] for k in ("query", "mode", "elapsed_ms", "results")}
    out.update({k: v for k, v in res.items() if k not in out})
    emit(args, out, human)
    return 0


def do_get(args) -> int:
    path, start, end = split_range(args.path)
    kw = {"path": os.path.abspath(os.path.expanduser(path))}
    kw.update({k: v for k, v in (("line_start", start), ("line_end", end)) if v is not None})
    res = call(args, "get", **kw)

    def human(res):
        sys.stdout.write(res["text"] + ("\n" if res["text"] else ""))
        if res["truncated"]:
            print(f"ragctl: cut at {res['unit']} {res['line_end']} of {res['lines_total']} (the "
                  f"reply size limit); continue with {res['path']}:{res['line_end'] + 1}",
                  file=sys.stderr)

    emit(args, res, human)
    return 0


def do_mcp(args) -> int:
    from ragctl import mcp  # only this command needs it
    return mcp.run(args.socket, args.config, verbose=args.verbose)


def do_reindex(args) -> int:
    res = call(args, "reindex", source=args.source)
    emit(args, res, lambda r: print(f"reindexing {', '.join(r['queued']) or 'nothing'}"))
    return 0


def do_sources(args) -> int:
    res = call(args, "sources")

    def human(rows):
        if not rows:
            print("no sources configured")
        for s in rows:
            print(f"{s['name']:<20} {s['kind']:<9} {s['path']}")

    emit(args, res, human)
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
                    print(f"{f['status']:<8} {f['chunks']:>4} chunks  {_one_line(f['path'])}{why}")
            after = page.get("next")
            if not after:
                break
    if args.json:
        print(json.dumps({"files": every}, ensure_ascii=False))
    else:
        print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no files")
    return 0


def _one_line(text: str) -> str:
    """A name or reason on one terminal line: control characters (a newline in a file name)
    shown escaped."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


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
        f"{r['waiting']} unused entries kept for the grace period"))
    return 0


def do_models(args) -> int:
    if args.action == "pull":
        if not args.name:
            raise Fail("usage: ragctl models pull NAME", 2)
        return _pull(args, args.name)
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


def parser() -> argparse.ArgumentParser:
    common = _common(top=False)
    ap = argparse.ArgumentParser(prog="ragctl", parents=[_common(top=True)],
                                 description="Talk to the ragd retrieval daemon.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("start", parents=[common], help="start ragd in the background")
    p.add_argument("--source", metavar="PATH", action="append", default=[],
                   help="also index this folder for this run (repeatable)")
    p.set_defaults(func=do_start)
    p = sub.add_parser("stop", parents=[common], help="stop ragd")
    p.set_defaults(func=do_stop)
    p = sub.add_parser("status", parents=[common], help="what ragd is doing and holds")
    p.set_defaults(func=do_status)
    p = sub.add_parser("search", parents=[common], help="search the index")
    p.add_argument("query", help="free text; \"quoted phrases\" stay phrases")
    p.add_argument("-k", type=int, help="number of results (default: search.k in the config)")
    p.add_argument("--mode", choices=["hybrid", "vector", "bm25"],
                   help="ranking (default: search.mode in the config, hybrid)")
    p.add_argument("--rerank", action=argparse.BooleanOptionalAction, default=None,
                   help="rerank with the cross-encoder (default: when one is configured)")
    p.add_argument("--source", action="append", metavar="NAME",
                   help="search only this source (repeatable)")
    p.add_argument("--wait", type=float, metavar="SECONDS",
                   help="first wait (at most this long) for pending changes to be indexed")
    p.set_defaults(func=do_search)
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
    p = sub.add_parser("sources", parents=[common], help="list the configured sources")
    p.set_defaults(func=do_sources)
    p = sub.add_parser("files", parents=[common],
                       help="every file ragd has seen: status, reason, chunks")
    p.add_argument("--source", metavar="NAME")
    p.add_argument("--status", choices=["indexed", "skipped", "failed"])
    p.set_defaults(func=do_files)
    p = sub.add_parser("watch", parents=[common], help="print index events as they happen")
    p.set_defaults(func=do_watch)
    p = sub.add_parser("gc", parents=[common],
                       help="delete embedding cache entries nothing uses any more")
    p.add_argument("--grace-hours", type=float, metavar="H",
                   help="only those unused for at least H hours (default: [gc] grace_hours)")
    p.set_defaults(func=do_gc)
    p = sub.add_parser("models", parents=[common],
                       help="list models; 'models pull NAME' downloads one")
    p.add_argument("action", nargs="?", choices=["list", "pull"], default="list")
    p.add_argument("name", nargs="?", help="registry name, or OWNER/REPO/FILE.gguf on the hub")
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
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError as e:
        if _stdout_closed():  # not an error: the reader had enough
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # so the exit flush does not complain
            return 0
        print(f"ragctl: lost the connection to ragd: {e}", file=sys.stderr)
        return 1
    except Fail as e:
        print(f"ragctl: {e}", file=sys.stderr)
        return e.code
    except P.DaemonError as e:
        print(f"ragctl: {e.message} ({e.code})", file=sys.stderr)
        return 1
    except (ConnectionError, TimeoutError, P.ProtocolError) as e:
        print(f"ragctl: lost the connection to ragd: {e}", file=sys.stderr)
        return 1
    except (tomllib.TOMLDecodeError, OSError) as e:
        print(f"ragctl: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
