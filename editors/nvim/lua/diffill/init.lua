--- diffill for Neovim (0.11+): the `diffill serve` language server through the built-in client.
---
--- * completion items through `vim.lsp.completion` (menu, <C-y> accepts);
--- * ghost text from `textDocument/inlineCompletion`: Neovim 0.12+ draws it itself
---   (`vim.lsp.inline_completion`), on 0.11 this module draws it with extmarks
---   (inline virtual text for the first line, virtual lines for the rest).
---
--- See `:help diffill`.
local M = {}

local api = vim.api
local ns = api.nvim_create_namespace('diffill.ghost')
local NAME = 'diffill'

--- @class diffill.Keymaps
--- @field accept string|false  accept the ghost text (falls back to the key itself when none)
--- @field next string|false    show the next candidate
--- @field prev string|false    show the previous candidate
--- @field dismiss string|false hide the ghost text

--- @class diffill.Config
--- @field cmd string[]               server command line
--- @field filetypes string[]|string  filetypes to attach to (default: `M.default_filetypes`);
---                                   '*' = every buffer that has a file and a filetype
--- @field root_markers string[]|nil
--- @field settings table             server options, camelCase (modelPath, device, ...)
--- @field completion boolean         enable vim.lsp.completion in attached buffers
--- @field autotrigger boolean        vim.lsp.completion autotrigger (on the server's trigger characters)
--- @field ghost_text boolean         show inline completions as ghost text
--- @field native_inline boolean      use vim.lsp.inline_completion when Neovim has it (0.12+)
--- @field menu_noselect boolean      with autotrigger: add `noselect` to the buffer's 'completeopt'
--- @field debounce_ms integer        delay between the last keystroke and the request (0.11 path)
--- @field keymaps diffill.Keymaps    insert-mode keys
--- Neovim filetypes of the languages the server guards with a tree-sitter parser
--- (lsp_server/text/languages.py): Python, JavaScript, TypeScript, TSX, Go, Rust, Java, C, C++,
--- C#, Ruby, PHP, Lua and shell scripts. Neovim runs several LSP clients per buffer, so
--- attaching diffill takes nothing from the buffer's other language servers.
M.default_filetypes = {
  'python', 'javascript', 'javascriptreact', 'typescript', 'typescriptreact', 'go', 'rust',
  'java', 'c', 'cpp', 'cs', 'ruby', 'php', 'lua', 'sh', 'bash', 'zsh',
}

M.defaults = {
  cmd = { 'diffill', 'serve' },
  filetypes = M.default_filetypes,
  root_markers = { '.git' },
  settings = {},
  completion = true,
  autotrigger = true,
  menu_noselect = true,
  ghost_text = true,
  native_inline = true,
  debounce_ms = 75,
  keymaps = { accept = '<Tab>', next = '<M-]>', prev = '<M-[>', dismiss = '<C-]>' },
}

--- @type diffill.Config
M.config = vim.deepcopy(M.defaults)

--- Use Neovim's own inline completion (0.12+) instead of this module's extmarks.
local function native_inline()
  return M.config.native_inline and vim.lsp.inline_completion ~= nil
end

-- ---------------------------------------------------------------------------------------------
-- Ghost text for Neovim 0.11 (textDocument/inlineCompletion by hand)
-- ---------------------------------------------------------------------------------------------

--- @class diffill.Ghost
--- @field client_id integer
--- @field items table[]      lsp.InlineCompletionItem[]
--- @field index integer      item shown
--- @field row integer        0-based row of the replaced range start
--- @field col integer        byte column of the replaced range start
--- @field end_row integer
--- @field end_col integer    byte column of the replaced range end (at request time)
--- @field text string        the insert text of the shown item
--- @field request_id integer|nil
--- @field timer uv.uv_timer_t|nil

--- @type table<integer, diffill.Ghost>
local state = {}

local function buf_state(bufnr)
  local s = state[bufnr]
  if not s then
    s = { items = {}, index = 1 }
    state[bufnr] = s
  end
  return s
end

local function item_text(item)
  local t = item.insertText
  if type(t) == 'table' then
    t = t.value or ''
  end
  return t or ''
end

--- Byte column of an LSP character offset (in `encoding` units) on `line`.
local function byte_col_of(line, character, encoding)
  if encoding == 'utf-8' then
    return math.min(character, #line)
  end
  local ok, col = pcall(vim.str_byteindex, line, encoding, character, false)
  return ok and col or #line
end

--- Byte column of an LSP position on a buffer line.
local function byte_col(bufnr, row, character, encoding)
  return byte_col_of(api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or '', character, encoding)
end

local function hide(bufnr)
  if api.nvim_buf_is_valid(bufnr) then
    api.nvim_buf_clear_namespace(bufnr, ns, 0, -1)
  end
end

local function stop_timer(s)
  if s.timer then
    s.timer:stop()
    if not s.timer:is_closing() then
      s.timer:close()
    end
    s.timer = nil
  end
end

local function cancel_request(s)
  if s.request_id and s.client_id then
    local client = vim.lsp.get_client_by_id(s.client_id)
    if client then
      client:cancel_request(s.request_id)
    end
  end
  s.request_id = nil
end

--- Hide the ghost text and forget the candidates.
local function dismiss(bufnr)
  local s = state[bufnr]
  if not s then
    return
  end
  stop_timer(s)
  cancel_request(s)
  s.items, s.index, s.text = {}, 1, nil
  hide(bufnr)
end

--- The part of the shown item still to be inserted at the cursor: the insert text minus
--- whatever already sits between the range start and the cursor (typed ahead), or nil when
--- the buffer no longer agrees with the item.
local function remainder(bufnr, s)
  if not s.text or s.text == '' then
    return nil
  end
  local cur = api.nvim_win_get_cursor(0)
  local crow, ccol = cur[1] - 1, cur[2]
  if crow ~= s.row or ccol < s.col then
    return nil
  end
  local line = api.nvim_buf_get_lines(bufnr, crow, crow + 1, false)[1] or ''
  local typed = line:sub(s.col + 1, ccol)
  if s.text:sub(1, #typed) ~= typed then
    return nil
  end
  local rest = s.text:sub(#typed + 1)
  return rest ~= '' and rest or nil
end

--- Draw the shown item at the cursor: first line inline, further lines as virtual lines.
local function render(bufnr)
  hide(bufnr)
  local s = state[bufnr]
  if not s or api.nvim_get_current_buf() ~= bufnr then
    return
  end
  local rest = remainder(bufnr, s)
  if not rest then
    return
  end
  local lines = vim.split(rest, '\n', { plain = true })
  local cur = api.nvim_win_get_cursor(0)
  local virt_lines = {}
  for i = 2, #lines do
    virt_lines[#virt_lines + 1] = { { lines[i], 'DiffillGhost' } }
  end
  local hint = #s.items > 1 and { (' (%d/%d)'):format(s.index, #s.items), 'DiffillGhostHint' } or nil
  local virt_text = { { lines[1], 'DiffillGhost' } }
  if hint and #virt_lines == 0 then
    virt_text[#virt_text + 1] = hint
  elseif hint then
    table.insert(virt_lines[#virt_lines], hint)
  end
  -- right_gravity = true: Neovim draws the cursor before inline virtual text whose mark
  -- has right gravity, after it otherwise (the cursor would sit at the end of the ghost).
  -- Typed text pushes the mark right; TextChangedI redraws it at the cursor anyway.
  api.nvim_buf_set_extmark(bufnr, ns, cur[1] - 1, cur[2], {
    virt_text = virt_text,
    virt_text_pos = 'inline',
    virt_lines = #virt_lines > 0 and virt_lines or nil,
    hl_mode = 'combine',
    right_gravity = true,
  })
end

local function show_item(bufnr, index)
  local s = state[bufnr]
  local item = s and s.items[index]
  if not item then
    return
  end
  local client = vim.lsp.get_client_by_id(s.client_id)
  local enc = client and client.offset_encoding or 'utf-16'
  local cur = api.nvim_win_get_cursor(0)
  s.index = index
  s.text = item_text(item)
  if item.range then
    local r = item.range
    s.row = r.start.line
    s.col = byte_col(bufnr, r.start.line, r.start.character, enc)
    s.end_row = r['end'].line
    s.end_col = byte_col(bufnr, r['end'].line, r['end'].character, enc)
  else
    s.row, s.col, s.end_row, s.end_col = cur[1] - 1, cur[2], cur[1] - 1, cur[2]
  end
  render(bufnr)
end

--- Ask the server for inline completions at the cursor.
--- @param trigger integer 1 = invoked (more candidates), 2 = automatic
local function request(bufnr, trigger, on_done)
  local s = buf_state(bufnr)
  local client = vim.lsp.get_clients({ bufnr = bufnr, name = NAME, method = 'textDocument/inlineCompletion' })[1]
  if not client or not vim.startswith(api.nvim_get_mode().mode, 'i') then
    return
  end
  cancel_request(s)
  s.client_id = client.id
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.context = { triggerKind = trigger }
  local tick = api.nvim_buf_get_changedtick(bufnr)
  local cursor = api.nvim_win_get_cursor(0)
  local ok, id
  ok, id = client:request('textDocument/inlineCompletion', params, function(err, result)
    if s.request_id == id then
      s.request_id = nil
    end
    if err or not result then
      return
    end
    -- Stale answer: the buffer or the cursor moved on since the request.
    if api.nvim_buf_get_changedtick(bufnr) ~= tick or not vim.deep_equal(api.nvim_win_get_cursor(0), cursor) then
      return
    end
    if not vim.startswith(api.nvim_get_mode().mode, 'i') then
      return
    end
    local items = result.items or result
    s.items = vim.tbl_filter(function(it)
      return item_text(it) ~= ''
    end, items)
    s.index = 1
    if #s.items > 0 then
      show_item(bufnr, 1)
    else
      s.text = nil
      hide(bufnr)
    end
    if on_done then
      on_done()
    end
  end, bufnr)
  s.request_id = ok and id or nil
end

--- Debounced automatic request (TextChangedI, InsertEnter).
local function schedule_request(bufnr)
  local s = buf_state(bufnr)
  stop_timer(s)
  -- Typed ahead into the shown suggestion: keep showing the rest until the new answer.
  if s.text and remainder(bufnr, s) then
    render(bufnr)
  else
    s.text = nil
    hide(bufnr)
  end
  s.timer = vim.defer_fn(function()
    s.timer = nil
    if api.nvim_buf_is_valid(bufnr) and api.nvim_get_current_buf() == bufnr then
      request(bufnr, 2)
    end
  end, M.config.debounce_ms)
end

--- True when ghost text is shown in the current buffer.
function M.visible(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  if native_inline() then
    return false -- 0.12 keeps its own state; get() reports whether it accepted
  end
  local s = state[bufnr]
  return s ~= nil and remainder(bufnr, s) ~= nil
end

--- The text the accept key would insert at the cursor now (nil when no ghost text).
function M.suggestion(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  local s = state[bufnr]
  return s and remainder(bufnr, s) or nil
end

--- Accept the ghost text: replace the item's range with its text, cursor after it.
--- @return boolean accepted
function M.accept(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  if native_inline() then
    return vim.lsp.inline_completion.get({ bufnr = bufnr })
  end
  local s = state[bufnr]
  if not s or not remainder(bufnr, s) then
    return false
  end
  local text = s.text
  -- The range end may lie past the cursor (e.g. an auto-closed bracket the item replaces);
  -- typed-ahead text moved it right by what the user typed on the same row.
  local cur = api.nvim_win_get_cursor(0)
  local end_row, end_col = s.end_row, s.end_col
  if end_row == s.row then
    end_col = math.max(end_col, cur[2])
  end
  local lines = vim.split(text, '\n', { plain = true })
  dismiss(bufnr)
  s.text = nil
  api.nvim_buf_set_text(bufnr, s.row, s.col, end_row, end_col, lines)
  local last_row = s.row + #lines - 1
  local last_col = (#lines == 1 and s.col or 0) + #lines[#lines]
  api.nvim_win_set_cursor(0, { last_row + 1, last_col })
  return true
end

--- Show the next (+1) or previous (-1) candidate; asks for more candidates when there is one.
function M.cycle(delta, bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  if native_inline() then
    vim.lsp.inline_completion.select({ bufnr = bufnr, count = delta })
    return
  end
  local s = buf_state(bufnr)
  local n = #s.items
  local function step()
    local m = #s.items
    if m > 0 then
      show_item(bufnr, (s.index - 1 + delta) % m + 1)
    end
  end
  if n <= 1 then
    request(bufnr, 1, n == 1 and step or nil) -- invoked: the server returns several candidates
  else
    step()
  end
end

--- Hide the ghost text.
function M.dismiss(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  if native_inline() then
    -- 0.12 has no public "hide": re-enabling drops the current item.
    vim.lsp.inline_completion.enable(false, { bufnr = bufnr })
    vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
    return
  end
  dismiss(bufnr)
end

--- Request ghost text now (what the debounced auto-request does).
function M.trigger(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  request(bufnr, 1)
end

local function attach_ghost(bufnr)
  local group = api.nvim_create_augroup('diffill.ghost.' .. bufnr, { clear = true })
  api.nvim_create_autocmd({ 'TextChangedI', 'TextChangedP', 'InsertEnter' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      schedule_request(bufnr)
    end,
  })
  api.nvim_create_autocmd('CursorMovedI', {
    group = group,
    buffer = bufnr,
    callback = function()
      local s = state[bufnr]
      if s and s.text and not remainder(bufnr, s) then
        dismiss(bufnr)
      end
    end,
  })
  api.nvim_create_autocmd({ 'InsertLeave', 'BufLeave' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      dismiss(bufnr)
    end,
  })
  api.nvim_create_autocmd('LspDetach', {
    group = group,
    buffer = bufnr,
    callback = function(ev)
      local c = vim.lsp.get_client_by_id(ev.data.client_id)
      if c and c.name == NAME then
        dismiss(bufnr)
        state[bufnr] = nil
        pcall(api.nvim_del_augroup_by_id, group)
      end
    end,
  })
end

-- ---------------------------------------------------------------------------------------------
-- Keymaps, commands, setup
-- ---------------------------------------------------------------------------------------------

local function set_keymaps(bufnr)
  local km = M.config.keymaps or {}
  local function map(lhs, rhs, desc, expr)
    if lhs then
      vim.keymap.set('i', lhs, rhs, { buffer = bufnr, desc = desc, expr = expr, silent = true })
    end
  end
  if native_inline() then
    map(km.accept, function()
      if not vim.lsp.inline_completion.get({ bufnr = bufnr }) then
        return vim.keycode(km.accept)
      end
    end, 'diffill: accept suggestion', true)
  else
    -- expr mapping: text is locked while it runs, so accept through <Cmd>; without ghost
    -- text the key keeps its usual meaning.
    map(km.accept, function()
      if M.visible(bufnr) then
        return '<Cmd>lua require("diffill").accept()<CR>'
      end
      return vim.keycode(km.accept)
    end, 'diffill: accept suggestion', true)
  end
  map(km.next, function()
    M.cycle(1, bufnr)
  end, 'diffill: next suggestion')
  map(km.prev, function()
    M.cycle(-1, bufnr)
  end, 'diffill: previous suggestion')
  map(km.dismiss, function()
    M.dismiss(bufnr)
  end, 'diffill: dismiss suggestion')
end

-- ---------------------------------------------------------------------------------------------
-- Completion items: insert the whole textEdit
-- ---------------------------------------------------------------------------------------------
-- For a plain-text item, vim.lsp.completion puts only the first whitespace-delimited word of
-- textEdit.newText into the buffer ("a + b" -> "a"), and nothing past the cursor is replaced.
-- diffill's items are whole code fragments, so after <C-y> the rest is put in here: the line
-- as it was when the items arrived (captured in `convert`) tells where the edit's range ends.

--- @type table<integer, {row: integer, col: integer, line: string}>
local snapshot = {}

local function capture(bufnr)
  local cur = api.nvim_win_get_cursor(0)
  snapshot[bufnr] = { row = cur[1] - 1, col = cur[2], line = api.nvim_get_current_line() }
  return {}
end

local function complete_textedit(bufnr, client)
  local ev = vim.v.event
  local done = vim.v.completed_item
  local item = vim.tbl_get(done or {}, 'user_data', 'nvim', 'lsp', 'completion_item')
  local snap = snapshot[bufnr]
  snapshot[bufnr] = nil
  if not (ev and ev.reason == 'accept') or type(item) ~= 'table' or not snap then
    return
  end
  if vim.tbl_get(done, 'user_data', 'nvim', 'lsp', 'client_id') ~= client.id then
    return
  end
  local te = item.textEdit
  if not te or item.insertTextFormat == 2 or te.range == nil or te.range.start.line ~= snap.row then
    return
  end
  local enc = client.offset_encoding or 'utf-16'
  local start_b = byte_col_of(snap.line, te.range.start.character, enc)
  local end_b = te.range['end'].line == snap.row and byte_col_of(snap.line, te.range['end'].character, enc)
    or snap.col
  local cur = api.nvim_win_get_cursor(0)
  if cur[1] - 1 ~= snap.row then
    return
  end
  local line = api.nvim_get_current_line()
  -- What Vim inserted must be the item's word, right before the cursor, from the range start.
  if line:sub(start_b + 1, cur[2]) ~= done.word then
    return
  end
  local extra = math.max(0, end_b - snap.col) -- characters past the cursor the edit replaces
  if done.word == te.newText and extra == 0 then
    return
  end
  local lines = vim.split(te.newText, '\n', { plain = true })
  api.nvim_buf_set_text(bufnr, snap.row, start_b, snap.row, math.min(#line, cur[2] + extra), lines)
  api.nvim_win_set_cursor(0, { snap.row + #lines, (#lines == 1 and start_b or 0) + #lines[#lines] })
end

--- 'completeopt' for a buffer whose menu opens by itself: the user's global value plus
--- `noselect`. Without it Vim selects the first item and, unless 'completeopt' has
--- `noinsert` (not in the default "menu,popup"), inserts it at once: typing `inv.` left
--- `inv.is()` in the file. With `noinsert` alone <CR> would accept the selected item.
--- With `noselect` nothing is selected or inserted until <C-n>/<C-p> (then <C-y>), and
--- <CR> and typing on behave as if there were no menu.
local function safe_completeopt()
  local cot = vim.split(api.nvim_get_option_value('completeopt', { scope = 'global' }), ',', { trimempty = true })
  if not vim.tbl_contains(cot, 'noselect') then
    cot[#cot + 1] = 'noselect'
  end
  return table.concat(cot, ',')
end

local function on_attach(client, bufnr)
  if M.config.completion and client:supports_method('textDocument/completion') then
    if M.config.autotrigger and M.config.menu_noselect then
      vim.bo[bufnr].completeopt = safe_completeopt()
    end
    vim.lsp.completion.enable(true, client.id, bufnr, {
      autotrigger = M.config.autotrigger,
      convert = function()
        return capture(bufnr)
      end,
    })
    api.nvim_create_autocmd('CompleteDone', {
      group = api.nvim_create_augroup('diffill.complete.' .. bufnr, { clear = true }),
      buffer = bufnr,
      callback = function()
        complete_textedit(bufnr, client)
      end,
    })
  end
  if M.config.ghost_text and client:supports_method('textDocument/inlineCompletion') then
    if native_inline() then
      vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
    else
      attach_ghost(bufnr)
    end
    set_keymaps(bufnr)
  end
end

local function client()
  return vim.lsp.get_clients({ name = NAME })[1]
end

--- Ghost text highlights, visible with and without 'termguicolors'. Linking to Comment is
--- not enough: Neovim's default colour scheme gives Comment a GUI colour only, so on a
--- 256- or 16-colour terminal (tmux, 'notermguicolors') the ghost would look like code.
--- The GUI colour and style are Comment's; the terminal colour is Comment's when the colour
--- scheme has one, else 8 (bright black: grey on 16-colour terminals and up). `default`:
--- a user's own `:hi DiffillGhost` wins; redefined after each colour scheme change.
local function define_highlights()
  for group, base in pairs({ DiffillGhost = 'Comment', DiffillGhostHint = 'NonText' }) do
    local b = api.nvim_get_hl(0, { name = base, link = false })
    api.nvim_set_hl(0, group, {
      default = true,
      fg = b.fg,
      ctermfg = b.ctermfg or 8,
      italic = b.italic or group == 'DiffillGhost',
      cterm = { italic = group == 'DiffillGhost' },
    })
  end
end
M._define_highlights = define_highlights

--- Push new settings to the running server (workspace/didChangeConfiguration).
--- @param settings table camelCase server options to change
function M.configure(settings)
  M.config.settings = vim.tbl_extend('force', M.config.settings or {}, settings)
  local c = client()
  if c then
    c.settings = { [NAME] = M.config.settings }
    c:notify('workspace/didChangeConfiguration', { settings = c.settings })
  end
end

--- Turn completions on or off (server option `enabled`).
function M.toggle()
  local on = M.config.settings.enabled ~= false
  M.configure({ enabled = not on })
  vim.notify(('diffill: %s'):format(on and 'off' or 'on'))
  if on then
    for bufnr in pairs(state) do
      dismiss(bufnr)
    end
  end
end

--- The server's `diffill/status` (model, device, last latency, ...), synchronously.
--- @return table|nil
function M.status(timeout_ms)
  local c = client()
  if not c then
    return nil
  end
  local res = c:request_sync('diffill/status', {}, timeout_ms or 2000, 0)
  return res and res.result or nil
end

local function ms(v)
  return type(v) == 'number' and ('%d ms'):format(math.floor(v + 0.5)) or '-'
end

--- A few lines for people: model, device, state, latency, drafts, the last request.
--- @param st table `diffill/status`
--- @return string[]
function M.status_lines(st)
  local state = st.error ~= nil and st.error ~= vim.NIL and ('error: ' .. tostring(st.error))
    or st.loaded and 'loaded' or st.loading and 'loading' or 'not loaded'
  local on = not (type(st.options) == 'table' and st.options.enabled == false)
  local lines = {
    ('diffill %s: %s on %s (%s)%s'):format(
      st.version or '', tostring(st.model or 'default model'), tostring(st.device or '?'), state,
      on and '' or ', off'
    ),
    ('latency p50 %s, p95 %s; %d requests, %d answered from the typed-ahead cache'):format(
      ms(st.p50_ms), ms(st.p95_ms), tonumber(st.requests) or 0, tonumber(st.cache_hits) or 0
    ),
  }
  local d = type(st.drafts) == 'table' and st.drafts or {}
  if d.enabled ~= false then
    lines[#lines + 1] = ('drafts accepted %d of %d offered'):format(tonumber(d.accepted) or 0, tonumber(d.offered) or 0)
  end
  local lc = st.last_context
  if type(lc) == 'table' then
    lines[#lines + 1] = ('last request: %s, %s model, %s prefix + %s suffix tokens'):format(
      ms(st.last_ms), ms(lc.model_ms), tostring(lc.prefix_tokens), tostring(lc.suffix_tokens)
    )
  end
  lines[#lines + 1] = 'full status: :DiffillStatus!'
  return lines
end

--- The `filetypes` given to vim.lsp.config: nil (every filetype) for '*' or a list holding
--- '*', else the list (an empty one attaches to no buffer).
--- @param ft string[]|string|nil
--- @return string[]|nil
local function resolve_filetypes(ft)
  if ft == nil then
    return vim.deepcopy(M.default_filetypes)
  elseif ft == '*' or (type(ft) == 'table' and vim.tbl_contains(ft, '*')) then
    return nil
  elseif type(ft) == 'string' then
    return { ft }
  end
  return vim.deepcopy(ft)
end

--- The filetypes diffill attaches to with the current configuration (nil: every filetype).
function M.filetypes()
  return resolve_filetypes(M.config.filetypes)
end

function M.setup(opts)
  M.config = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts or {})
  -- The user's list as given: tbl_deep_extend would merge an empty table into the default.
  if opts and opts.filetypes ~= nil then
    M.config.filetypes = opts.filetypes
  end
  if opts and opts.keymaps == false then
    M.config.keymaps = {}
  end
  define_highlights()

  -- An empty Lua table would go out as a JSON array.
  local settings = next(M.config.settings or {}) and M.config.settings or vim.empty_dict()
  vim.lsp.config(NAME, {
    cmd = M.config.cmd,
    filetypes = M.filetypes(),
    root_markers = M.config.root_markers,
    init_options = { [NAME] = settings },
    settings = { [NAME] = settings },
  })
  local group = api.nvim_create_augroup('diffill', { clear = true })
  api.nvim_create_autocmd('LspAttach', {
    group = group,
    callback = function(ev)
      local c = vim.lsp.get_client_by_id(ev.data.client_id)
      if c and c.name == NAME then
        on_attach(c, ev.buf)
      end
    end,
  })
  vim.lsp.enable(NAME)

  api.nvim_create_user_command('DiffillToggle', M.toggle, { desc = 'diffill: completions on/off' })
  api.nvim_create_autocmd('ColorScheme', { group = group, callback = define_highlights })
  api.nvim_create_user_command('DiffillStatus', function(cmd)
    local st = M.status()
    if not st then
      vim.notify('diffill: not running')
    elseif cmd.bang then
      vim.print(st)
    else
      vim.notify(table.concat(M.status_lines(st), '\n'))
    end
  end, { bang = true, desc = 'diffill: server status (! for all of it)' })
end

return M
