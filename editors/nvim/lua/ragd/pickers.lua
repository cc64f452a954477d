-- Choosing a result: telescope or fzf-lua when installed, else vim.ui.select (which a UI
-- plugin such as dressing.nvim may draw).

local M = {}

local function select(list, title, on_choice)
  vim.ui.select(list, {
    prompt = title,
    kind = 'ragd',
    format_item = function(it) return it.display end,
  }, function(choice)
    if choice then on_choice(choice) end
  end)
end

local function telescope(list, title, on_choice)
  local pickers = require('telescope.pickers')
  local finders = require('telescope.finders')
  local conf = require('telescope.config').values
  local actions = require('telescope.actions')
  local state = require('telescope.actions.state')
  pickers.new({}, {
    prompt_title = title,
    finder = finders.new_table({
      results = list,
      entry_maker = function(it)
        return { value = it, display = it.display, ordinal = it.display, filename = it.path,
          lnum = it.line }
      end,
    }),
    sorter = conf.generic_sorter({}),
    previewer = conf.grep_previewer({}),
    attach_mappings = function(bufnr)
      actions.select_default:replace(function()
        local entry = state.get_selected_entry()
        actions.close(bufnr)
        if entry then on_choice(entry.value) end
      end)
      return true
    end,
  }):find()
end

local function fzf_lua(list, title, on_choice)
  local fzf = require('fzf-lua')
  -- Entries start with path:line: so that fzf-lua's builtin previewer shows the line.
  local by_entry, entries = {}, {}
  for i, it in ipairs(list) do
    local entry = string.format('%s:%d:1:%d %s', it.path, it.line, i, it.display)
    by_entry[entry] = it
    table.insert(entries, entry)
  end
  fzf.fzf_exec(entries, {
    prompt = title .. '> ',
    previewer = 'builtin',
    fzf_opts = { ['--delimiter'] = ':', ['--with-nth'] = '4..' },
    actions = {
      ['default'] = function(selected)
        local it = selected and by_entry[selected[1]]
        if it then on_choice(it) end
      end,
    },
  })
end

M.backends = { telescope = telescope, ['fzf-lua'] = fzf_lua, select = select }

function M.available(name)
  if name == 'select' then return true end
  local mod = name == 'telescope' and 'telescope.pickers' or name
  return (pcall(require, mod))
end

-- Show list (items from ragd.items) with `title`; on_choice(item) when one is chosen.
-- which: 'auto' | 'telescope' | 'fzf-lua' | 'select'.
function M.pick(list, title, on_choice, which)
  which = which or 'auto'
  if which == 'auto' then
    which = 'select'
    for _, name in ipairs({ 'telescope', 'fzf-lua' }) do
      if M.available(name) then which = name break end
    end
  end
  local backend = M.backends[which]
  if not backend then
    vim.notify('ragd: unknown picker ' .. tostring(which) .. '; using vim.ui.select',
      vim.log.levels.WARN)
    backend = select
  end
  backend(list, title, on_choice)
end

return M
