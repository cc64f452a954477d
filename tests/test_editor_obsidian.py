"""The Obsidian plugin (editors/obsidian): its build, and node's test runner over everything
below the Obsidian API (the socket client, framing, reconnect, the view models) against the
real daemon. Tests of its use of buffer_set, buffer_drop and related are in
test_editor_new_ops.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from editors import OBSIDIAN, npm
from ragd import protocol as P


@pytest.fixture(scope="session")
def node_tests():
    """The tests, bundled once by esbuild into build/test/."""
    npm()
    r = subprocess.run(["node", "esbuild.config.mjs", "test"], cwd=OBSIDIAN,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return OBSIDIAN / "build" / "test"


def run_node(node_tests, name: str, env: dict, timeout: float = 180) -> str:
    """`node --test` on one test file; fails with node's report unless every test passed."""
    full = dict(os.environ, **env)
    r = subprocess.run(["node", "--test", "--test-reporter=spec", str(node_tests / name)],
                       cwd=OBSIDIAN, capture_output=True, text=True, timeout=timeout, env=full)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    m = re.search(r"ℹ pass (\d+)\s+ℹ fail (\d+)", out)
    assert m and int(m.group(1)) > 0 and m.group(2) == "0", out
    return out


def daemon_env(d, expect: dict | None = None) -> dict:
    return {"RAGD_TEST_SOCKET": str(d.socket), "RAGD_TEST_CONFIG": str(d.config),
            "RAGD_TEST_PYTHON": sys.executable, "RAGD_TEST_VAULT": str(d.vault),
            "RAGD_TEST_EXPECT": json.dumps(expect or {})}


def test_build_gives_the_three_files_obsidian_loads(tmp_path):
    npm()
    r = subprocess.run(["npm", "run", "build"], cwd=OBSIDIAN, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr  # tsc type-checks against obsidian's API first
    main = (OBSIDIAN / "main.js").read_text()
    manifest = json.loads((OBSIDIAN / "manifest.json").read_text())
    assert manifest["id"] == "ragd" and manifest["isDesktopOnly"] is True
    assert (OBSIDIAN / "styles.css").stat().st_size > 0
    # A CommonJS bundle whose only imports are what Obsidian's Electron provides.
    required = set(re.findall(r'require\("([^"]+)"\)', main))
    assert "obsidian" in required and "net" in required
    assert required <= {"obsidian", "electron", "net", "fs", "os"}, required
    assert "module.exports" in main


def test_client_against_the_daemon(daemon, node_tests):
    search = daemon.call("search", query="custom statuses", k=5, mode="bm25")
    many = daemon.call("search", query="task", k=1000, mode="bm25")
    out = run_node(node_tests, "client.test.mjs",
                   daemon_env(daemon, {"search": search, "many_count": len(many["results"])}))
    assert "ℹ pass 8" in out


def test_view_models_for_the_daemons_replies(daemon, node_tests):
    out = run_node(node_tests, "models.test.mjs", daemon_env(daemon))
    assert "ℹ pass 7" in out


def test_reconnect_after_a_restart(daemon, node_tests):
    out = run_node(node_tests, "reconnect.test.mjs", daemon_env(daemon))
    assert "ℹ pass 2" in out
    assert daemon.proc.wait(10) == 0  # the node test stopped this one and ran its own


def test_socket_lookup_agrees_with_ragd(node_tests, tmp_path, monkeypatch):
    home = tmp_path / "home"
    conf = tmp_path / "xdgconf" / "ragd"
    conf.mkdir(parents=True)
    (conf / "config.toml").write_text(
        "[embedding]\nmodel = \"\"\n\n[daemon] # ragd\nsocket = \"~/s/r.sock\" # here\n"
        "[search]\nsocket = 'not this'\n")
    other = tmp_path / "other.toml"
    other.write_text(f"[daemon]\ndata_dir = '{tmp_path}/data dir'\n")
    monkeypatch.setenv("HOME", str(home))  # ragd expands ~ with the process's HOME
    cases = []
    for name, setting, env in [
            ("setting", "/x/y.sock", {"RAGD_SOCKET": "/z.sock"}),
            ("setting with ~", "~/a.sock", {}),
            ("RAGD_SOCKET", "", {"RAGD_SOCKET": "/z.sock"}),
            ("config", "", {"XDG_CONFIG_HOME": str(tmp_path / "xdgconf")}),
            ("runtime dir", "", {"XDG_RUNTIME_DIR": "/run/user/4242"}),
            ("config data_dir", "", {"RAGD_CONFIG": str(other)}),
            ("data home", "", {"XDG_DATA_HOME": str(tmp_path / "share")}),
            ("relative runtime dir", "", {"XDG_RUNTIME_DIR": "run"}),
            ("nothing", "", {})]:
        env = dict(env, HOME=str(home))
        want = P.socket_path(cli_socket=setting or None, env=env)
        cases.append({"name": name, "setting": setting, "env": env, "want": str(want)})
    run_node(node_tests, "socket.test.mjs", {"RAGD_TEST_EXPECT": json.dumps({"socket_cases": cases})})
