"""The Neovim plugin (editors/nvim) in a headless Neovim, against the real daemon over its real
socket, on Debian 12's Neovim 0.7 and on a current one. Tests of the plugin's use of
buffer_set, buffer_drop and related are in test_editor_new_ops.py."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import threading

import pytest

from conftest import small_vault
from editors import NVIM_PLUGIN, expected_line, lua_str, require_nvim, run_nvim
from ragd import protocol as P

QUERY = "custom statuses"

pytestmark = pytest.mark.parametrize("nvim_name", ["nvim0.7", "nvim-current"])


def test_search_returns_the_daemons_results(daemon, nvim_name, tmp_path):
    nvim = require_nvim(nvim_name)
    want = daemon.call("search", query=QUERY, k=5, mode="bm25")
    got = run_nvim(nvim, f"""
        local ragd = require('ragd')
        local results, reply = ragd.search({lua_str(QUERY)},
            {{ socket = {lua_str(str(daemon.socket))}, k = 5, mode = 'bm25', timeout_ms = 5000 }})
        result.results = results
        result.mode = reply.mode
        result.query = reply.query
        result.version = vim.version().minor
    """, tmp_path / "nvim")
    assert got["version"] == (7 if nvim_name == "nvim0.7" else got["version"])
    assert got["mode"] == "bm25" and got["query"] == QUERY
    assert len(got["results"]) == len(want["results"]) > 1  # one per note
    assert [(r["path"], r["line_start"], r["heading"]) for r in got["results"]] == \
        [(r["path"], r["line_start"], r["heading"]) for r in want["results"]]


def test_socket_found_like_ragctl(daemon, nvim_name, tmp_path, monkeypatch):
    """$RAGD_SOCKET, the config file's [daemon] socket, XDG_RUNTIME_DIR, the data dir: the
    plugin's lookup agrees with ragd/protocol.py for each, and a search without opts.socket
    reaches the daemon through $RAGD_SOCKET."""
    nvim = require_nvim(nvim_name)
    home = tmp_path / "home"
    cfg_dir = tmp_path / "xdgconf" / "ragd"
    cfg_dir.mkdir(parents=True)
    (cfg_dir / "config.toml").write_text(
        '[embedding]\nmodel = ""\n\n[daemon]\n# the socket\nsocket = "~/sock/r.sock"  # here\n'
        'log_level = "info"\n\n[search]\nsocket = "not this one"\n')
    other_cfg = tmp_path / "other.toml"
    other_cfg.write_text(f"[daemon]\ndata_dir = '{tmp_path}/data dir'\n")
    cases = {
        "socket_env": {"RAGD_SOCKET": str(daemon.socket)},
        "config": {"XDG_CONFIG_HOME": str(tmp_path / "xdgconf")},
        "runtime": {"XDG_RUNTIME_DIR": "/run/user/4242"},
        "data_dir_config": {"RAGD_CONFIG": str(other_cfg)},
        "data_home": {"XDG_DATA_HOME": str(tmp_path / "share")},
        "nothing": {},
    }
    lua_cases = ",\n".join(
        f"[{lua_str(name)}] = {{ {', '.join(f'{k} = {lua_str(v)}' for k, v in env.items())} }}"
        for name, env in cases.items())
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAGD_", "XDG_"))}
    env["HOME"] = str(home)
    env["RAGD_SOCKET"] = str(daemon.socket)
    got = run_nvim(nvim, f"""
        local socket = require('ragd.socket')
        local cases = {{ {lua_cases} }}
        result.paths = {{}}
        for name, e in pairs(cases) do
          e.HOME = {lua_str(str(home))}
          result.paths[name] = socket.path(nil, e)
        end
        result.explicit = socket.path({{ socket = '/x/y.sock' }}, cases.socket_env)
        local results = require('ragd').search({lua_str(QUERY)}, {{ k = 2 }})
        result.found = #results
    """, tmp_path / "nvim", env=env)
    monkeypatch.setenv("HOME", str(home))  # ragd expands ~ with the process's HOME
    for name, case_env in cases.items():
        want = P.socket_path(env=dict(case_env, HOME=str(home)))
        assert got["paths"][name] == str(want), name
    assert got["paths"]["config"] == f"{home}/sock/r.sock"
    assert got["explicit"] == "/x/y.sock"
    assert got["found"] == 2


def test_ragd_command_picks_and_opens_at_the_line(daemon, nvim_name, tmp_path):
    nvim = require_nvim(nvim_name)
    want = daemon.call("search", query=QUERY, k=20)["results"]
    choice = 2
    got = run_nvim(nvim, f"""
        require('ragd').setup({{ socket = {lua_str(str(daemon.socket))}, picker = 'select' }})
        select_choice = {choice}
        vim.cmd('Ragd {QUERY}')
        -- The command returns before the answer: the socket is never waited on.
        result.offered_at_once = offered ~= nil
        wait_for(function() return offered ~= nil end, 10000, 'the picker')
        wait_for(function() return vim.api.nvim_buf_get_name(0) ~= '' end, 5000, 'the file')
        result.offered = offered
        result.file = vim.api.nvim_buf_get_name(0)
        result.line = vim.api.nvim_win_get_cursor(0)[1]
    """, tmp_path / "nvim")
    assert got["offered_at_once"] is False
    assert got["offered"]["prompt"] == f"ragd: {QUERY}"
    assert len(got["offered"]["items"]) == len(want)
    first = want[0]
    assert got["offered"]["items"][0].startswith(first["heading"])
    assert f"{os.path.basename(first['path'])}:{expected_line(first)}" in got["offered"]["items"][0]
    chosen = want[choice - 1]
    assert got["file"] == chosen["path"]
    assert got["line"] == expected_line(chosen)


def test_quickfix_and_status_commands(daemon, nvim_name, tmp_path):
    nvim = require_nvim(nvim_name)
    want = daemon.call("search", query=QUERY, k=7)["results"]
    st = daemon.call("status")
    got = run_nvim(nvim, f"""
        require('ragd').setup({{ socket = {lua_str(str(daemon.socket))}, k = 7 }})
        vim.cmd('RagdQuickfix {QUERY}')
        wait_for(function() return #vim.fn.getqflist() > 0 end, 10000, 'the quickfix list')
        result.title = vim.fn.getqflist({{ title = 1 }}).title
        result.qf = {{}}
        for _, e in ipairs(vim.fn.getqflist()) do
          table.insert(result.qf, {{ file = vim.api.nvim_buf_get_name(e.bufnr), lnum = e.lnum,
                                    text = e.text }})
        end
        result.qf_open = vim.fn.getqflist({{ winid = 1 }}).winid ~= 0
        local n = #notices
        vim.cmd('RagdStatus')
        wait_for(function() return #notices > n end, 10000, 'the status')
        result.status = notices[#notices].msg
    """, tmp_path / "nvim")
    assert got["title"] == f"ragd: {QUERY}"
    assert [(e["file"], e["lnum"]) for e in got["qf"]] == \
        [(r["path"], expected_line(r)) for r in want]
    assert all(e["text"].startswith(r["heading"]) for e, r in zip(got["qf"], want))
    assert got["qf_open"] is True
    files = st["sources"][0]["files"]
    assert got["status"].startswith(f"ragd {st['version']} (pid {st['pid']}): {files} files")


def test_items_for_both_result_shapes(daemon, nvim_name, tmp_path):
    """A chunk-level result from today's daemon, and a note-level one as docs/protocol.md
    describes it (title, more, match_lines, unsaved): the picker's line and where it opens."""
    nvim = require_nvim(nvim_name)
    chunk = daemon.call("search", query=QUERY, k=1, group="chunk")["results"][0]
    chunk.pop("match_lines")  # the oldest shape: a chunk and its line range, no more
    lines = open(chunk["path"], encoding="utf-8").read().split("\n")
    match = next(i for i in range(chunk["line_start"], chunk["line_end"] + 1)
                 if "status" in lines[i - 1].lower() and i > chunk["line_start"])
    note = dict(chunk, title="A title", more=3, match_lines=[match], unsaved=True,
                chunks=[{"line_start": chunk["line_start"], "line_end": chunk["line_end"],
                         "heading": chunk["heading"], "score": chunk["score"]}])
    related = dict(chunk, link={"from": {"line_start": 1, "line_end": 2},
                                "to": {"line_start": match, "line_end": match}})
    got = run_nvim(nvim, f"""
        local items = require('ragd.items')
        local reply = vim.json.decode({lua_str(__import__('json').dumps(
            {"results": [chunk, note, related]}))})
        result.items = {{}}
        for _, it in ipairs(items.from_reply(reply)) do
          it.result = nil
          table.insert(result.items, it)
        end
        require('ragd').open(items.from_reply(reply)[2])
        result.file = vim.api.nvim_buf_get_name(0)
        result.line = vim.api.nvim_win_get_cursor(0)[1]
    """, tmp_path / "nvim")
    c, n, r = got["items"]
    base = os.path.basename(chunk["path"])
    assert c["line"] == chunk["line_start"] and c["title"] == base[:-3]
    assert c["more"] == 0 and c["unsaved"] is False
    assert f"{base}:{chunk['line_start']}" in c["display"]
    assert n["line"] == match and n["title"] == "A title" and n["more"] == 3
    assert n["unsaved"] is True and "[unsaved]" in n["display"] and "(+3)" in n["display"]
    assert n["snippet"] == " ".join(lines[match - 1].split())
    assert r["line"] == match
    assert got["file"] == chunk["path"] and got["line"] == match


def test_not_running_is_one_clear_message(nvim_name, tmp_path):
    nvim = require_nvim(nvim_name)
    sock = tmp_path / "run" / "nothing.sock"
    got = run_nvim(nvim, f"""
        local ragd = require('ragd').setup({{ socket = {lua_str(str(sock))} }})
        local ok, err = pcall(ragd.search, 'anything')
        result.sync = {{ ok = ok, err = err }}
        local done
        ragd.search('anything', {{}}, function(e, results) done = {{ err = e, results = results }} end)
        wait_for(function() return done ~= nil end, 5000, 'the callback')
        result.async = done
        vim.cmd('Ragd anything')
        wait_for(function() return #notices > 0 end, 5000, 'a notice')
        result.command_notices = vim.deepcopy(notices)
    """, tmp_path / "nvim")
    msg = f"ragd: ragd is not running (no daemon at {sock})"
    assert got["sync"] == {"ok": False, "err": msg}
    assert got["async"] == {"err": msg}
    assert [n["msg"] for n in got["command_notices"]] == [msg]


def test_edits_while_not_running_give_one_notice_then_reconnect(make_daemon, nvim_name,
                                                                  tmp_path):
    """Editing a note while ragd is down: one notice however many edits, no error; once ragd
    runs, the plugin's next search reaches it on its own."""
    nvim = require_nvim(nvim_name)
    vault = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "notes", "path": str(vault), "kind": "folder"}])
    note = vault / "Other Plugins" / "Kanban Plugin.md"
    got = run_nvim(nvim, f"""
        local ragd = require('ragd').setup({{ socket = {lua_str(str(d.socket))},
                                              debounce_ms = 20 }})
        vim.cmd('edit ' .. vim.fn.fnameescape({lua_str(str(note))}))
        local buf = vim.api.nvim_get_current_buf()
        for i = 1, 5 do
          vim.api.nvim_buf_set_lines(buf, 0, 0, false, {{ 'edit ' .. i }})
          vim.cmd('doautocmd TextChanged')
          vim.wait(60)
        end
        wait_for(function() return #notices > 0 end, 5000, 'a notice')
        vim.wait(300)
        result.down_notices = vim.deepcopy(notices)
        local ok, err = pcall(ragd.search, 'kanban')
        result.search_down = err
        -- ragd starts now
        vim.fn.jobstart({{ {lua_str(sys.executable)}, '-m', 'ragd', '--config',
                          {lua_str(str(d.config))} }})
        local found
        wait_for(function()
          local ok2, res = pcall(ragd.search, 'kanban', {{ timeout_ms = 2000 }})
          if ok2 then found = res end
          return ok2 and #res > 0
        end, 30000, 'ragd to answer')
        result.found = #found
        ragd.connection():request_sync('stop', nil, 5000)
    """, tmp_path / "nvim")
    down = [n for n in got["down_notices"] if "not running" in n["msg"]]
    assert len(down) == 1 and len(got["down_notices"]) == 1
    assert down[0]["msg"] == (f"ragd: ragd is not running (no daemon at {d.socket}); unsaved "
                              "buffers will be sent when it runs")
    assert got["search_down"] == f"ragd: ragd is not running (no daemon at {d.socket})"
    assert got["found"] > 0


def test_a_daemon_that_does_not_answer_times_out(nvim_name, tmp_path):
    """A socket that accepts and never replies: the call gives up after timeout_ms with a clear
    message instead of hanging the editor."""
    nvim = require_nvim(nvim_name)
    path = tmp_path / "mute.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(4)
    held = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        got = run_nvim(nvim, f"""
            local ragd = require('ragd')
            local t0 = vim.loop.hrtime()
            local ok, err = pcall(ragd.search, 'x', {{ socket = {lua_str(str(path))},
                                                     timeout_ms = 300 }})
            result.ms = (vim.loop.hrtime() - t0) / 1e6
            result.err = err
        """, tmp_path / "nvim")
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        srv.close()
    assert got["err"] == "ragd: search: no answer from ragd within 300 ms"
    assert 250 <= got["ms"] < 5000  # libuv timers count from the loop's cached time


def test_choosing_a_result_keeps_a_modified_buffer(daemon, nvim_name, tmp_path):
    """With 'nohidden' (Neovim 0.7's default) and unsaved changes in the current buffer, the
    result opens in a split instead of failing with E37."""
    nvim = require_nvim(nvim_name)
    want = daemon.call("search", query=QUERY, k=20)["results"][0]
    got = run_nvim(nvim, f"""
        require('ragd').setup({{ socket = {lua_str(str(daemon.socket))}, picker = 'select' }})
        vim.o.hidden = false
        vim.api.nvim_buf_set_lines(0, 0, -1, false, {{ 'unsaved words' }})
        local scratch = vim.api.nvim_get_current_buf()
        vim.cmd('Ragd {QUERY}')
        wait_for(function() return vim.api.nvim_buf_get_name(0) ~= '' end, 10000, 'the file')
        result.file = vim.api.nvim_buf_get_name(0)
        result.line = vim.api.nvim_win_get_cursor(0)[1]
        result.windows = #vim.api.nvim_list_wins()
        result.scratch = vim.api.nvim_buf_get_lines(scratch, 0, -1, false)
    """, tmp_path / "nvim")
    assert got["file"] == want["path"] and got["line"] == expected_line(want)
    assert got["windows"] == 2 and got["scratch"] == ["unsaved words"]
    assert got["notices"] == []


def test_quickfix_says_why_nothing_was_found(daemon, nvim_name, tmp_path):
    """:RagdQuickfix with nothing found gave a bare "nothing found"; it says the daemon's
    reason now, as :Ragd does."""
    nvim = require_nvim(nvim_name)
    query = "xyzzyplugh quuxfrob"
    want = daemon.call("search", query=query, k=20)
    assert want["results"] == [] and want["reason"].startswith("nothing relevant"), want
    got = run_nvim(nvim, f"""
        require('ragd').setup({{ socket = {lua_str(str(daemon.socket))}, picker = 'select' }})
        vim.cmd('RagdQuickfix {query}')
        wait_for(function() return #notices > 0 end, 10000, 'a notice')
        vim.cmd('Ragd {query}')
        wait_for(function() return #notices > 1 end, 10000, 'a second notice')
        result.qf = #vim.fn.getqflist()
        result.offered = offered ~= nil
    """, tmp_path / "nvim")
    said = f'ragd: nothing found for "{query}" ({want["reason"]})'
    assert [n["msg"] for n in got["notices"]] == [said, said]
    assert got["qf"] == 0 and got["offered"] is False


def test_help_ragd_opens_the_plugins_help(nvim_name, tmp_path):
    """`:help ragd` failed with E149: no doc/tags was shipped and no *ragd* tag written. The
    tags ship now, and they are what :helptags makes of the doc as it is (a doc edited without
    making them again fails here)."""
    nvim = require_nvim(nvim_name)
    fresh = tmp_path / "doc"
    shutil.copytree(NVIM_PLUGIN / "doc", fresh)
    (fresh / "tags").unlink()
    topics = ["ragd", ":Ragd", ":RagdQuickfix", ":RagdRelated", "ragd.setup()", "ragd-buffers"]
    got = run_nvim(nvim, f"""
        result.topics = {{}}
        for _, topic in ipairs(vim.json.decode({lua_str(__import__('json').dumps(topics))})) do
          local ok, err = pcall(vim.cmd, 'help ' .. topic)
          result.topics[topic] = ok and {{ file = vim.fn.expand('%:p'),
                                          line = vim.api.nvim_get_current_line() }}
                                    or {{ err = err }}
          if ok then vim.cmd('helpclose') end
        end
        vim.cmd('helptags ' .. vim.fn.fnameescape({lua_str(str(fresh))}))
    """, tmp_path / "nvim")
    for topic in topics:
        where = got["topics"][topic]
        assert where.get("file") == str(NVIM_PLUGIN / "doc" / "ragd.txt"), (topic, where)
        assert f"*{topic}*" in where["line"], (topic, where)
    assert (fresh / "tags").read_text() == (NVIM_PLUGIN / "doc" / "tags").read_text()
