-- Runs one test script in a headless Neovim (tests/editors.py starts it): the script's
-- globals `result` (a table) and the notices it saw are written as JSON to $RAGD_TEST_OUT,
-- then Neovim quits. A failing script writes {"error": traceback}: it never leaves Neovim
-- waiting for input.

local out_path = os.getenv('RAGD_TEST_OUT')
local script = os.getenv('RAGD_TEST_SCRIPT')

notices = {}
vim.notify = function(msg, level)
  table.insert(notices, { msg = msg, level = level or vim.log.levels.INFO })
end

-- vim.ui.select as a person would use it: remember what was offered, choose `select_choice`
-- (1-based; nil: dismiss).
offered = nil
select_choice = 1
vim.ui.select = function(list, opts, on_choice)
  offered = { prompt = opts.prompt, items = {} }
  for _, it in ipairs(list) do table.insert(offered.items, opts.format_item(it)) end
  vim.schedule(function()
    on_choice(select_choice and list[select_choice] or nil, select_choice)
  end)
end

-- Wait (running the event loop) until cond() holds; fail after ms.
function wait_for(cond, ms, what)
  if not vim.wait(ms or 10000, cond, 10) then
    error('timed out waiting for ' .. (what or 'a condition'), 2)
  end
end

result = {}

local function write(t)
  local f = assert(io.open(out_path, 'w'))
  f:write(vim.json.encode(t))
  f:close()
end

local ok, err = xpcall(function() dofile(script) end, debug.traceback)
if ok then
  result.notices = notices
  write({ result = result })
  vim.cmd('qall!')
else
  write({ error = tostring(err), notices = notices })
  vim.cmd('cquit! 1')
end
