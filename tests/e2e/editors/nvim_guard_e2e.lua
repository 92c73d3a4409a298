-- Headless Neovim run of editors/nvim against a real `diffill serve` (issue 27): ghost text in
-- TypeScript and Go buffers, shown where the suggestion fits and withheld where it would break
-- the file (the server's syntax guard).
--   nvim --headless --clean -u nvim_guard_e2e.lua   with $DIFFILL_E2E_CONFIG = JSON:
--   { plugin_dir, cmd, settings, result, timeout_ms,
--     quiet_ms,                      -- how long a withheld case watches for ghost text
--     cases = [ { name, file, expect = 'shown'|'withheld',
--                 lines,             -- the buffer before the keystroke
--                 row, col,          -- 0-based row, byte col where `type` is typed
--                 type } ] }         -- typed in Insert mode (TextChangedI: the plugin asks)
-- Every textDocument/inlineCompletion request the plugin makes goes through a wrapper of the
-- client's `request` that records what was sent and what came back (and whether the plugin's
-- handler saw the buffer as it was when it asked, i.e. did not drop the answer as stale), and
-- how many ghost extmarks the buffer holds right after the plugin handled the answer.
-- Per case it records those answers, the LspRequest "complete" events, the buffer, and the
-- ghost extmarks. The checks are made by the pytest side.
-- The shared steps (config, result, poll, after, modes, client): nvim_driver.lua.
local D = dofile(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)) .. '/nvim_driver.lua')
local cfg = D.init({ cases = {}, steps = {} }, 60000)
local R, ms, finish, poll, after = D.R, D.ms, D.finish, D.poll, D.after
local api = vim.api

vim.o.hidden = true
vim.o.showmode = false
vim.opt.shortmess:append('c')
D.setup({ autotrigger = false })
local ghost_extmarks = D.ghost_extmarks

--- The ghost text an extmark shows (its DiffillGhost chunks; virtual lines joined by \n).
local function shown_text(mark)
  local d = mark[4]
  local function ghost(chunks)
    local parts = {}
    for _, chunk in ipairs(chunks or {}) do
      if chunk[2] == 'DiffillGhost' then
        parts[#parts + 1] = chunk[1]
      end
    end
    return table.concat(parts)
  end
  local lines = { ghost(d.virt_text) }
  for _, vl in ipairs(d.virt_lines or {}) do
    lines[#lines + 1] = ghost(vl)
  end
  return table.concat(lines, '\n')
end

-- Every inlineCompletion request of the plugin and its answer, in order.
local answers = {}
-- LspRequest "complete" events of inlineCompletion (the client saw the reply; Neovim's own count).
local completes = D.count_inline_completes()

local function item_texts(result)
  local texts = {}
  for _, it in ipairs(type(result) == 'table' and (result.items or result) or {}) do
    local t = it.insertText
    texts[#texts + 1] = type(t) == 'table' and (t.value or '') or (t or '')
  end
  return texts
end

--- Wrap client:request (the plugin calls it as a method, so an instance field wins over the
--- class's) to record the plugin's inlineCompletion requests and their answers.
local function instrument(client)
  if client._diffill_guard_e2e then
    return
  end
  client._diffill_guard_e2e = true
  local orig = client.request
  client.request = function(self, method, params, handler, bufnr)
    if method ~= 'textDocument/inlineCompletion' or type(handler) ~= 'function' then
      return orig(self, method, params, handler, bufnr)
    end
    local b = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
    local rec = {
      position = vim.deepcopy(params.position),
      trigger = params.context and params.context.triggerKind,
      file = api.nvim_buf_get_name(b),
      tick = api.nvim_buf_get_changedtick(b),
      cursor = api.nvim_win_get_cursor(0),
      sent_ms = ms(),
    }
    answers[#answers + 1] = rec
    return orig(self, method, params, function(err, result, ctx)
      rec.answered_ms = ms()
      rec.err = err and (err.message or tostring(err.code)) or nil
      rec.texts = item_texts(result)
      rec.n_items = #rec.texts
      -- What the plugin's handler checks before it shows anything: nothing moved since the ask.
      rec.fresh = api.nvim_buf_get_changedtick(b) == rec.tick
        and vim.deep_equal(api.nvim_win_get_cursor(0), rec.cursor)
        and vim.startswith(api.nvim_get_mode().mode, 'i')
      handler(err, result, ctx)
      rec.handled = true
      rec.marks_after = #ghost_extmarks(b)
    end, bufnr)
  end
end

api.nvim_create_autocmd('LspAttach', {
  callback = function(ev)
    local c = vim.lsp.get_client_by_id(ev.data.client_id)
    if c and c.name == 'diffill' then
      instrument(c)
    end
  end,
})

local function attached(bufnr)
  local c = D.client(bufnr)
  return c and c._diffill_guard_e2e and c
end

local loaded = false

--- Open `file` (once per file), wait for the diffill client and, the first time, the model.
local function open(file, k)
  if api.nvim_buf_get_name(0) ~= vim.fn.fnamemodify(file, ':p') then
    vim.cmd.edit(file)
  end
  local bufnr = api.nvim_get_current_buf()
  poll('diffill client attached to ' .. file, function()
    return attached(bufnr)
  end, function(c)
    if loaded then
      return k(bufnr, c)
    end
    R.steps.attached_ms = ms()
    D.wait_loaded(function()
      loaded = true
      R.steps.loaded_ms = ms()
      k(bufnr, c)
    end, 60000)
  end, 30000)
end

local function run_case(i)
  local case = cfg.cases[i]
  if not case then
    return finish(true)
  end
  D.to_normal(function()
    open(case.file, function(bufnr, c)
      api.nvim_buf_set_lines(bufnr, 0, -1, false, case.lines)
      D.insert_at(case.row, case.col, function()
        local out = { name = case.name, expect = case.expect, filetype = vim.bo[bufnr].filetype }
        R.cases[#R.cases + 1] = out
        local mark, completes0, typed_at = #answers, completes(), ms()
        local want = { line = case.row, character = case.col + #case.type } -- ASCII buffers
        api.nvim_feedkeys(case.type, 'nt', false) -- as if typed: TextChangedI fires
        --- The answer to a request made for the buffer as typed, handled by the plugin.
        local function final_answer()
          for j = #answers, mark + 1, -1 do
            local a = answers[j]
            if a.handled and not a.err and a.tick == api.nvim_buf_get_changedtick(bufnr)
              and vim.deep_equal(a.position, want) then
              return a
            end
          end
        end
        local function record(a)
          local cur = api.nvim_win_get_cursor(0)
          out.cursor = { cur[1] - 1, cur[2] }
          out.want_position = want
          out.buffer = api.nvim_buf_get_lines(bufnr, 0, -1, false)
          out.answer = a
          out.answers = vim.list_slice(answers, mark + 1)
          out.completes = completes() - completes0
          out.client_id = c.id
          out.clients = #vim.lsp.get_clients({ name = 'diffill' })
          local marks = ghost_extmarks(bufnr)
          out.marks = #marks
          out.shown = marks[1] and shown_text(marks[1]) or vim.NIL
          out.extmark = marks[1] and { row = marks[1][2], col = marks[1][3], virt_text_pos = marks[1][4].virt_text_pos }
            or vim.NIL
          out.suggestion = require('diffill').suggestion() or vim.NIL
          out.visible = require('diffill').visible()
          out.ms = ms() - typed_at
        end
        poll(case.name .. ': the answer to the request after the keystroke', final_answer, function(a)
          if case.expect == 'shown' then
            poll(case.name .. ': ghost text', function()
              return #ghost_extmarks(bufnr) > 0 and require('diffill').suggestion() ~= nil
            end, function()
              record(a)
              run_case(i + 1)
            end, 5000)
          else
            -- Withheld: nothing may appear, now or a little later (no late or second answer).
            local marks_now = #ghost_extmarks(bufnr)
            after(cfg.quiet_ms or 500, case.name .. ': quiet period', function()
              record(a)
              out.marks_at_answer = marks_now
              run_case(i + 1)
            end)
          end
        end, 60000, function()
          return ('%d requests since the keystroke, %d answered; line %q'):format(
            #answers - mark, completes() - completes0, api.nvim_get_current_line())
        end)
      end)
    end)
  end)
end

api.nvim_create_autocmd('VimEnter', {
  nested = true, -- so that BufRead/FileType (and vim.lsp.enable's autostart) fire
  callback = function()
    run_case(1)
  end,
})
