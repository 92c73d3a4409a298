-- Headless Neovim run of editors/nvim under Neovim's DEFAULT settings (issue 31): no
-- 'completeopt' of our own, the plugin's default `autotrigger`, 'notermguicolors', and a
-- server whose model load is held (DIFFILL_DEBUG_LOAD_DELAY_MS) so typing starts while it
-- loads.
--   nvim --headless --clean -u nvim_defaults_e2e.lua   with $DIFFILL_E2E_CONFIG = JSON:
--   { plugin_dir, cmd, settings, file, result,
--     ghost = { row, col, type },       -- typed right after the file opens (model loading)
--     trigger = { row, col, type } }    -- a trigger character typed where the menu opens
-- Steps (each records what it saw; the pytest side checks):
-- 1. `ghost`: type `ghost.type` at once, then no other key: ghost text must come by itself;
--    its extmark, the cursor's window column and the highlight are recorded.
-- 2. `enter`/`typing`: type the trigger character, wait for the completion answer, then
--    <CR> (or one more character): the lines are recorded.
-- 3. `status`: the output of :DiffillStatus and :DiffillStatus!.
-- The shared steps (config, result, poll, after, modes, client): nvim_driver.lua.
local D = dofile(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)) .. '/nvim_driver.lua')
local cfg = D.init({ steps = {} }, 90000)
local R, ms, finish, poll_soft, after = D.R, D.ms, D.finish, D.poll_soft, D.after
local insert_at, to_normal = D.insert_at, D.to_normal

vim.o.termguicolors = false -- a 256-colour terminal (tmux without truecolor)
R.completeopt_global = vim.o.completeopt
D.setup({ filetypes = { 'python' } })

local bufnr, client

local function line(row)
  return vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1]
end

local function lines()
  return vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
end

local function ghost_extmarks()
  return D.ghost_extmarks(bufnr)
end

-- Requests sent and answered, per method (LspRequest events).
local sent, answered = {}, {}
vim.api.nvim_create_autocmd('LspRequest', {
  callback = function(ev)
    local req = ev.data and ev.data.request
    if req and req.type == 'pending' then
      sent[req.method] = (sent[req.method] or 0) + 1
    elseif req and req.type == 'complete' then
      answered[req.method] = (answered[req.method] or 0) + 1
    end
  end,
})

local function capture(cmd)
  local ok, out = pcall(vim.api.nvim_exec2, cmd, { output = true })
  return ok and out.output or ('error: ' .. tostring(out))
end

local function status_step()
  R.status = { summary = capture('DiffillStatus'), full = capture('DiffillStatus!') }
  R.status.raw = require('diffill').status()
  finish(true)
end

--- Type the trigger character, wait for the completion answer, then `key`; record lines.
local function trigger_step(name, key, k)
  local t = cfg.trigger
  vim.api.nvim_buf_set_lines(bufnr, 0, -1, false, R.original)
  vim.api.nvim_buf_set_lines(bufnr, t.row, t.row + 1, false, { t.line })
  insert_at(t.row, #t.line, function()
    local n0 = answered['textDocument/completion'] or 0
    local s = { sent0 = sent['textDocument/completion'] or 0 }
    R[name] = s
    vim.api.nvim_feedkeys(t.type, 'nt', false) -- typed: InsertCharPre -> autotrigger
    poll_soft('completion answer', function()
      return (answered['textDocument/completion'] or 0) > n0
    end, function(v)
      s.answered = v ~= nil
      after(300, 'the menu', function() -- the menu (if any) is drawn by now
        s.pum = vim.fn.pumvisible()
        s.selected = vim.fn.complete_info({ 'selected' }).selected
        s.completeopt = vim.bo[bufnr].completeopt
        s.line_with_menu = line(t.row)
        local cur = vim.api.nvim_win_get_cursor(0)
        local res = client:request_sync('textDocument/completion', {
          textDocument = { uri = vim.uri_from_bufnr(bufnr) },
          position = { line = cur[1] - 1, character = cur[2] },
          context = { triggerKind = 2, triggerCharacter = t.type },
        }, 30000, bufnr)
        local items = res and res.result and (res.result.items or res.result) or {}
        s.items = vim.tbl_map(function(it)
          return it.textEdit and it.textEdit.newText or it.insertText or it.label
        end, items)
        vim.api.nvim_feedkeys(vim.keycode(key), 'nt', false)
        after(400, 'the key', function()
          s.lines = vim.api.nvim_buf_get_lines(bufnr, t.row, t.row + 2, false)
          to_normal(k)
        end)
      end)
    end, 30000)
  end)
end

local function ghost_step()
  local g = cfg.ghost
  insert_at(g.row, g.col, function()
    local st = require('diffill').status() or {}
    R.ghost = { loading_when_typed = st.loading == true and st.loaded ~= true, sent0 = sent['textDocument/inlineCompletion'] or 0 }
    local typed_at = ms()
    vim.api.nvim_feedkeys(g.type, 'nt', false) -- the one keystroke
    poll_soft('ghost text', function()
      return #ghost_extmarks() > 0 and require('diffill').suggestion() ~= nil
    end, function(v)
      R.ghost.shown = v ~= nil
      R.ghost.ms = ms() - typed_at
      R.ghost.inline_sent = (sent['textDocument/inlineCompletion'] or 0) - R.ghost.sent0
      R.ghost.suggestion = require('diffill').suggestion()
      local cur = vim.api.nvim_win_get_cursor(0)
      R.ghost.cursor = { cur[1] - 1, cur[2] }
      local mark = ghost_extmarks()[1]
      if mark then
        R.ghost.extmark = { row = mark[2], col = mark[3], virt_text_pos = mark[4].virt_text_pos,
          right_gravity = mark[4].right_gravity }
      end
      vim.cmd('redraw')
      -- Where the cursor is drawn: its window column, and screenpos()'s cursor column of the
      -- character at the cursor (both count inline virtual text drawn before the cursor).
      R.ghost.wincol = vim.fn.wincol()
      R.ghost.curscol = vim.fn.screenpos(0, cur[1], cur[2] + 1).curscol
      R.ghost.insert_col = vim.fn.strdisplaywidth(line(cur[1] - 1):sub(1, cur[2])) + 1
      R.ghost.termguicolors = vim.o.termguicolors
      R.ghost.hl = vim.api.nvim_get_hl(0, { name = 'DiffillGhost', link = false })
      R.ghost.hint_hl = vim.api.nvim_get_hl(0, { name = 'DiffillGhostHint', link = false })
      R.ghost.normal_hl = vim.api.nvim_get_hl(0, { name = 'Normal', link = false })
      R.ghost.buffer = lines()
      to_normal(function()
        trigger_step('enter', '<CR>', function()
          trigger_step('typing', 'x', status_step)
        end)
      end)
    end, cfg.ghost_timeout_ms or 30000)
  end)
end

vim.api.nvim_create_autocmd('VimEnter', {
  nested = true,
  callback = function()
    vim.cmd.edit(cfg.file)
    bufnr = vim.api.nvim_get_current_buf()
    R.original = lines()
    D.poll('diffill client attached', function()
      return D.client(bufnr)
    end, function(c)
      client = c
      R.steps.attached_ms = ms()
      ghost_step() -- at once: the model is still loading
    end, 60000)
  end,
})
