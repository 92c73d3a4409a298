// Drives code-server (VS Code OSS in headless chromium, playwright-core) with VS Code's DEFAULT
// editor settings (the suggestion list opens on trigger characters and as you type, Enter
// accepts its selected item, brackets auto-close) and the diffill extension installed.
// For each step: go to the spot, type the trigger character, wait until diffill's suggestion
// is on screen (ghost text) and the completion requests are answered, then press a key
// (Enter, or one more character) and read the document back from the extension's trace.
//
// Usage: node vscode_defaults_driver.js CONFIG.json  (exit 0: the run completed; pytest checks)
// CONFIG: { url, chromium, fileName, original, trace, result, timeoutMs,
//           spot: { line, col (0-based), typeText }, keys: [ 'Enter', 'x', ... ] }
'use strict';
const fs = require('fs');
const { chromium } = require('playwright-core');

const cfg = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const t0 = Date.now();
const ms = () => Date.now() - t0;
const R = { steps: [] };

function traceEvents() {
  if (!fs.existsSync(cfg.trace)) return [];
  return fs.readFileSync(cfg.trace, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
}
const lastText = () => {
  const t = traceEvents().filter((e) => e.event === 'text');
  return t.length ? t[t.length - 1].text : cfg.original;
};

async function until(what, fn, timeoutMs) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timeout waiting for ${what}`);
    await sleep(25);
  }
}

const GHOST = '.ghost-text-decoration, .ghost-text';

(async () => {
  const browser = await chromium.launch({
    executablePath: cfg.chromium || '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
  const page = await browser.newPage({ viewport: { width: 860, height: 400 } });
  try {
    await page.goto(cfg.url);
    await page.waitForSelector('.monaco-workbench', { timeout: cfg.timeoutMs });
    await until('model loaded', () => traceEvents().some((e) => e.event === 'status' && e.status && e.status.loaded),
      cfg.timeoutMs);
    if (await page.$('.part.sidebar.visible, .part.sidebar:not(.hidden)')) await page.keyboard.press('Control+B');
    await page.keyboard.press('Control+P');
    await page.waitForSelector('.quick-input-widget input', { state: 'visible', timeout: 10000 });
    await page.keyboard.type(cfg.fileName, { delay: 10 });
    await until('quick open result', () => page.$('.quick-input-list .monaco-list-row'), 10000);
    await page.keyboard.press('Enter');
    await page.waitForSelector('.editor-instance .monaco-editor .view-lines', { timeout: 10000 });
    await until('editor focus', () => page.evaluate(() => !!document.activeElement?.closest('.monaco-editor')), 10000);
    const readGhost = async () => (await page.$$eval(GHOST, (els) => els.map((e) => e.textContent.replace(/\u00a0/g, ' ')))).join('').trim();
    const spot = cfg.spot;
    const undoToOriginal = async () => {
      await page.keyboard.press('Escape');
      for (let i = 0; i < 10 && lastText() !== cfg.original; i++) {
        await page.keyboard.press('Control+Z');
        await sleep(200);
      }
      if (lastText() !== cfg.original) throw new Error('could not undo back to the original document');
    };
    for (const key of cfg.keys) {
      const s = { key };
      let ghost = '';
      let n0 = 0;
      // VS Code sometimes sends no inline request after the first keystroke in a freshly
      // opened file, and Alt+\ does not wake it (seen in CI: 24 s without a request): then
      // the spot is typed again, from the original document, up to three times
      for (let attempt = 0; attempt < 3 && !ghost; attempt++) {
        if (attempt > 0) await undoToOriginal();
        await page.keyboard.press('Control+G');
        await page.waitForSelector('.quick-input-widget input', { state: 'visible', timeout: 10000 });
        await page.keyboard.type(`${spot.line + 1}:${spot.col + 1}`);
        await page.keyboard.press('Enter');
        await until('cursor placed', () => page.evaluate(() => !!document.activeElement?.closest('.monaco-editor')), 10000);
        n0 = traceEvents().length;
        await page.keyboard.type(spot.typeText, { delay: 40 });
        // diffill's suggestion is on screen (ghost text; Alt+\ asks if VS Code did not)
        ghost = await until('ghost text', readGhost, 8000).catch(() => '');
        if (!ghost) {
          await page.keyboard.press('Alt+Backslash');
          ghost = await until('ghost text', readGhost, 7000).catch(() => '');
        }
        s.attempts = attempt + 1;
      }
      s.ghost = ghost;
      await sleep(1500); // the suggestion list, if VS Code opens one, is up by now
      const since = traceEvents().slice(n0);
      s.completionRequests = since.filter((e) => e.event === 'completion-request');
      s.suggestWidget = await page.$$eval('.suggest-widget.visible .monaco-list-row',
        (els) => els.map((e) => e.textContent.trim())).catch(() => []);
      s.textBeforeKey = lastText();
      await page.keyboard.press(key);
      await sleep(800);
      s.textAfterKey = lastText();
      R.steps.push(s);
      await undoToOriginal();
    }
    R.ok = true;
  } catch (e) {
    R.ok = false;
    R.error = String(e && e.stack ? e.stack : e);
    await page.screenshot({ path: cfg.result.replace(/\.json$/, '-failure.png') }).catch(() => undefined);
  } finally {
    R.totalMs = ms();
    fs.writeFileSync(cfg.result, JSON.stringify(R, null, 1));
    await browser.close();
  }
})().catch((e) => {
  console.error('DRIVER FAIL', e);
  process.exit(2);
});
