-- ragd for Neovim: commands and the buffer push. :help ragd
if vim.g.loaded_ragd then return end
vim.g.loaded_ragd = true

local function query_then(run)
  return function(a)
    if a.args ~= '' then return run(a.args) end
    vim.ui.input({ prompt = 'ragd: ', default = vim.fn.expand('<cword>') }, function(q)
      if q and q:find('%S') then run(q) end
    end)
  end
end

vim.api.nvim_create_user_command('Ragd', query_then(function(q)
  require('ragd').cmd_search(q)
end), { nargs = '*', desc = 'ragd: search, results in a picker' })

vim.api.nvim_create_user_command('RagdQuickfix', query_then(function(q)
  require('ragd').cmd_quickfix(q)
end), { nargs = '*', desc = 'ragd: search, results in the quickfix list' })

vim.api.nvim_create_user_command('RagdRelated', function()
  require('ragd').cmd_related()
end, { nargs = 0, desc = 'ragd: notes related to this buffer' })

vim.api.nvim_create_user_command('RagdStatus', function()
  require('ragd').cmd_status()
end, { nargs = 0, desc = 'ragd: the daemon\'s state' })

-- Pushing is set up at once but costs nothing until a buffer changes; setup({push = false})
-- turns it off.
require('ragd.buffers').attach_autocmds()
