-- Unsaved buffers of source files, pushed to ragd (buffer_set) so that searches and related
-- notes see what is on screen; dropped (buffer_drop) on save and close. ragd keeps a buffer
-- only while the connection that pushed it is open, so after a reconnect every modified
-- buffer is pushed again.

local uv = vim.uv or vim.loop
local client = require('ragd.client')

local M = {}

-- Larger texts are not pushed: far above any note, and a JSON line must stay under ragd's
-- 8 MiB frame limit (docs/protocol.md) whatever the escaping.
M.MAX_BYTES = 2 * 1024 * 1024

local states = {} -- bufnr -> {path, version, pushed, chunks, skip, error, conn}
local timers = {} -- bufnr -> uv timer (the debounce)
local outage = { notified = false, delay = 0, timer = nil }

local function ragd() return require('ragd') end
local function config() return ragd().config end

function M.state(bufnr)
  return states[bufnr]
end

-- The buffer's text as it would be written (line endings, final newline), so that a buffer
-- equal to its file is recognised as saved.
function M.text(bufnr)
  local lines = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
  local nl = vim.bo[bufnr].fileformat == 'dos' and '\r\n' or '\n'
  local text = table.concat(lines, nl)
  if vim.bo[bufnr].eol or vim.bo[bufnr].fixeol then text = text .. nl end
  return text
end

local function file_path(bufnr)
  if not vim.api.nvim_buf_is_valid(bufnr) or vim.bo[bufnr].buftype ~= '' then return nil end
  local name = vim.api.nvim_buf_get_name(bufnr)
  if name == '' or name:match('^%a[%w+.-]*://') then return nil end -- unnamed, or a URL
  return vim.fn.fnamemodify(name, ':p')
end

local function realpath(path)
  local real = uv.fs_realpath(path)
  if real then return real end
  local dir = uv.fs_realpath(vim.fn.fnamemodify(path, ':h'))
  return dir and (dir .. '/' .. vim.fn.fnamemodify(path, ':t')) or path
end

local function under(path, root)
  root = root:gsub('/+$', '')
  return path == root or path:sub(1, #root + 1) == root .. '/'
end

-- The buffer's absolute path when it lies inside one of ragd's sources, as far as this
-- connection knows them (nil before they are known: callers then let ragd decide).
function M.source_path(bufnr, conn)
  local path = file_path(bufnr)
  if not path then return nil end
  local roots = conn and conn._ragd_sources
  if roots == nil then return path end
  local real = realpath(path)
  for _, root in ipairs(roots) do
    if under(path, root) or under(real, root) then return path end
  end
  return nil
end

local function notify_once_per_outage(msg)
  if outage.notified then return end
  outage.notified = true
  vim.notify(msg, vim.log.levels.WARN)
end

local function stop_timer(t)
  if t and not t:is_closing() then t:stop() t:close() end
end

-- ragd is not reachable: say so once, and try again with a growing delay while there are
-- modified buffers to push.
local function schedule_retry(e)
  if e and e.code == client.NOT_RUNNING then
    notify_once_per_outage(client.message(e) .. '; unsaved buffers will be sent when it runs')
  end
  outage.delay = math.min(math.max(outage.delay * 2, 1000), 30000)
  if outage.timer then return end
  outage.timer = uv.new_timer()
  outage.timer:start(outage.delay, 0, vim.schedule_wrap(function()
    stop_timer(outage.timer)
    outage.timer = nil
    M.push_all()
  end))
end

local function reachable()
  outage.notified = false
  outage.delay = 0
end

-- The sources' roots, once per connection.
local function with_sources(conn, cb)
  if conn._ragd_sources ~= nil then return cb(nil) end
  conn:request('sources', nil, function(e, list)
    if e then return cb(e) end
    local roots = {}
    for _, s in ipairs(list or {}) do
      if type(s.path) == 'string' then
        table.insert(roots, s.path)
        local real = uv.fs_realpath(s.path)
        if real and real ~= s.path then table.insert(roots, real) end
      end
    end
    conn._ragd_sources = roots
    cb(nil)
  end, { timeout_ms = config().timeout_ms })
end

local function watch(conn)
  if conn._ragd_watched then return end
  conn._ragd_watched = true
  conn:on(function(event)
    if event ~= 'close' then return end
    -- ragd forgets this connection's buffers with it; the sources may have changed too.
    conn._ragd_sources = nil
    conn._ragd_unsupported = nil
    local again = false
    for bufnr, st in pairs(states) do
      if st.conn == conn then
        st.pushed, st.version, st.conn = false, nil, nil
        if vim.api.nvim_buf_is_valid(bufnr) and vim.bo[bufnr].modified then again = true end
      end
    end
    if again then schedule_retry(nil) end
  end)
end

local function drop(bufnr, st, cb)
  local conn = st.conn
  st.pushed, st.version, st.conn = false, nil, nil
  if not conn or not conn:is_open() then return cb and cb() end
  conn:request('buffer_drop', { path = st.path }, function(e)
    if e then st.error = e end
    if cb then cb() end
  end, { timeout_ms = config().timeout_ms })
end

local function handle_error(bufnr, st, conn, e)
  st.error = e
  local code = e.code
  if code == client.NOT_RUNNING or code == client.IO or code == client.DISCONNECTED
      or code == client.TIMEOUT then
    schedule_retry(e)
  elseif code == 'unknown_op' then
    -- An older ragd: no unsaved buffers on this connection; searches still work.
    conn._ragd_unsupported = true
    vim.notify('ragd: this ragd cannot take unsaved buffers (no buffer_set op; update ragd); '
      .. 'searches see saved files only', vim.log.levels.INFO)
  elseif code == 'not_found' or code == 'bad_args' or code == 'forbidden' then
    st.skip = e.message -- not a file of a source, or too large: not pushed again
  else
    -- unavailable (too many buffers), shutting_down, internal: tried again on the next change
  end
end

-- Push the buffer now if it differs from what ragd has; drop it if it is no longer modified.
-- cb() runs when done (whatever happened; M.state(bufnr) tells).
function M.push(bufnr, cb)
  cb = cb or function() end
  local path = file_path(bufnr)
  local st = states[bufnr]
  if st and st.path ~= path then -- renamed
    if st.pushed then drop(bufnr, st) end
    st = nil
  end
  if not path then states[bufnr] = nil return cb() end
  if not st then
    st = { path = path, pushed = false }
    states[bufnr] = st
  end
  if st.skip then return cb() end
  if not vim.bo[bufnr].modified then
    if st.pushed then return drop(bufnr, st, cb) end
    return cb()
  end
  local conn = ragd().connection()
  watch(conn)
  if conn._ragd_unsupported then return cb() end
  local version = vim.api.nvim_buf_get_changedtick(bufnr)
  if st.pushed and st.version == version and st.conn == conn then return cb() end
  with_sources(conn, function(e)
    if e then
      handle_error(bufnr, st, conn, e)
      return cb()
    end
    if not vim.api.nvim_buf_is_valid(bufnr) then return cb() end
    if not M.source_path(bufnr, conn) then
      st.skip = 'not in a source of ragd'
      return cb()
    end
    local text = M.text(bufnr)
    if #text > M.MAX_BYTES then
      st.skip = 'larger than ' .. M.MAX_BYTES .. ' bytes'
      return cb()
    end
    version = vim.api.nvim_buf_get_changedtick(bufnr)
    conn:request('buffer_set', { path = path, text = text, version = version },
      function(e2, result)
        if e2 then
          handle_error(bufnr, st, conn, e2)
          return cb()
        end
        reachable()
        st.error = nil
        st.pushed, st.version, st.conn = true, version, conn
        st.chunks = result and result.chunks
        cb()
      end, { timeout_ms = config().timeout_ms })
  end)
end

-- Every modified buffer of a file, pushed (after a reconnect, or once ragd runs again).
function M.push_all()
  for _, bufnr in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(bufnr) and vim.bo[bufnr].modified and file_path(bufnr) then
      local st = states[bufnr]
      if not (st and st.skip) then M.push(bufnr) end
    end
  end
end

-- A change: push once the buffer has been quiet for debounce_ms.
function M.changed(bufnr)
  if not config().push or not file_path(bufnr) then return end
  local st = states[bufnr]
  if st and st.skip then return end
  local t = timers[bufnr]
  if not t then
    t = uv.new_timer()
    timers[bufnr] = t
  end
  t:stop()
  t:start(config().debounce_ms, 0, vim.schedule_wrap(function()
    if vim.api.nvim_buf_is_valid(bufnr) then M.push(bufnr) end
  end))
end

-- Push now what a pending debounce would push later, then cb().
function M.flush(bufnr, cb)
  local t = timers[bufnr]
  if t then t:stop() end
  if not config().push then return cb() end
  M.push(bufnr, cb)
end

-- Saved: the file on disk is the text now, ragd reads it from there.
function M.saved(bufnr)
  local t = timers[bufnr]
  if t then t:stop() end
  local st = states[bufnr]
  if not st then return end
  st.skip = nil -- a buffer saved under a new name, or a file that now exists, gets a new chance
  if st.pushed then drop(bufnr, st) end
end

function M.closed(bufnr)
  stop_timer(timers[bufnr])
  timers[bufnr] = nil
  local st = states[bufnr]
  states[bufnr] = nil
  if st and st.pushed then drop(bufnr, st) end
end

function M.attach_autocmds()
  local group = vim.api.nvim_create_augroup('ragd_buffers', { clear = true })
  vim.api.nvim_create_autocmd({ 'TextChanged', 'TextChangedI' }, {
    group = group,
    callback = function(a) M.changed(a.buf) end,
  })
  vim.api.nvim_create_autocmd('BufWritePost', {
    group = group,
    callback = function(a) M.saved(a.buf) end,
  })
  vim.api.nvim_create_autocmd({ 'BufUnload', 'BufDelete' }, {
    group = group,
    callback = function(a) M.closed(a.buf) end,
  })
  vim.api.nvim_create_autocmd('BufFilePost', {
    group = group,
    callback = function(a) M.closed(a.buf) M.changed(a.buf) end,
  })
end

return M
