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
local cfg = vim.json.decode(table.concat(vim.fn.readfile(os.getenv('DIFFILL_E2E_CONFIG')), '\n'))
local R = { files = {} }

local function finish(ok, err)
  R.ok, R.error = ok, err
  vim.fn.writefile({ vim.json.encode(R) }, cfg.result)
  vim.cmd(ok and 'qa!' or 'cq!')
end
vim.defer_fn(function()
  finish(false, 'watchdog timeout')
end, cfg.timeout_ms or 60000)

--- k(v) once cond() is truthy, or k(nil) after `timeout` ms.
local function poll(cond, k, timeout)
  local deadline = vim.uv.now() + timeout
  local function tick()
    local ok, v = pcall(cond)
    if not ok then
      return finish(false, tostring(v))
    end
    if v or vim.uv.now() > deadline then
      local ok2, e = pcall(k, v or nil)
      if not ok2 then
        finish(false, tostring(e))
      end
      return
    end
    vim.defer_fn(tick, 50)
  end
  tick()
end

vim.o.swapfile = false
vim.opt.rtp:prepend(cfg.plugin_dir)
local opts = { cmd = cfg.cmd, settings = cfg.settings }
if cfg.filetypes ~= nil then
  opts.filetypes = cfg.filetypes
end
require('diffill').setup(opts)
R.resolved = vim.lsp.config.diffill.filetypes or vim.NIL
R.module = require('diffill').filetypes() or vim.NIL

local function attached(bufnr)
  local c = vim.lsp.get_clients({ bufnr = bufnr, name = 'diffill' })[1]
  return c and c.initialized and c
end

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
  poll(function()
    return attached(bufnr)
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
