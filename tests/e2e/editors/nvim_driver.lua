-- What the headless Neovim drivers share (nvim_e2e.lua, nvim_guard_e2e.lua): the config from
-- $DIFFILL_E2E_CONFIG, the result table, a clock, finishing (the JSON result written, exit 0
-- when the run completed), a watchdog, and the poll / after steps. A driver loads it with
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

--- Call k(v) once cond() returns a truthy v; on timeout fail, with explain() appended if given.
function D.poll(what, cond, k, timeout, explain)
  local deadline = D.ms() + (timeout or 30000)
  local function tick()
    local ok, v = pcall(cond)
    if not ok then
      return D.finish(false, what .. ': ' .. tostring(v))
    end
    if v then
      local ok2, e = pcall(k, v)
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

--- k() after `delay` ms, failures reported like poll's.
function D.after(delay, what, k)
  vim.defer_fn(function()
    local ok, e = pcall(k)
    if not ok then
      D.finish(false, what .. ': ' .. tostring(e))
    end
  end, delay)
end

return D
