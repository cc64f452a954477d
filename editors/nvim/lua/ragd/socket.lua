-- Where ragd's socket is, found the way ragctl finds it (docs/protocol.md, "Finding the
-- socket"): opts.socket, $RAGD_SOCKET, the [daemon] table of ragd's config file, else
-- $XDG_RUNTIME_DIR/ragd/ragd.sock, else <data_dir>/ragd.sock.
-- NOTE: keep in step with ragd/protocol.py socket_path() and editors/obsidian/src/socket.ts.

local M = {}

local function getenv(env, name)
  local v
  if env then v = env[name] else v = vim.env[name] end
  if v == nil or v == '' then return nil end
  return v
end

local function is_abs(p)
  return type(p) == 'string' and p:sub(1, 1) == '/'
end

local function expand(p)
  if p:sub(1, 2) == '~/' or p == '~' then
    return (vim.loop.os_homedir() or '') .. p:sub(2)
  end
  return p
end

local function home(env)
  return getenv(env, 'HOME') or vim.loop.os_homedir() or ''
end

local function xdg(env, name, fallback)
  local v = getenv(env, name)
  if v and is_abs(v) then return v end
  return home(env) .. '/' .. fallback
end

-- The config file ragd reads: $RAGD_CONFIG, else $XDG_CONFIG_HOME/ragd/config.toml.
function M.config_file(env)
  local cfg = getenv(env, 'RAGD_CONFIG')
  if cfg then return expand(cfg) end
  return xdg(env, 'XDG_CONFIG_HOME', '.config') .. '/ragd/config.toml'
end

-- A TOML string value: "basic" (with the common escapes) or 'literal'.
local function toml_string(v)
  local s = v:match('^"(.*)"%s*$') or v:match('^"(.*)"%s*#')
  if s then
    return (s:gsub('\\(.)', { ['\\'] = '\\', ['"'] = '"', n = '\n', t = '\t' }))
  end
  return v:match("^'(.*)'%s*$") or v:match("^'(.-)'%s*#")
end

-- Only the two keys of the [daemon] table that decide the socket; the rest of the file is
-- ragd's business.
function M.read_daemon_table(path)
  local f = io.open(path, 'r')
  if not f then return {} end
  local out, in_daemon = {}, false
  for line in f:lines() do
    local header = line:match('^%s*%[([^%]]*)%]')
    if header then
      in_daemon = vim.trim(header) == 'daemon'
    elseif in_daemon then
      local key, value = line:match('^%s*([%w_]+)%s*=%s*(.-)%s*$')
      if (key == 'socket' or key == 'data_dir') and value then
        out[key] = toml_string(value)
      end
    end
  end
  f:close()
  return out
end

-- opts: { socket = path } ; env: a table standing for the environment (tests), default vim.env.
function M.path(opts, env)
  if opts and opts.socket and opts.socket ~= '' then return expand(opts.socket) end
  local s = getenv(env, 'RAGD_SOCKET')
  if s then return expand(s) end
  local daemon = M.read_daemon_table(M.config_file(env))
  if daemon.socket and daemon.socket ~= '' then return expand(daemon.socket) end
  local runtime = getenv(env, 'XDG_RUNTIME_DIR')
  if runtime and is_abs(runtime) then return runtime .. '/ragd/ragd.sock' end
  local data_dir
  if daemon.data_dir and daemon.data_dir ~= '' then
    data_dir = expand(daemon.data_dir)
  else
    data_dir = xdg(env, 'XDG_DATA_HOME', '.local/share') .. '/ragd'
  end
  return data_dir .. '/ragd.sock'
end

return M
