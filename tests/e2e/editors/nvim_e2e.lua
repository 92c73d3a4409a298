-- Headless Neovim end-to-end run of editors/nvim against a real `diffill serve`.
--   nvim --headless --clean -u nvim_e2e.lua      with $DIFFILL_E2E_CONFIG = path of a JSON file:
--   { plugin_dir, cmd, settings, file, result,
--     completion = { row, col },        -- 0-based row, byte col to insert at
--     ghost = { row, col, type } }      -- insert position, then `type` is typed
-- Writes a JSON result; every check is made by the pytest side. Exit 0 = the run completed.
-- The shared steps (config, result, poll, modes, client): nvim_driver.lua.
local D = dofile(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)) .. '/nvim_driver.lua')
local cfg = D.init({ steps = {} }, 90000)
local R, ms, finish, poll = D.R, D.ms, D.finish, D.poll

vim.o.showmode = false
vim.opt.shortmess:append('c')
vim.o.completeopt = 'menuone,noinsert'
D.setup({ filetypes = { 'python' }, autotrigger = false })
R.inline_module = vim.lsp.inline_completion ~= nil

local bufnr, client

local function line(row)
  return vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1]
end

local function raw(method, row, col, extra)
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(bufnr) },
    position = { line = row, character = vim.str_utfindex(line(row), client.offset_encoding, col, false) },
  }
  for k, v in pairs(extra or {}) do
    params[k] = v
  end
  local res = client:request_sync(method, params, 30000, bufnr)
  return res and res.result, res and res.err
end

local function ghost_extmarks()
  return D.ghost_extmarks(bufnr)
end

-- Answers to inlineCompletion requests received so far (LspRequest "complete" events).
local inline_answers = D.count_inline_completes()

--- Put the buffer back to the original document (sent to the server as a change).
local function restore(k)
  D.to_normal(function()
    vim.api.nvim_buf_set_lines(bufnr, 0, -1, false, R.original)
    k()
  end)
end

-- Step 2: ghost text from textDocument/inlineCompletion, accepted with the plugin's key.
local function ghost_step()
  local g = cfg.ghost
  D.insert_at(g.row, g.col, function()
    local before = line(g.row)
    local typed_at = ms()
    local answers0 = inline_answers()
    vim.api.nvim_feedkeys(g.type, 'nt', false) -- as if typed: TextChangedI fires
    -- The spot has a suggestion (the scripted checkpoint's): wait for it, whatever the timing.
    poll('ghost text', function()
      return #ghost_extmarks() > 0 and require('diffill').suggestion() ~= nil
    end, function()
      R.steps.ghost_ms = ms() - typed_at
      local marks = ghost_extmarks()
      local d = marks[1][4]
      local shown = {}
      for _, chunk in ipairs(d.virt_text or {}) do
        if chunk[2] == 'DiffillGhost' then
          shown[#shown + 1] = chunk[1]
        end
      end
      local shown_lines = { table.concat(shown) }
      for _, vl in ipairs(d.virt_lines or {}) do
        local parts = {}
        for _, chunk in ipairs(vl) do
          if chunk[2] == 'DiffillGhost' then
            parts[#parts + 1] = chunk[1]
          end
        end
        shown_lines[#shown_lines + 1] = table.concat(parts)
      end
      local cur = vim.api.nvim_win_get_cursor(0)
      R.ghost = {
        line_before = before,
        line_typed = line(g.row),
        cursor = { cur[1] - 1, cur[2] },
        extmark = { row = marks[1][2], col = marks[1][3], virt_text_pos = d.virt_text_pos },
        shown = table.concat(shown_lines, '\n'),
        suggestion = require('diffill').suggestion(),
      }
      -- What the server answers at this very position (automatic trigger, like the plugin).
      R.ghost.raw = raw('textDocument/inlineCompletion', cur[1] - 1, cur[2], { context = { triggerKind = 2 } })
      R.ghost.buffer_before_accept = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
      vim.api.nvim_feedkeys(vim.keycode(cfg.accept_key or '<Tab>'), 'mt', false) -- remap: the plugin's mapping
      poll('buffer change after accept', function()
        return require('diffill').suggestion() == nil
          and not vim.deep_equal(vim.api.nvim_buf_get_lines(bufnr, 0, -1, false), R.ghost.buffer_before_accept)
      end, function()
        R.ghost.buffer_after_accept = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
        local c = vim.api.nvim_win_get_cursor(0)
        R.ghost.cursor_after_accept = { c[1] - 1, c[2] }
        R.status = require('diffill').status()
        -- :DiffillToggle pushes enabled=false with workspace/didChangeConfiguration.
        vim.cmd('DiffillToggle')
        poll('toggle reaches the server', function()
          local st = require('diffill').status()
          return st and st.options and st.options.enabled == false
        end, function()
          R.toggled_off = true
          finish(true)
        end, 10000)
      end, 10000)
    end, 90000, function()
      return ('%d inline answers since the keystroke, line %q'):format(inline_answers() - answers0, line(g.row))
    end)
  end)
end

-- Step 1: completion item through vim.lsp.completion, accepted with <C-y>.
local function completion_step()
  local c = cfg.completion
  D.insert_at(c.row, c.col, function()
    R.completion = { line_before = line(c.row) }
    -- The plain request first (what the server answers here); the menu's request below asks
    -- again at the same spot and gets the same answer from the server's typed-ahead cache.
    local cur0 = vim.api.nvim_win_get_cursor(0)
    R.completion.raw = raw('textDocument/completion', cur0[1] - 1, cur0[2], { context = { triggerKind = 1 } })
    if #((R.completion.raw or {}).items or R.completion.raw or {}) == 0 then
      return finish(false, 'the server answered the completion request with no items')
    end
    local t = ms()
    vim.lsp.completion.get() -- what <C-x><C-o> does with the LSP omnifunc
    poll('completion menu', function()
      return #vim.fn.complete_info({ 'items' }).items > 0
    end, function()
      R.steps.completion_menu_ms = ms() - t
      local items = vim.fn.complete_info({ 'items' }).items
      R.completion.menu = vim.tbl_map(function(it)
        local lsp_item = vim.tbl_get(it, 'user_data', 'nvim', 'lsp', 'completion_item') or {}
        return { word = it.word, newText = lsp_item.textEdit and lsp_item.textEdit.newText, label = lsp_item.label }
      end, items)
      local done = false
      vim.api.nvim_create_autocmd('CompleteDone', {
        once = true,
        buffer = bufnr,
        callback = function()
          done = true
        end,
      })
      vim.api.nvim_feedkeys(vim.keycode('<C-y>'), 'n', false) -- accept the selected (first) item
      poll('CompleteDone', function()
        return done and vim.fn.pumvisible() == 0
      end, function()
        vim.defer_fn(function() -- the textEdit is applied right after CompleteDone
          R.completion.line_after = line(c.row)
          R.completion.buffer_after = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
          -- Back to the original document: the ghost text spots refer to it.
          restore(function()
            ghost_step()
          end)
        end, 50)
      end, 10000)
    end, 60000)
  end)
end

vim.api.nvim_create_autocmd('VimEnter', {
  nested = true, -- so that BufRead/FileType (and vim.lsp.enable's autostart) fire
  callback = function()
    vim.cmd.edit(cfg.file)
    bufnr = vim.api.nvim_get_current_buf()
    R.original = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
    R.filetype = vim.bo[bufnr].filetype
    poll('diffill client attached', function()
      return D.client(bufnr)
    end, function(c)
      client = c
      R.steps.attached_ms = ms()
      R.offset_encoding = c.offset_encoding
      R.capabilities = {
        completion = c:supports_method('textDocument/completion'),
        inline = c:supports_method('textDocument/inlineCompletion'),
      }
      D.wait_loaded(function()
        R.steps.loaded_ms = ms()
        if cfg.completion then
          completion_step()
        else
          ghost_step()
        end
      end, 120000)
    end, 60000)
  end,
})
