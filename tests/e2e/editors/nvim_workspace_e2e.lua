-- Headless Neovim run of editors/nvim against a real `diffill serve` opened on a project
-- folder (its root found by the plugin's root_markers): waits for the workspace index, then
-- asks for an inline completion and a completion at the end of `row`.
--   $DIFFILL_E2E_CONFIG = JSON { plugin_dir, cmd, settings, file, result, row, timeout_ms }
-- Writes a JSON result; the checks are made by the pytest side.
local cfg = vim.json.decode(table.concat(vim.fn.readfile(os.getenv('DIFFILL_E2E_CONFIG')), '\n'))
local R = {}

local function finish(ok, err)
  R.ok, R.error = ok, err
  vim.fn.writefile({ vim.json.encode(R) }, cfg.result)
  vim.cmd(ok and 'qa!' or 'cq!')
end
vim.defer_fn(function()
  finish(false, 'watchdog timeout')
end, cfg.timeout_ms or 120000)

local function poll(what, cond, k, timeout)
  local deadline = vim.uv.now() + (timeout or 60000)
  local function tick()
    local ok, v = pcall(cond)
    if not ok then
      return finish(false, what .. ': ' .. tostring(v))
    end
    if v then
      local ok2, e = pcall(k, v)
      if not ok2 then
        finish(false, what .. ' (continuation): ' .. tostring(e))
      end
      return
    end
    if vim.uv.now() > deadline then
      return finish(false, 'timeout waiting for ' .. what)
    end
    vim.defer_fn(tick, 50)
  end
  tick()
end

vim.o.swapfile = false
vim.opt.rtp:prepend(cfg.plugin_dir)
require('diffill').setup({ cmd = cfg.cmd, filetypes = { 'python' }, settings = cfg.settings,
                           autotrigger = false })

vim.api.nvim_create_autocmd('VimEnter', {
  nested = true,
  callback = function()
    vim.cmd.edit(cfg.file)
    local bufnr = vim.api.nvim_get_current_buf()
    poll('diffill client attached', function()
      local c = vim.lsp.get_clients({ bufnr = bufnr, name = 'diffill' })[1]
      return c and c.initialized and c
    end, function(client)
      R.root_dir = client.config.root_dir
      poll('model loaded and workspace indexed', function()
        local res = client:request_sync('diffill/status', vim.empty_dict(), 10000, bufnr)
        local st = res and res.result
        if st and st.error ~= vim.NIL and st.error ~= nil then
          error('model failed to load: ' .. tostring(st.error))
        end
        return st and st.loaded == true and st.workspace.state == 'ready' and st
      end, function(st)
        R.workspace = st.workspace
        local text = vim.api.nvim_buf_get_lines(bufnr, cfg.row, cfg.row + 1, false)[1]
        local pos = { line = cfg.row,
                      character = vim.str_utfindex(text, client.offset_encoding, #text, false) }
        local doc = { uri = vim.uri_from_bufnr(bufnr) }
        local inl = client:request_sync('textDocument/inlineCompletion', {
          textDocument = doc, position = pos, context = { triggerKind = 1 } }, 30000, bufnr)
        R.inline = inl and inl.result
        local comp = client:request_sync('textDocument/completion', {
          textDocument = doc, position = pos }, 30000, bufnr)
        R.completion = comp and comp.result
        local after = client:request_sync('diffill/status', vim.empty_dict(), 10000, bufnr)
        R.last_context = after and after.result and after.result.last_context
        finish(true)
      end, 100000)
    end)
  end,
})
