-- What the headless Neovim drivers (nvim_*_e2e.lua) share: the config from $DIFFILL_E2E_CONFIG,
-- the result table, a clock, finishing (the JSON result written, exit 0 when the run completed),
-- a watchdog, the poll / after steps, and the editor's side of them (the plugin set up, Insert
-- and Normal mode, the diffill client, the model loaded, the ghost extmarks). A driver loads it with
--   local D = dofile(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)) .. '/nvim_driver.lua')
--   local cfg, R, poll = D.init({ steps = {} }, 90000), D.R, D.poll
-- Typeahead (feedkeys) runs only when control returns to the main loop, so the steps are chained
-- with vim.defer_fn polls, never vim.wait, whenever Insert mode is involved.
local D = {}
local t0 = vim.uv.hrtime()

--- Milliseconds since the driver started.
function D.ms()
  return math.floor((vim.uv.hrtime() - t0) / 1e6)
end

--- Read the config, start the result table `R` (its fields given, plus the Neovim version)
--- and the watchdog (`cfg.timeout_ms`, else `default_timeout_ms`); returns the config.
function D.init(fields, default_timeout_ms)
  D.cfg = vim.json.decode(table.concat(vim.fn.readfile(os.getenv('DIFFILL_E2E_CONFIG')), '\n'))
  D.R = vim.tbl_extend('force', { nvim = tostring(vim.version()) }, fields or {})
  vim.defer_fn(function()
    D.finish(false, 'watchdog timeout')
  end, D.cfg.timeout_ms or default_timeout_ms)
  return D.cfg
end

function D.finish(ok, err)
  D.R.ok, D.R.error, D.R.total_ms = ok, err, D.ms()
  vim.fn.writefile({ vim.json.encode(D.R) }, D.cfg.result)
  vim.cmd(ok and 'qa!' or 'cq!')
end

-- poll and poll_soft: k(v) once cond() returns a truthy v; on timeout k(nil) when `soft`, else fail.
local function wait(what, cond, k, timeout, soft, explain)
  local deadline = D.ms() + (timeout or 30000)
  local function tick()
    local ok, v = pcall(cond)
    if not ok then
      return D.finish(false, what .. ': ' .. tostring(v))
    end
    if v or (soft and D.ms() > deadline) then
      local ok2, e = pcall(k, v or nil)
      if not ok2 then
        D.finish(false, what .. ' (continuation): ' .. tostring(e))
      end
      return
    end
    if D.ms() > deadline then
      local why = explain and select(2, pcall(explain)) or nil
      return D.finish(false, 'timeout waiting for ' .. what .. (why and (' (' .. tostring(why) .. ')') or ''))
    end
    vim.defer_fn(tick, 20)
  end
  tick()
end

--- Call k(v) once cond() returns a truthy v; on timeout fail, with explain() appended if given.
function D.poll(what, cond, k, timeout, explain)
  wait(what, cond, k, timeout, false, explain)
end

--- Like poll, but on timeout k(nil): for a wait whose outcome is what the run records.
function D.poll_soft(what, cond, k, timeout)
  wait(what, cond, k, timeout, true)
end

--- k() after `delay` ms, failures reported like poll's.
function D.after(delay, what, k)
  vim.defer_fn(function()
    local ok, e = pcall(k)
    if not ok then
      D.finish(false, what .. ': ' .. tostring(e))
    end
  end, delay)
end

--- No swap files, editors/nvim (`cfg.plugin_dir`) on the runtimepath, and its setup() with
--- `opts` plus the config's server command and settings.
function D.setup(opts)
  vim.o.swapfile = false
  vim.opt.rtp:prepend(D.cfg.plugin_dir)
  require('diffill').setup(vim.tbl_extend('force', { cmd = D.cfg.cmd, settings = D.cfg.settings }, opts or {}))
end

--- Normal mode, then k().
function D.to_normal(k)
  if vim.api.nvim_get_mode().mode ~= 'n' then
    vim.api.nvim_feedkeys(vim.keycode('<Esc>'), 'n', false)
  end
  D.poll('normal mode', function()
    return vim.api.nvim_get_mode().mode == 'n'
  end, k, 5000)
end

--- Insert mode with the cursor at byte `col` of `row` (0-based) of the current buffer, then k().
function D.insert_at(row, col, k)
  D.to_normal(function()
    if col >= #vim.api.nvim_buf_get_lines(0, row, row + 1, false)[1] then
      vim.api.nvim_win_set_cursor(0, { row + 1, 0 })
      vim.api.nvim_feedkeys('A', 'n', false)
    else
      vim.api.nvim_win_set_cursor(0, { row + 1, col })
      vim.api.nvim_feedkeys('i', 'n', false)
    end
    D.poll('insert mode', function()
      return vim.api.nvim_get_mode().mode == 'i'
    end, k, 5000)
  end)
end

--- The diffill client of `bufnr` once it is initialized, else nil (a poll condition).
function D.client(bufnr)
  local c = vim.lsp.get_clients({ bufnr = bufnr, name = 'diffill' })[1]
  return c and c.initialized and c
end

--- k() once the server has loaded the model (it loads after `initialized`; until then it
--- answers with nothing); a load error fails the run.
function D.wait_loaded(k, timeout)
  D.poll('model loaded (diffill/status)', function()
    local st = require('diffill').status()
    if st and st.error ~= vim.NIL and st.error ~= nil then
      error('model failed to load: ' .. tostring(st.error))
    end
    return st and st.loaded == true
  end, k, timeout)
end

--- The extmarks of the plugin's ghost text in `bufnr` (its `diffill.ghost` namespace).
function D.ghost_extmarks(bufnr)
  local ns = vim.api.nvim_get_namespaces()['diffill.ghost']
  return ns and vim.api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, { details = true }) or {}
end

--- Count the LspRequest "complete" events of textDocument/inlineCompletion (Neovim's client
--- saw a reply) from now on; returns the counter's reader.
function D.count_inline_completes()
  local n = 0
  vim.api.nvim_create_autocmd('LspRequest', {
    callback = function(ev)
      local req = ev.data and ev.data.request
      if req and req.type == 'complete' and req.method == 'textDocument/inlineCompletion' then
        n = n + 1
      end
    end,
  })
  return function()
    return n
  end
end

return D
