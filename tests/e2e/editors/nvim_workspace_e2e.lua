-- Headless Neovim run of editors/nvim against a real `diffill serve` opened on a project
-- folder (its root found by the plugin's root_markers): waits for the workspace index, then
-- asks for an inline completion and a completion at the end of `row`.
--   $DIFFILL_E2E_CONFIG = JSON { plugin_dir, cmd, settings, file, result, row, timeout_ms }
-- Writes a JSON result; the checks are made by the pytest side.
-- The shared steps (config, result, poll, client): nvim_driver.lua.
local D = dofile(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)) .. '/nvim_driver.lua')
local cfg = D.init({}, 120000)
local R, finish, poll = D.R, D.finish, D.poll

D.setup({ filetypes = { 'python' }, autotrigger = false })

vim.api.nvim_create_autocmd('VimEnter', {
  nested = true,
  callback = function()
    vim.cmd.edit(cfg.file)
    local bufnr = vim.api.nvim_get_current_buf()
    poll('diffill client attached', function()
      return D.client(bufnr)
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
    end, 60000)
  end,
})
