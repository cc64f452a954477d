-- ragd for Neovim: search your notes from the editor, and let ragd see unsaved buffers.
-- :help ragd ; the wire protocol is docs/protocol.md of the ragd repository.

local client = require('ragd.client')
local items = require('ragd.items')
local socket = require('ragd.socket')

local M = {}

M.defaults = {
  socket = nil,        -- the socket path; default: as ragctl finds it ($RAGD_SOCKET, ...)
  k = 20,              -- results per search
  mode = nil,          -- 'hybrid' | 'vector' | 'bm25'; default: the daemon's
  timeout_ms = 10000,  -- for one request
  picker = 'auto',     -- 'auto' (telescope, else fzf-lua, else vim.ui.select) or one of them
  push = true,         -- push modified buffers of source files (buffer_set)
  debounce_ms = 300,   -- quiet time after the last change before a push
  related_k = 10,
  open_quickfix = true, -- :RagdQuickfix opens the quickfix window
}

M.config = vim.deepcopy(M.defaults)

function M.setup(opts)
  M.config = vim.tbl_extend('force', vim.deepcopy(M.defaults), opts or {})
  M.reset()
  return M
end

-- Connections, one per socket path: long-lived, so that buffers pushed on one stay (they
-- belong to the connection, docs/protocol.md) and a search costs no connect.
local conns = {}

function M.socket_path(opts)
  return socket.path({ socket = (opts and opts.socket) or M.config.socket })
end

function M.connection(opts)
  local path = M.socket_path(opts)
  local c = conns[path]
  if not c then
    c = client.new(path)
    conns[path] = c
    for _, fn in ipairs(M._on_new_connection) do fn(c) end
  end
  return c
end

M._on_new_connection = {}

-- Close every connection (their buffers are dropped by ragd).
function M.reset()
  for path, c in pairs(conns) do
    c:close()
    conns[path] = nil
  end
end

local function search_args(query, opts)
  local args = { query = query, k = opts.k or M.config.k }
  local mode = opts.mode or M.config.mode
  if mode then args.mode = mode end
  if opts.sources then args.sources = opts.sources end
  return args
end

-- Call `op` asynchronously (cb given: cb(err, result) on the main loop, returns nothing) or
-- synchronously (no cb: returns the result, raises a clear message on error).
local function call(op, args, opts, cb)
  local c = M.connection(opts)
  local timeout = opts.timeout_ms or M.config.timeout_ms
  if cb then
    c:request(op, args, cb, { timeout_ms = timeout })
    return
  end
  local e, result = c:request_sync(op, args, timeout)
  if e then error(client.message(e), 0) end
  return result
end

--- Search ragd. opts: socket, k, mode, timeout_ms, sources.
--- Without a callback: returns the results table (a list of results, see docs/protocol.md)
--- and the whole reply; raises an error with a clear message (e.g. "ragd: ragd is not
--- running (no daemon at ...)"). With a callback: returns at once, and calls
--- callback(err, results, reply) later, err being nil or a message.
function M.search(query, opts, callback)
  opts = opts or {}
  if type(query) ~= 'string' or not query:find('%S') then
    local msg = 'ragd: nothing to search for'
    if callback then return callback(msg, nil, nil) end
    error(msg, 0)
  end
  local args = search_args(query, opts)
  if callback then
    call('search', args, opts, function(e, reply)
      if e then return callback(client.message(e), nil, nil) end
      callback(nil, reply.results or {}, reply)
    end)
    return
  end
  local reply = call('search', args, opts)
  return reply.results or {}, reply
end

-- The notes related to a buffer: by its path when ragd indexes the file (the buffer's unsaved
-- text is what ragd sees, once pushed), else (not_found: not a file of a source) by its text.
local function related_async(bufnr, opts, cb)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local k = opts.k or M.config.related_k
  local buffers = require('ragd.buffers')
  local c = M.connection(opts)
  local timeout = opts.timeout_ms or M.config.timeout_ms
  local function by_text()
    c:request('related', { text = buffers.text(bufnr), k = k }, cb, { timeout_ms = timeout })
  end
  local path = buffers.source_path(bufnr, c)
  if not path then return by_text() end
  c:request('related', { path = path, k = k }, function(e, reply)
    if e and e.code == 'not_found' and vim.api.nvim_buf_is_valid(bufnr) then return by_text() end
    cb(e, reply)
  end, { timeout_ms = timeout })
end

local function op_message(op, e)
  if e.code == 'unknown_op' then
    return 'ragd: this ragd has no "' .. op .. '" op yet; update ragd'
  end
  return client.message(e)
end

--- Notes related to a buffer (default: the current one); opts: socket, k, timeout_ms. Same
--- conventions as search(): without a callback returns the results table and the reply.
function M.related(bufnr, opts, callback)
  opts = opts or {}
  if callback then
    related_async(bufnr, opts, function(e, reply)
      if e then return callback(op_message('related', e), nil, nil) end
      callback(nil, reply.results or {}, reply)
    end)
    return
  end
  local done, e, reply = false, nil, nil
  related_async(bufnr, opts, function(e_, r_) done, e, reply = true, e_, r_ end)
  vim.wait((opts.timeout_ms or M.config.timeout_ms) * 2 + 1000, function() return done end, 5)
  if not done then error('ragd: related: no answer', 0) end
  if e then error(op_message('related', e), 0) end
  return reply.results or {}, reply
end

--- ragd's status (the reply of the status op). Same conventions as search().
function M.status(opts, callback)
  opts = opts or {}
  if callback then return call('status', nil, opts, callback) end
  return call('status', nil, opts)
end

-- A one-line summary of a status reply, for :RagdStatus.
function M.status_line(st)
  local n, chunks = 0, 0
  for _, s in ipairs(st.sources or {}) do
    n = n + (s.files or 0)
    chunks = chunks + (s.chunks or 0)
  end
  local parts = { string.format('ragd %s (pid %s): %d files, %d chunks', st.version or '?',
    tostring(st.pid), n, chunks) }
  if (st.pending or 0) > 0 or st.indexer == 'indexing' then
    table.insert(parts, 'indexing ' .. (st.pending or 0))
  end
  local e = st.engines and st.engines.embedding
  if e then
    if e.state ~= 'ready' then
      table.insert(parts, 'degraded: embedding engine ' .. tostring(e.state))
    elseif type(e.pending_texts) == 'number' and e.pending_texts > 0 then
      local done = e.vectors or 0
      table.insert(parts, string.format('embedding %d%%',
        math.floor(100 * done / (done + e.pending_texts))))
    end
  end
  return table.concat(parts, ', ')
end

--- Open a result (an item of items.from_reply, or a raw result) at its line.
function M.open(it)
  if it.result == nil then it = items.from_result(it) end
  local path = it.path
  local buf = vim.fn.bufnr(path)
  -- Leaving a modified buffer needs 'hidden' (off by default before Neovim 0.9): else split.
  local split = vim.bo.modified and not vim.o.hidden and vim.bo.bufhidden == ''
  if buf ~= -1 and buf == vim.api.nvim_get_current_buf() then
    vim.cmd("normal! m'")
  elseif buf ~= -1 and vim.api.nvim_buf_is_loaded(buf) then
    vim.cmd((split and 'sbuffer ' or 'buffer ') .. buf)
  else
    vim.cmd((split and 'split ' or 'edit ') .. vim.fn.fnameescape(path))
  end
  local last = vim.api.nvim_buf_line_count(0)
  local line = math.max(1, math.min(it.line or 1, last))
  vim.api.nvim_win_set_cursor(0, { line, 0 })
  vim.cmd('normal! zv')
  vim.cmd('normal! zz')
end

M.items = items

function M.quickfix(list, title)
  local entries = {}
  for _, it in ipairs(list) do table.insert(entries, items.qf_entry(it)) end
  vim.fn.setqflist({}, ' ', { title = title, items = entries })
end

local function notify_err(msg)
  vim.notify(msg, vim.log.levels.ERROR)
end

-- The commands, asynchronous: the editor never waits on the socket.

-- What to say when a reply has no results: the daemon's reason when it gives one (nothing
-- relevant and why, the filters, no vectors yet), so the notice is not a bare "nothing".
local function nothing(what, reply)
  local why = type(reply) == 'table' and reply.reason
  vim.notify('ragd: ' .. what .. (type(why) == 'string' and (' (' .. why .. ')') or ''),
    vim.log.levels.INFO)
end

function M.cmd_search(query)
  M.search(query, {}, function(e, _, reply)
    if e then return notify_err(e) end
    local list = items.from_reply(reply)
    if #list == 0 then return nothing('nothing found for "' .. query .. '"', reply) end
    require('ragd.pickers').pick(list, 'ragd: ' .. query, M.open, M.config.picker)
  end)
end

function M.cmd_quickfix(query)
  M.search(query, {}, function(e, _, reply)
    if e then return notify_err(e) end
    local list = items.from_reply(reply)
    M.quickfix(list, 'ragd: ' .. query)
    if #list == 0 then
      nothing('nothing found for "' .. query .. '"', reply)
    elseif M.config.open_quickfix then
      vim.cmd('botright copen')
    end
  end)
end

function M.cmd_related()
  local buf = vim.api.nvim_get_current_buf()
  local name = vim.fn.fnamemodify(vim.api.nvim_buf_get_name(buf), ':t')
  if name == '' then name = 'this buffer' end  -- (an unnamed one)
  -- First push the buffer as it is now, so the related notes are those of what is on screen.
  require('ragd.buffers').flush(buf, function()
    M.related(buf, {}, function(e, _, reply)
      if e then return notify_err(e) end
      local list = items.from_reply(reply)
      if #list == 0 then return nothing('no related notes for ' .. name, reply) end
      require('ragd.pickers').pick(list, 'ragd: related to ' .. name, M.open, M.config.picker)
    end)
  end)
end

function M.cmd_status()
  M.status({}, function(e, st)
    if e then return notify_err(client.message(e)) end
    vim.notify(M.status_line(st), vim.log.levels.INFO)
  end)
end

return M
