"""WAITS ON THE DAEMON: the editor plugins' use of buffer_set, buffer_drop and related.

These ops (and note-level results) are being built on main (spec: /work/notes/editor-ops.md,
to be folded into docs/protocol.md). The plugin code that uses them is done and these tests
are written against the spec; until the daemon has the ops, every test here fails (the
daemon answers unknown_op). Nothing here is skipped or softened: they are meant to pass as
they are once the ops land.
"""

from __future__ import annotations

import sys

import pytest

from conftest import bulk_embedding_stopped, engine_config, ragctl, small_vault, wait_embedded
from editors import expected_line, lua_str, require_nvim, run_nvim
from test_editor_obsidian import daemon_env, node_tests, run_node  # noqa: F401 (a fixture)

NVIMS = pytest.mark.parametrize("nvim_name", ["nvim0.7", "nvim-current"])
KANBAN = "Other Plugins/Kanban Plugin.md"
STATUSES = "How To/Set up custom statuses.md"


@pytest.fixture
def engine_daemon(make_daemon, tmp_path):
    vault = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "notes", "path": str(vault), "kind": "folder"}],
                    extra=engine_config())
    with d:
        wait_embedded(d)
        d.vault = vault
        yield d


# Lua shared by the Neovim tests: edit the open buffer, wait for the push (or its error).
NVIM_EDIT = """
local buffers = require('ragd.buffers')
local function edit(lines_at_end)
  local buf = vim.api.nvim_get_current_buf()
  vim.api.nvim_buf_set_lines(buf, -1, -1, false, lines_at_end)
  vim.cmd('doautocmd TextChanged')
end
local function pushed(buf)
  local st
  wait_for(function()
    st = buffers.state(buf)
    return st and (st.pushed and st.version == vim.api.nvim_buf_get_changedtick(buf) or st.error
                   or st.skip)
  end, 10000, 'the push')
  if st.error then error('buffer_set failed: ' .. st.error.code .. ': ' .. st.error.message) end
  if st.skip then error('not pushed: ' .. st.skip) end
  return st
end
"""


# ----- Neovim ---------------------------------------------------------------------------------

@NVIMS
def test_nvim_pushes_a_modified_buffer_and_drops_it_on_save(daemon, nvim_name, tmp_path):
    nvim = require_nvim(nvim_name)
    note = daemon.vault / KANBAN
    n_lines = len(note.read_text().split("\n")) - 1
    got = run_nvim(nvim, NVIM_EDIT + f"""
        local ragd = require('ragd').setup({{ socket = {lua_str(str(daemon.socket))},
                                              debounce_ms = 20 }})
        vim.cmd('edit ' .. vim.fn.fnameescape({lua_str(str(note))}))
        edit({{ '', 'The zyxquokka grazes by the board.' }})
        local st = pushed(vim.api.nvim_get_current_buf())
        result.chunks = st.chunks
        local results = ragd.search('zyxquokka', {{ k = 3 }})
        result.unsaved = results
        vim.cmd('write')
        wait_for(function() return not buffers.state(vim.api.nvim_get_current_buf()).pushed end,
                 5000, 'the drop')
        result.notices = notices
    """, tmp_path / "nvim")
    assert got["chunks"] >= 1
    top = got["unsaved"][0]
    assert top["path"] == str(note) and top["unsaved"] is True
    assert expected_line(top) == n_lines + 2
    assert got["notices"] == []
    # Saved: ragd reads it from disk now, the same text.
    daemon.wait_idle()
    hits = daemon.call("search", query="zyxquokka", k=3)["results"]
    assert hits[0]["path"] == str(note) and not hits[0].get("unsaved")


@NVIMS
def test_nvim_drops_a_buffer_when_closed_or_back_to_saved(daemon, nvim_name, tmp_path):
    nvim = require_nvim(nvim_name)
    note = daemon.vault / KANBAN
    got = run_nvim(nvim, NVIM_EDIT + f"""
        local ragd = require('ragd').setup({{ socket = {lua_str(str(daemon.socket))},
                                              debounce_ms = 20 }})
        vim.cmd('edit ' .. vim.fn.fnameescape({lua_str(str(note))}))
        local buf = vim.api.nvim_get_current_buf()
        edit({{ 'The wombatqx naps.' }})
        pushed(buf)
        result.while_modified = #ragd.search('wombatqx', {{ k = 3 }})
        vim.cmd('silent undo')  -- back to the text on disk: no longer modified
        vim.cmd('doautocmd TextChanged')
        wait_for(function() return not buffers.state(buf).pushed end, 5000, 'the drop')
        result.after_undo = #ragd.search('wombatqx', {{ k = 3 }})
        edit({{ 'The wombatqx naps again.' }})
        pushed(buf)
        vim.cmd('bwipeout!')
        vim.wait(200)
        result.after_close = #ragd.search('wombatqx', {{ k = 3 }})
    """, tmp_path / "nvim")
    assert got == {"while_modified": 1, "after_undo": 0, "after_close": 0, "notices": []}


@NVIMS
def test_nvim_pushes_again_after_ragd_restarts(daemon, nvim_name, tmp_path):
    nvim = require_nvim(nvim_name)
    note = daemon.vault / KANBAN
    got = run_nvim(nvim, NVIM_EDIT + f"""
        local ragd = require('ragd').setup({{ socket = {lua_str(str(daemon.socket))},
                                              debounce_ms = 20 }})
        vim.cmd('edit ' .. vim.fn.fnameescape({lua_str(str(note))}))
        local buf = vim.api.nvim_get_current_buf()
        edit({{ 'The platypusqz swims.' }})
        pushed(buf)
        ragd.connection():request_sync('stop', nil, 5000)
        wait_for(function() return not buffers.state(buf).pushed end, 10000, 'ragd to go')
        vim.fn.jobstart({{ {lua_str(sys.executable)}, '-m', 'ragd', '--config',
                          {lua_str(str(daemon.config))} }})
        -- No keystroke: the plugin retries on its own and pushes the buffer again.
        wait_for(function() return buffers.state(buf).pushed end, 60000, 'the push again')
        local r = ragd.search('platypusqz', {{ k = 3 }})
        result.path = r[1] and r[1].path
        result.unsaved = r[1] and r[1].unsaved
        ragd.connection():request_sync('stop', nil, 5000)
    """, tmp_path / "nvim")
    assert got["path"] == str(note) and got["unsaved"] is True


@NVIMS
def test_nvim_related_command(engine_daemon, nvim_name, tmp_path):
    nvim = require_nvim(nvim_name)
    d = engine_daemon
    note = d.vault / STATUSES
    want = d.call("related", path=str(note), k=10)["results"]
    got = run_nvim(nvim, f"""
        require('ragd').setup({{ socket = {lua_str(str(d.socket))}, picker = 'select',
                                 timeout_ms = 30000 }})
        vim.cmd('edit ' .. vim.fn.fnameescape({lua_str(str(note))}))
        select_choice = 1
        vim.cmd('RagdRelated')
        wait_for(function() return offered ~= nil end, 30000, 'the picker')
        wait_for(function() return vim.api.nvim_buf_get_name(0) ~= {lua_str(str(note))} end,
                 5000, 'the related note')
        result.offered = offered
        result.file = vim.api.nvim_buf_get_name(0)
        result.line = vim.api.nvim_win_get_cursor(0)[1]
        -- A buffer with no file: related by its text.
        vim.cmd('enew')
        vim.api.nvim_buf_set_lines(0, 0, -1, false,
          {{ 'How do I define my own task statuses, with custom symbols and names?' }})
        local results = require('ragd').related(0, {{ k = 5 }})
        result.scratch = results
    """, tmp_path / "nvim")
    assert got["offered"]["prompt"] == "ragd: related to Set up custom statuses.md"
    assert len(got["offered"]["items"]) == len(want) > 0
    assert all(r["path"] != str(note) for r in want)
    assert got["file"] == want[0]["path"] and got["line"] == expected_line(want[0])
    assert len(got["scratch"]) > 0


@pytest.fixture
def pending_note(make_daemon, tmp_path):
    """A daemon with the embedding engine and a note whose vectors are still to come: a
    source added while the bulk embedding engine is stopped. Yields (daemon, note)."""
    vault = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "notes", "path": str(vault), "kind": "folder"}],
                    extra=engine_config())
    d.vault = vault
    other = tmp_path / "Docs2"
    other.mkdir()
    note = other / "Lighthouse.md"
    note.write_text("# Lighthouse\n\nThe keeper cleans the lamp every Tuesday.\n")
    with d:
        d.wait_idle()
        with bulk_embedding_stopped(d):
            r = ragctl("--config", d.config, "sources", "add", str(other))
            assert r.returncode == 0, r.stderr
            d.wait_idle()
            want = d.call("related", path=str(note), k=5)
            assert want["results"] == [] and want["reason"], want
            yield d, note
        # The engine goes on (SIGCONT) with the batch it held, and ragd's stop waits for that
        # batch: on a busy machine longer than the 10 s the daemon fixture's own stop allows.
        d.stop(120)


@NVIMS
def test_nvim_related_says_why_there_is_nothing(pending_note, nvim_name, tmp_path):
    """:RagdRelated on a note whose vectors are still to come said "no related notes" and
    dropped the daemon's reason ("no vectors for this note yet")."""
    nvim = require_nvim(nvim_name)
    d, note = pending_note
    reason = d.call("related", path=str(note), k=5)["reason"]
    got = run_nvim(nvim, f"""
        require('ragd').setup({{ socket = {lua_str(str(d.socket))}, picker = 'select',
                                 timeout_ms = 30000 }})
        vim.cmd('edit ' .. vim.fn.fnameescape({lua_str(str(note))}))
        vim.cmd('RagdRelated')
        wait_for(function() return #notices > 0 end, 30000, 'a notice')
        result.offered = offered ~= nil
    """, tmp_path / "nvim")
    assert [n["msg"] for n in got["notices"]] == [
        f"ragd: no related notes for Lighthouse.md ({reason})"]
    assert got["offered"] is False


# ----- Obsidian -------------------------------------------------------------------------------

def test_obsidian_buffers(daemon, node_tests):  # noqa: F811
    run_node(node_tests, "new-ops-buffers.test.mjs", daemon_env(daemon))


def test_obsidian_related(engine_daemon, node_tests):  # noqa: F811
    run_node(node_tests, "new-ops-related.test.mjs", daemon_env(engine_daemon), timeout=300)


def test_obsidian_related_pane_says_why_there_is_nothing(pending_note, node_tests):  # noqa: F811
    """The pane said "No related notes." and dropped the daemon's reason."""
    d, note = pending_note
    run_node(node_tests, "related-pending.test.mjs", daemon_env(d, {"note": str(note)}))
