// What the code-server drivers (vscode_driver.js, vscode_defaults_driver.js) share: the config
// (argv[2]), a clock, the extension's trace ($DIFFILL_VSCODE_TRACE: JSON lines of what it
// received and of every document change), polling, and the run itself: headless chromium on
// code-server, the file opened once the model is loaded, the cursor moved with Ctrl+G, and the
// result written (with a screenshot when the run failed) whatever happens.
'use strict';
const fs = require('fs');
const { chromium } = require('playwright-core');

const cfg = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const t0 = Date.now();
const ms = () => Date.now() - t0;

/** The trace's events so far. */
function traceEvents() {
  if (!fs.existsSync(cfg.trace)) return [];
  return fs
    .readFileSync(cfg.trace, 'utf8')
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l));
}

/** fn()'s first truthy value, polled every 25 ms; throws after timeoutMs. */
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
const editorFocused = (page) => page.evaluate(() => !!document.activeElement?.closest('.monaco-editor'));

/** Open code-server at cfg.url, wait until the extension's server has loaded the model, hide
 *  the side bar (the explorer opens with the folder: more room for the editor) and open
 *  cfg.fileName with Quick Open, as a user would. mark(step) is called as each is done. */
async function openFile(page, mark) {
  await page.goto(cfg.url);
  await page.waitForSelector('.monaco-workbench', { timeout: cfg.timeoutMs });
  mark('workbench');
  await until('model loaded', () => traceEvents().some((e) => e.event === 'status' && e.status && e.status.loaded),
    cfg.timeoutMs);
  mark('serverUp');
  if (await page.$('.part.sidebar.visible, .part.sidebar:not(.hidden)')) {
    await page.keyboard.press('Control+B');
  }
  await page.keyboard.press('Control+P');
  await page.waitForSelector('.quick-input-widget input', { state: 'visible', timeout: 10000 });
  await page.keyboard.type(cfg.fileName, { delay: 10 });
  await until('quick open result', () => page.$('.quick-input-list .monaco-list-row'), 10000);
  await page.keyboard.press('Enter');
  await page.waitForSelector('.editor-instance .monaco-editor .view-lines', { timeout: 10000 });
  await until('editor focus', () => editorFocused(page), 10000);
  mark('fileOpen');
}

/** The cursor to spot.line, spot.col (0-based) with Go to Line (Ctrl+G, 1-based). */
async function goTo(page, spot) {
  await page.keyboard.press('Control+G');
  await page.waitForSelector('.quick-input-widget input', { state: 'visible', timeout: 10000 });
  await page.keyboard.type(`${spot.line + 1}:${spot.col + 1}`);
  await page.keyboard.press('Enter');
  await until('cursor placed', () => editorFocused(page), 10000);
}

/** Run body(page) in headless chromium; R (ok, error, totalMs) is written to cfg.result in
 *  any case, after onFailure(page) and a screenshot when body threw. Exit 2: the driver
 *  itself failed (exit 0: the run completed; the checks are pytest's). */
function run(R, body, onFailure) {
  (async () => {
    const browser = await chromium.launch({
      executablePath: cfg.chromium || '/usr/bin/chromium',
      headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
    });
    const page = await browser.newPage({ viewport: { width: 860, height: 400 } });
    page.on('pageerror', (e) => console.log('pageerror', String(e).slice(0, 200)));
    try {
      await body(page);
      R.ok = true;
    } catch (e) {
      R.ok = false;
      R.error = String(e && e.stack ? e.stack : e);
      if (onFailure) await onFailure(page);
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
}

module.exports = { cfg, sleep, ms, traceEvents, until, GHOST, openFile, goTo, run };
