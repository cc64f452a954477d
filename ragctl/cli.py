"""``ragctl``: the thin command-line client of ragd. Here: its argument parser and main().

It imports nothing from ragd but the protocol module. Each ``do_<op>`` is the ``<op>`` on the
wire: ragctl.lifecycle holds start, stop, reload, status and service; ragctl.query search,
related, ask, get and mcp; ragctl.admin sources, files, watch, gc, models, reindex and eval.
What they share is in ragctl.client, their text for people in ragctl.render.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import select
import sys

from ragd import protocol as P
from ragctl.admin import (do_eval, do_files, do_gc, do_models, do_reindex, do_sources,
                          do_watch)
from ragctl.client import Fail
from ragctl.lifecycle import do_reload, do_service, do_start, do_status, do_stop
from ragctl.query import do_ask, do_get, do_mcp, do_related, do_search


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


_OPTION = re.compile(r"--?[A-Za-z]")


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

    def _parse_optional(self, arg_string):
        # A word that starts with a sign, not a letter, is a query's, not an option: `ragctl
        # search "->"` said "the following arguments are required: query" ("->" taken for an
        # unknown option). Options all start with a letter after their dashes.
        if len(arg_string) > 1 and arg_string[0] == "-" and arg_string != "--" \
                and not _OPTION.match(arg_string):
            return None
        return super()._parse_optional(arg_string)

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
    p.add_argument("--no-wait", action="store_true",
                   help="return once ragd answers, not once its keyword index is ready "
                        "(indexing goes on in the background)")
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

    # (get's and related's path may be any file name: it goes as its bytes, path_bytes)
    func = getattr(args, "func", None)
    named = {args.path} if func is do_get else {args.note} if func is do_related else set()
    for arg in argv:  # a byte that is not UTF-8 (a Latin-1 file name): said, not a traceback
        if arg in named:
            continue
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = os.fsencode(arg).decode("utf-8", "backslashreplace")
            return fail(f"argument '{shown}' is not valid UTF-8 (ragd takes names and text "
                        f"as UTF-8)", 2, "bad_args")

    # search and related exit 1 when they find nothing, as grep does; so, as grep does, they
    # exit 2 on an error (ragd not running, a lost connection): a script tells them apart
    error = 2 if args.func in (do_search, do_related) else 1
    try:
        return args.func(args)
    except BrokenPipeError as e:
        if _stdout_closed():  # not an error: the reader had enough
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # so the exit flush does not complain
            return 0
        return fail(f"lost the connection to ragd: {e}", error, "connection")
    except Fail as e:  # exit 2: a wrong command line or config, as the daemon's bad_args
        return fail(str(e), max(e.code, error), "bad_args" if e.code == 2 else "failed")
    except P.DaemonError as e:  # exit 2 for a value of the command line it refused, or a
        # config it cannot read (a reload), as for ragctl's own
        return fail(e.message, 2 if e.code in (P.BAD_ARGS, P.BAD_CONFIG) else error, e.code,
                    said=True)
    except (ConnectionError, TimeoutError, P.ProtocolError) as e:
        return fail(f"lost the connection to ragd: {e}", error, "connection")
    except P.ConfigUnreadable as e:
        return fail(str(e), 2, "bad_config")
    except OSError as e:
        return fail(str(e), 2)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
