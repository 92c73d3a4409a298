-- Headless Neovim run of editors/nvim with no `filetypes` option of the user's (issue 27):
-- which buffers the diffill client attaches to.
--   nvim --headless --clean -u nvim_languages_e2e.lua   with $DIFFILL_E2E_CONFIG = JSON:
--   { plugin_dir, cmd, settings, result, timeout_ms,
--     filetypes,                    -- absent: setup() without it (the default); else passed
--     attach = [path, ...],         -- opened in turn: each must get the diffill client
--     skip = [path, ...] }          -- opened last: recorded whether diffill attached
-- Records the filetypes vim.lsp.config resolved for diffill, require('diffill').filetypes(),
-- and per opened file its 'filetype' and whether an initialized diffill client is attached.
-- The checks are made by the pytest side.
-- The shared steps (config, result, poll, client): nvim_driver.lua.
local D = dofile(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)) .. '/nvim_driver.lua')
local cfg = D.init({ files = {} }, 60000)
local R, finish = D.R, D.finish

local opts = {}
if cfg.filetypes ~= nil then
  opts.filetypes = cfg.filetypes
end
D.setup(opts)
R.resolved = vim.lsp.config.diffill.filetypes or vim.NIL
R.module = require('diffill').filetypes() or vim.NIL

local queue = {}
for _, f in ipairs(cfg.attach or {}) do
  queue[#queue + 1] = { path = f, wait_ms = 60000 }
end
for _, f in ipairs(cfg.skip or {}) do
  queue[#queue + 1] = { path = f, wait_ms = 1500 } -- long enough for a client to attach
end

local function open_next(i)
  local item = queue[i]
  if not item then
    return finish(true)
  end
  vim.cmd.edit(item.path)
  local bufnr = vim.api.nvim_get_current_buf()
  D.poll_soft('diffill client attached to ' .. item.path, function()
    return D.client(bufnr)
  end, function(c)
    R.files[#R.files + 1] = {
      path = item.path,
      filetype = vim.bo[bufnr].filetype,
      attached = c ~= nil,
      inline = c ~= nil and c:supports_method('textDocument/inlineCompletion') or false,
      clients = #vim.lsp.get_clients({ name = 'diffill' }),
    }
    open_next(i + 1)
  end, item.wait_ms)
end

vim.api.nvim_create_autocmd('VimEnter', {
  nested = true,
  callback = function()
    open_next(1)
  end,
})
