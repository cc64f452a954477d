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


@pytest.mark.slow  # (node builds the plugin)
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


@pytest.mark.slow  # (eslint over the plugin)
def test_lint_applies_the_plugin_review_rules():
    """`npm run lint`: ESLint with eslint-plugin-obsidianmd's recommended rules (those of
    Obsidian's plugin review), as the sample plugin has, over the plugin, its tests and its
    scripts: no error. And the rules bite: a console.log added to a source file is one."""
    npm()
    r = subprocess.run(["npm", "run", "--silent", "lint", "--", "--format", "json"],
                       cwd=OBSIDIAN, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    report = json.loads(r.stdout)
    linted = {os.path.relpath(f["filePath"], OBSIDIAN) for f in report}
    assert {"src/main.ts", "src/client.ts", "test/helpers.ts", "test/run.mjs",
            "version-bump.mjs", "esbuild.config.mjs", "eslint.config.mts"} <= linted, linted
    assert sum(f["errorCount"] for f in report) == 0
    probe = (OBSIDIAN / "src" / "render.ts").read_text() + '\nconsole.log("probe");\n'
    r = subprocess.run([str(OBSIDIAN / "node_modules" / ".bin" / "eslint"), "--stdin",
                        "--stdin-filename", "src/render.ts", "--format", "json"], input=probe,
                       cwd=OBSIDIAN, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr
    errors = [m for f in json.loads(r.stdout) for m in f["messages"] if m["severity"] == 2]
    assert [m["ruleId"] for m in errors] == ["obsidianmd/rule-custom-message"], errors
    assert "console" in errors[0]["message"]


def test_npm_version_bumps_the_manifest_and_versions(tmp_path):
    """`npm version X --no-git-tag-version` (the sample plugin's version-bump): package.json,
    manifest.json and versions.json all take X (versions.json mapping it to the manifest's
    minAppVersion), and the two files are staged."""
    npm()
    work = tmp_path / "plugin"
    work.mkdir()
    for name in ("package.json", "manifest.json", "versions.json", "version-bump.mjs"):
        (work / name).write_bytes((OBSIDIAN / name).read_bytes())
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    min_app = json.loads((OBSIDIAN / "manifest.json").read_text())["minAppVersion"]
    before = json.loads((OBSIDIAN / "versions.json").read_text())
    r = subprocess.run(["npm", "version", "9.8.7", "--no-git-tag-version"], cwd=work,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((work / "package.json").read_text())["version"] == "9.8.7"
    manifest = json.loads((work / "manifest.json").read_text())
    assert manifest["version"] == "9.8.7" and manifest["minAppVersion"] == min_app
    assert json.loads((work / "versions.json").read_text()) == {**before, "9.8.7": min_app}
    staged = subprocess.run(["git", "diff", "--cached", "--name-only"], cwd=work,
                            capture_output=True, text=True, check=True).stdout.split()
    assert sorted(staged) == ["manifest.json", "versions.json"]
    r = subprocess.run(["node", "version-bump.mjs"], cwd=work, capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if not k.startswith("npm_")},
                       timeout=60)
    assert r.returncode == 2 and "npm version" in r.stderr  # by hand: said, nothing written


@pytest.mark.slow  # (npm runs the node tests)
def test_npm_test_on_its_own_runs_through_pytest_or_says_why_not(tmp_path):
    """`npm test` by hand failed 19 of 22 tests: they need the daemon pytest starts. It runs
    them through pytest now (here one that needs no daemon, for time), and with no Python
    that has ragd it skips, saying so in one line."""
    npm()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAGD_TEST_", "PYTEST_"))}
    r = subprocess.run(["npm", "test", "--silent", "--", "-k", "socket_lookup", "-q",
                        "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'inner'}"],
                       cwd=OBSIDIAN, capture_output=True, text=True, timeout=600,
                       env=dict(env, RAGD_PYTHON=sys.executable))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.startswith(f"npm test: {sys.executable} -m pytest "), r.stdout
    assert re.search(r"^1 passed, \d+ deselected", r.stdout, re.M), r.stdout
    r = subprocess.run(["npm", "test", "--silent"], cwd=OBSIDIAN, capture_output=True,
                       text=True, timeout=120, env=dict(env, RAGD_PYTHON=str(tmp_path / "none")))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.count("\n") == 1 and r.stdout.startswith("npm test: skipped: "), r.stdout
    assert "need the real ragd" in r.stdout and "RAGD_PYTHON" in r.stdout


def test_every_node_test_file_is_run_by_a_test_npm_test_selects():
    """npm test runs the pytest tests named *obsidian*: each node test file must be run by one
    of them (a file no test runs would never run at all)."""
    import ast
    from editors import ROOT

    runs: dict[str, set[str]] = {}
    for module in ("test_editor_obsidian.py", "test_editor_new_ops.py"):
        tree = ast.parse((ROOT / "tests" / module).read_text())
        for fn in tree.body:
            if isinstance(fn, ast.FunctionDef):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "run_node":
                        name = node.args[1].value
                        runs.setdefault(name, set()).add(f"{module}::{fn.name}")
    files = {p.name[:-3] + ".mjs" for p in (OBSIDIAN / "test").glob("*.test.ts")}
    assert files == set(runs), (files, runs)
    for name, tests in runs.items():
        assert all("obsidian" in t for t in tests), (name, tests)
