"""ragctl's command line itself: what a wrong one says, and what --help says. The real ragctl
runs as a subprocess; none of this needs a daemon, except the last test, which checks that a
typo never reaches the one that runs."""

from __future__ import annotations

import json
import time

import pytest

from conftest import ragctl
from ragctl.cli import parser


def test_a_typod_command_or_choice_names_the_nearest_one(tmp_path):
    """One line on stderr (or one JSON object with --json), exit 2, as every wrong command
    line; a typo gets "did you mean", and something far from every command does not."""
    r = ragctl("serch", "weekly", "review")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == "ragctl: unknown command 'serch'; did you mean `search`? (see `ragctl -h`)\n"
    r = ragctl("--json", "stauts")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert json.loads(r.stderr) == {
        "error": "bad_args",
        "message": "ragctl: unknown command 'stauts'; did you mean `status`? (see `ragctl -h`)"}
    r = ragctl("xyzzy")
    assert r.returncode == 2 and r.stderr == "ragctl: unknown command 'xyzzy' (see `ragctl -h`)\n"
    # a choice of a command, and an option of it
    r = ragctl("search", "--mode", "hybird", "x")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "invalid choice 'hybird'; did you mean `hybrid`? (choose from hybrid, vector, bm25)" \
        in r.stderr and r.stderr.startswith("ragctl search: argument --mode: "), r.stderr
    r = ragctl("sources", "ad", str(tmp_path))
    assert r.returncode == 2 and "did you mean `add`?" in r.stderr
    r = ragctl("search", "--mdoe", "bm25", "x")
    assert r.returncode == 2 and r.stderr == (
        "ragctl search: unrecognized arguments: --mdoe; did you mean `--mode`? "
        "(see `ragctl search -h`)\n")
    r = ragctl("files", "--json", "--sorce", "notes")
    assert r.returncode == 2 and json.loads(r.stderr)["message"] == (
        "ragctl files: unrecognized arguments: --sorce notes; did you mean `--source`? "
        "(see `ragctl files -h`)")
    r = ragctl("status", "extra")  # not an option: nothing to suggest
    assert r.returncode == 2 and r.stderr == (
        "ragctl status: unrecognized arguments: extra (see `ragctl status -h`)\n")


@pytest.mark.slow
def test_every_command_has_a_description_and_every_option_a_help_text():
    """`ragctl X --help` starts with a line that says what X does (it had only the usage), and
    no option or argument is listed bare (files --source and --status were)."""
    ap = parser()
    commands = ap._commands.choices
    assert {"search", "files", "get", "status", "sources", "models"} <= set(commands)
    listed = {a.dest: a.help for a in ap._commands._choices_actions}
    for name, p in commands.items():
        bare = [a.option_strings or a.dest for a in p._actions if not a.help]
        assert not bare, f"ragctl {name}: no help text for {bare}"
        r = ragctl(name, "--help")
        assert r.returncode == 0, (name, r.stderr)
        usage, description = r.stdout.split("\n\n")[:2]
        assert usage.startswith(f"usage: ragctl {name} ")
        assert listed[name] and " ".join(description.split()) == listed[name], (name, r.stdout)
    top = ragctl("--help").stdout
    assert "`ragctl COMMAND -h` for its options" in top
    r = ragctl("files", "--help")
    assert "only the files of this source" in r.stdout
    assert "only the files in this state" in r.stdout


def test_a_typo_reaches_no_daemon(make_daemon):
    """A running daemon is not asked anything for a wrong command line: the reply is
    ragctl's own, at once, and ragd goes on."""
    with make_daemon() as d:
        r = ragctl("--config", d.config, "stop", "--now")
        assert r.returncode == 2 and "unrecognized arguments: --now" in r.stderr
        r = ragctl("--config", d.config, "stpo")
        assert r.returncode == 2 and "did you mean `stop`?" in r.stderr
        assert d.proc.poll() is None and d.call("ping")["pid"] == d.proc.pid


def test_stop_counts_an_exited_daemon_not_yet_reaped_as_stopped():
    """ragd's parent is init; in a container init may reap it a second or two after it
    exits, and `ragctl stop` waited for that (signal 0 finds a zombie): an idle stop took
    1.4-2 s of which ragd used 0.1. A zombie has stopped; a live process has not."""
    import subprocess
    import sys
    from ragctl.lifecycle import _alive
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        assert _alive(child.pid)
        child.stdin.close()  # it exits; not reaped until wait()
        deadline = time.monotonic() + 10
        while _alive(child.pid):
            assert time.monotonic() < deadline, "an exited child still counted alive"
            time.sleep(0.02)
        with open(f"/proc/{child.pid}/stat", "rb") as f:  # (still there, a zombie)
            assert f.read().rpartition(b")")[2].split()[0] == b"Z"
    finally:
        child.wait()
    assert not _alive(child.pid)


def test_durations_read_as_a_person_reads_them():
    """status's uptime and index lag: a daemon up for a month said "43200 min"."""
    from ragctl.render import _ago

    got = [_ago(s) for s in (0.34, 45.2, 3599, 19260, 2592000)]
    assert got == ["0.3 s", "45 s", "59 min", "5 h 21 min", "30 d 0 h"]


def test_a_passage_without_a_matching_line_is_shown_by_lines_that_say_something(
        make_daemon, tmp_path):
    """A result none of whose lines holds a word of the query (here the note's alias matched)
    is shown by the passage's first lines, but not by a line without a word: a fresh-user walk
    saw "136: 💚" shown for a newsletter's section."""
    vault = tmp_path / "notes"
    vault.mkdir()
    (vault / "Support.md").write_text(
        "---\naliases: [zebrafinch]\n---\n💚\n\n---\n\nGrab a membership and hold onto your "
        "hats.\n\nEvery edition is written by hand.\n")
    d = make_daemon(sources=[{"name": "notes", "path": str(vault), "kind": "folder"}])
    with d:
        d.wait_idle()
        res = d.call("search", query="zebrafinch", mode="bm25")
        assert [r["path"] for r in res["results"]] == [str(vault / "Support.md")], res
        assert res["results"][0]["match_lines"] == [], res["results"][0]
        r = ragctl("--config", d.config, "search", "--mode", "bm25", "zebrafinch")
        assert r.returncode == 0, r.stderr
        shown = [ln.strip() for ln in r.stdout.splitlines()[2:]]
        assert shown == ["8: Grab a membership and hold onto your hats.",
                         "10: Every edition is written by hand."], r.stdout


def test_a_query_that_starts_with_a_sign_is_a_query_not_an_option(make_daemon, tmp_path):
    """`ragctl search "->"` answered "the following arguments are required: query": argparse
    took the operator for an unknown option. A word that starts with a dash and a sign, not a
    letter, is the query's; an option with its dashes and letter is still an option."""
    vault = tmp_path / "notes"
    vault.mkdir()
    (vault / "Types.md").write_text("# Types\n\nA typed function: def area(r: float) -> float.\n"
                                    "\n<!-- a comment -->\n")
    (vault / "Other.md").write_text("# Other\n\nNothing typed here, a --> b in a comment.\n")
    d = make_daemon(sources=[{"name": "notes", "path": str(vault), "kind": "folder"}])
    with d:
        d.wait_idle()
        r = ragctl("--config", d.config, "search", "->", "--mode", "bm25", "-l")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [f"{vault / 'Types.md'}:3"], r.stdout
        r = ragctl("--config", d.config, "search", "-l", "what", "does", "->", "mean")
        assert r.returncode == 0 and f"{vault / 'Types.md'}:3" in r.stdout, r.stdout + r.stderr
        r = ragctl("--config", d.config, "search", "->", "-q")  # a letter: an option, unknown
        assert r.returncode == 2 and "unrecognized arguments: -q" in r.stderr, r.stderr
        # a comment's '-->' is no sign the index holds: the reason says the query has none
        # (it said no note holds a content word of it; grep finds two)
        r = ragctl("--config", d.config, "search", "-->", "--mode", "bm25")
        assert r.returncode == 1 and "the query has no word to look up, only punctuation" \
            in r.stdout, (r.stdout, r.stderr)
        res = d.call("search", query="what is the", mode="bm25")
        assert "only question and filler words" in res["reason"], res


def test_a_heading_that_says_the_title_again_is_shown_once():
    """A note "2021-08-14 Highlights Syncing" whose first heading is "2021-08-14: Highlights
    Syncing" was shown as "2021-08-14 Highlights Syncing — 2021-08-14: Highlights Syncing" (a
    fresh-user walk on the Obsidian Hub): the heading after the title is shown past it."""
    from ragctl.render import _head
    title = "2021-08-14 Highlights Syncing"
    assert _head(f"{title} > 2021-08-14: Highlights Syncing", title) == ""
    assert _head(f"{title} > 2021-08-14: highlights syncing > Setup", title) == "Setup"
    assert _head("Tasks > Filters > Due", "Tasks") == "Filters > Due"  # (others as before)
    assert _head("Tasks", "Tasks") == ""


def test_a_word_with_diacritics_is_marked_as_the_index_matched_it():
    """The index folds diacritics ('cafe' finds 'café', FTS5's remove_diacritics): the lines
    shown and the words marked are those it matched. A line holding 'café' was not shown for
    'cafe' (the first lines of the passage were), nor marked."""
    from ragctl.render import _mark, _terms
    from ragd.search.bm25 import matching_lines
    text = "Le menu du jour\nUn café noir et un résumé\nrien d'autre"
    assert matching_lines(text, 1, "cafe") == [2]
    assert matching_lines(text, 1, "resume") == [2]
    assert matching_lines("a cafe here\nno", 1, "café") == [1]
    assert _mark(text, _terms("cafe ≠"), True).count("\033[1;31m") == 1
    assert "\033[1;31mcafé\033[0m" in _mark(text, _terms("cafe"), True)
    assert "\033[1;31m≠\033[0m" in _mark("x ≠ y", _terms("≠"), True)  # a sign stays itself
    assert _mark("good, we go", _terms("go"), True) == "good, we \033[1;31mgo\033[0m"


def test_explain_gives_the_cosine_of_a_candidate_outside_the_vectors_top():
    """While vectors are coming, a BM25 candidate with its vector is ordered by its cosine
    though the vector search did not rank it: --explain gives that cosine, not only "not in
    its top candidates"."""
    from ragctl.render import _explain
    w = {"bm25": 1.0, "vector": 1.0}
    moved = _explain({"bm25": 3.2, "bm25_rank": 7, "vector": 0.61, "place_of_bm25_rank": 2}, w)
    assert "vector: not in its top candidates; cosine 0.61" in moved
    assert "in bm25 rank 2's place" in moved
    assert "vector: not in its top candidates" in _explain({"bm25": 3.2, "bm25_rank": 7}, w)
    assert "cosine" not in _explain({"bm25": 3.2, "bm25_rank": 7}, w)
    ranked = _explain({"bm25": 3.2, "bm25_rank": 7, "vector": 0.7, "vector_rank": 1}, w)
    assert "vector rank 1 (score 0.7" in ranked and "not in" not in ranked
