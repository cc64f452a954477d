-- What a picker or the quickfix list shows for a reply: one item per result, with the line to
-- jump to. Both result shapes are handled (docs/protocol.md; note-level results add title,
-- more, chunks, match_lines, unsaved), and so are related results (link.to).

local M = {}

local function basename(path)
  return (path:gsub('/+$', ''):match('[^/]+$')) or path
end

function M.title(r)
  if type(r.title) == 'string' and r.title ~= '' then return r.title end
  return (basename(r.path or ''):gsub('%.md$', ''))
end

-- The line a result should open at: the first line holding the query's terms when the daemon
-- says which, else the start of its passage (of the related part, for related results).
function M.line(r)
  if type(r.match_lines) == 'table' and type(r.match_lines[1]) == 'number' then
    return r.match_lines[1]
  end
  local link = r.link
  if type(link) == 'table' and type(link.to) == 'table' and type(link.to.line_start) == 'number' then
    return link.to.line_start
  end
  return r.line_start or 1
end

-- The text of line `line` of the result's passage, trimmed, or its first non-blank line.
function M.snippet(r, line)
  local text = type(r.text) == 'string' and r.text or ''
  local lines = vim.split(text, '\n', { plain = true })
  local wanted = lines[(line or 0) - (r.line_start or 1) + 1]
  if not wanted or not wanted:find('%S') then
    wanted = nil
    for _, l in ipairs(lines) do
      if l:find('%S') then wanted = l break end
    end
  end
  wanted = vim.trim(wanted or ''):gsub('%s+', ' ')
  if #wanted > 160 then wanted = wanted:sub(1, 157) .. '...' end
  return wanted
end

function M.short_path(path)
  return vim.fn.fnamemodify(path, ':~:.')
end

function M.from_result(r)
  local line = M.line(r)
  local label = (type(r.heading) == 'string' and r.heading ~= '') and r.heading or M.title(r)
  local it = {
    path = r.path,
    line = line,
    title = M.title(r),
    heading = label,
    snippet = M.snippet(r, line),
    more = type(r.more) == 'number' and r.more or 0,
    unsaved = r.unsaved == true,
    stale = r.stale == true,
    score = r.score,
    result = r,
  }
  local extra = ''
  if it.more > 0 then extra = extra .. ' (+' .. it.more .. ')' end
  if it.unsaved then extra = extra .. ' [unsaved]' end
  it.display = string.format('%s%s  %s:%d  %s', label, extra, M.short_path(r.path or ''), line,
    it.snippet)
  return it
end

function M.from_reply(reply)
  local out = {}
  for _, r in ipairs((reply and reply.results) or {}) do
    if type(r) == 'table' and type(r.path) == 'string' then
      table.insert(out, M.from_result(r))
    end
  end
  return out
end

function M.qf_entry(it)
  local text = it.heading
  if it.snippet ~= '' then text = text .. ': ' .. it.snippet end
  if it.unsaved then text = text .. ' [unsaved]' end
  return { filename = it.path, lnum = it.line, col = 1, text = text }
end

return M
