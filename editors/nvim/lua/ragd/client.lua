-- One connection to ragd over its Unix socket, speaking JSON lines (docs/protocol.md).
-- Everything here is asynchronous (libuv): callbacks run on the main loop via vim.schedule,
-- never inside a libuv callback, so they may call any Neovim API.

local uv = vim.uv or vim.loop

local M = {}

local Conn = {}
Conn.__index = Conn

-- An error is a table {code = str, message = str}: the daemon's codes (docs/protocol.md), or
-- one of these from the client side.
M.NOT_RUNNING = 'not_running'   -- no socket, or nothing accepts on it
M.TIMEOUT = 'timeout'           -- no reply within timeout_ms
M.DISCONNECTED = 'disconnected' -- the connection closed before the reply came
M.IO = 'io'                     -- any other socket error (e.g. permission denied)

local function err(code, message)
  return { code = code, message = message }
end

-- A one-line message for a person, "ragd: ..." once.
function M.message(e)
  if type(e) ~= 'table' then return 'ragd: ' .. tostring(e) end
  if e.code == M.NOT_RUNNING or e.code == M.TIMEOUT or e.code == M.DISCONNECTED
      or e.code == M.IO then
    return 'ragd: ' .. e.message
  end
  return 'ragd: ' .. tostring(e.message) .. ' (' .. tostring(e.code) .. ')'
end

function M.new(path)
  return setmetatable({
    path = path,
    state = 'closed', -- closed | connecting | open
    pipe = nil,
    buf = '',
    next_id = 0,
    pending = {},  -- id -> {cb = fn, timer = uv timer, partial = fn|nil}
    waiting = {},  -- lines to write once connected
    listeners = {}, -- fn(event) with event 'open' | 'close'
  }, Conn)
end

function Conn:on(fn)
  table.insert(self.listeners, fn)
end

function Conn:_emit(event, detail)
  for _, fn in ipairs(self.listeners) do
    local ok, e = pcall(fn, event, detail)
    if not ok then vim.notify('ragd: ' .. tostring(e), vim.log.levels.ERROR) end
  end
end

local function stop_timer(t)
  if t and not t:is_closing() then
    t:stop()
    t:close()
  end
end

-- Fail every request still waiting, and forget the pipe. Runs on the main loop.
function Conn:_closed(e)
  if self.state == 'closed' then return end
  self.state = 'closed'
  if self.pipe and not self.pipe:is_closing() then self.pipe:close() end
  self.pipe = nil
  self.buf = ''
  self.waiting = {}
  local pending = self.pending
  self.pending = {}
  for _, p in pairs(pending) do
    stop_timer(p.timer)
    p.cb(e, nil)
  end
  self:_emit('close', e)
end

function Conn:_dispatch(line)
  local ok, msg = pcall(vim.json.decode, line, { luanil = { object = true, array = true } })
  if not ok or type(msg) ~= 'table' then
    vim.notify('ragd: undecodable reply: ' .. line:sub(1, 200), vim.log.levels.WARN)
    return
  end
  local p = self.pending[msg.id]
  if not p then
    -- A reply to a request that timed out, or id null: the daemon could not read the request.
    if msg.id == nil and msg.error then
      vim.notify(M.message(msg.error), vim.log.levels.WARN)
    end
    return
  end
  if msg.final == false and msg.error == nil then
    if p.partial then p.partial(msg.result) end
    return
  end
  self.pending[msg.id] = nil
  stop_timer(p.timer)
  if msg.error then
    local e = msg.error
    p.cb(err(e.code or 'internal', e.message or ''), nil)
  else
    p.cb(nil, msg.result)
  end
end

function Conn:_read(chunk)
  self.buf = self.buf .. chunk
  while true do
    local nl = self.buf:find('\n', 1, true)
    if not nl then break end
    local line = self.buf:sub(1, nl - 1)
    self.buf = self.buf:sub(nl + 1)
    if line:find('%S') then self:_dispatch(line) end
  end
end

function Conn:connect()
  if self.state ~= 'closed' then return end
  self.state = 'connecting'
  local pipe = uv.new_pipe(false)
  self.pipe = pipe
  pipe:connect(self.path, function(cerr)
    vim.schedule(function()
      if self.pipe ~= pipe then return end -- closed meanwhile
      if cerr then
        local code = M.IO
        local msg = 'cannot connect to ' .. self.path .. ': ' .. cerr
        if cerr:match('ENOENT') or cerr:match('ECONNREFUSED') or cerr:match('ENOTSOCK') then
          code = M.NOT_RUNNING
          msg = 'ragd is not running (no daemon at ' .. self.path .. ')'
        end
        self:_closed(err(code, msg))
        return
      end
      self.state = 'open'
      pipe:read_start(function(rerr, chunk)
        vim.schedule(function()
          if self.pipe ~= pipe then return end
          if rerr or not chunk then
            self:_closed(err(M.DISCONNECTED, 'ragd closed the connection'
              .. (rerr and (' (' .. rerr .. ')') or '') .. '; is it still running?'))
          else
            self:_read(chunk)
          end
        end)
      end)
      local waiting = self.waiting
      self.waiting = {}
      for _, line in ipairs(waiting) do self:_write(line) end
      self:_emit('open')
    end)
  end)
end

function Conn:_write(line)
  local pipe = self.pipe
  pipe:write(line, function(werr)
    if werr then
      vim.schedule(function()
        if self.pipe == pipe then
          self:_closed(err(M.DISCONNECTED, 'lost the connection to ragd (' .. werr .. ')'))
        end
      end)
    end
  end)
end

-- Send a request; cb(err, result) runs once on the main loop. opts: timeout_ms (default 10000;
-- 0 for none), partial (fn(result) for the replies of a stream before its final one).
-- Returns the request id.
function Conn:request(op, args, cb, opts)
  opts = opts or {}
  self.next_id = self.next_id + 1
  local id = self.next_id
  local msg = { id = id, op = op }
  if args and next(args) ~= nil then msg.args = args end
  local line = vim.json.encode(msg) .. '\n'
  local p = { cb = cb, partial = opts.partial }
  self.pending[id] = p
  local timeout = opts.timeout_ms or 10000
  if timeout > 0 then
    p.timer = uv.new_timer()
    p.timer:start(timeout, 0, function()
      vim.schedule(function()
        if self.pending[id] == p then
          self.pending[id] = nil
          stop_timer(p.timer)
          cb(err(M.TIMEOUT, op .. ': no answer from ragd within ' .. timeout .. ' ms'), nil)
        end
      end)
    end)
  end
  if self.state == 'open' then
    self:_write(line)
  else
    table.insert(self.waiting, line)
    self:connect()
  end
  return id
end

function Conn:close()
  self:_closed(err(M.DISCONNECTED, 'connection closed by the plugin'))
end

function Conn:is_open()
  return self.state == 'open'
end

-- Block (running the event loop, so the UI and other callbacks go on) until cb would have run;
-- returns err, result. For the synchronous Lua API only; commands use the callback form.
function Conn:request_sync(op, args, timeout_ms)
  local done, e, r = false, nil, nil
  self:request(op, args, function(err_, res)
    done, e, r = true, err_, res
  end, { timeout_ms = timeout_ms })
  vim.wait((timeout_ms or 10000) + 1000, function() return done end, 5)
  if not done then
    return err(M.TIMEOUT, op .. ': no answer from ragd within ' .. (timeout_ms or 10000) .. ' ms')
  end
  return e, r
end

return M
