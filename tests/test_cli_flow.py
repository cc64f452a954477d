"""ragctl's first hour, through the real daemon: `related` from the shell, what `start` says
comes next, a status header that says what the daemon is doing, and a stop that is quick from
any state (issue 31)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from conftest import ROOT, bulk_embedding_stopped, engine_config, ragctl, small_vault, wait_embedded

STATUSES = "How To/Set up custom statuses.md"


def test_related_from_the_shell_in_searchs_output_forms(make_daemon, tmp_path):
    """`ragctl related PATH` and `--text`: plain lines, `-l` paths, `--json` the reply, `-k`;
    a note whose vectors are still coming: the coverage and the daemon's reason, exit 1 and
    nothing on stdout with -l (as grep)."""
    vault = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "notes", "path": str(vault), "kind": "folder"}],
                    extra=engine_config())
    note = vault / STATUSES
    cfg = ("--config", d.config)
    with d:
        # (first, during the first embedding: a note added now waits for its vectors; once
        # the backlog is done, a new note's texts are embedded as it is indexed)
        d.wait_idle()
        other = tmp_path / "Docs2"
        other.mkdir()
        new = other / "Lighthouse.md"
        new.write_text("# Lighthouse\n\nThe keeper cleans the lamp every Tuesday.\n")
        with bulk_embedding_stopped(d):
            r = ragctl(*cfg, "sources", "add", other)
            assert r.returncode == 0, r.stderr
            d.wait_idle()
            reason = d.call("related", path=str(new), k=5)["reason"]
            r = ragctl(*cfg, "related", new)
            assert r.returncode == 1 and r.stdout == f"no related notes ({reason})\n"
            assert "(vectors cover " in r.stderr and "% of the index so far" in r.stderr
            r = ragctl(*cfg, "related", new, "-l")
            assert r.returncode == 1 and r.stdout == ""
            assert f"no related notes ({reason})" in r.stderr
            r = ragctl(*cfg, "related", new, "--json")
            assert r.returncode == 1 and json.loads(r.stdout)["reason"] == reason
        wait_embedded(d)
        want = d.call("related", path=str(note), k=3)["results"]
        assert len(want) == 3
        r = ragctl(*cfg, "related", note, "-k", "3")
        assert r.returncode == 0 and not r.stderr, r.stderr
        for i, w in enumerate(want, 1):
            assert f"{i:>2}. {w['title']}" in r.stdout
            assert f"    {w['path']}:" in r.stdout
        assert "close to lines" in r.stdout and f"of {note}" in r.stdout
        r = ragctl(*cfg, "related", note, "-k", "3", "-l")
        assert r.returncode == 0
        assert [ln.rsplit(":", 1)[0] for ln in r.stdout.splitlines()] == [w["path"] for w in want]
        # a relative path is the shell's: taken from the current folder
        r = subprocess.run([sys.executable, "-m", "ragctl", *cfg, "related", STATUSES, "--json",
                            "-k", "2"], capture_output=True, text=True, cwd=vault, timeout=60,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
        out = json.loads(r.stdout)
        assert [x["path"] for x in out["results"]] == [w["path"] for w in want[:2]]
        assert out["of"] == str(note)
        r = ragctl(*cfg, "related", "--text", "custom task statuses and their symbols", "-l")
        assert r.returncode == 0 and r.stdout.count("\n") == 10, r.stdout
        r = ragctl(*cfg, "related")
        assert r.returncode == 2 and "give a note's PATH or --text" in r.stderr
        r = ragctl(*cfg, "related", note, "--text", "x")
        assert r.returncode == 2 and "not both" in r.stderr
        r = ragctl(*cfg, "related", tmp_path / "elsewhere.md")
        assert r.returncode == 1 and "is not in any source" in r.stderr

