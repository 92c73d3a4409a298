// Drives code-server (VS Code OSS in the browser) through Debian's chromium with playwright-core,
// like a user: open the file with Quick Open, type at the end of a line, wait until ghost text
// is shown in the DOM, take a screenshot, press Tab, and read the document back.
//
// The diffill extension, when DIFFILL_VSCODE_TRACE is set in code-server's environment, appends
// JSON lines to that file: what each inline completion request returned (`inline`), every
// document change (`text`) and the status bar refreshes (`status`). This script reads them to
// know what the server suggested and what ended up in the document.
//
// Usage: node vscode_driver.js CONFIG.json      (exit 0: the run completed; the checks are pytest's)
// CONFIG: { url, chromium, fileName, original (the document's text), trace, result, screenshot,
//          timeoutMs, spot: { line, col (0-based), typeText } }
// The shared steps (config, trace, polling, opening the file, the run): vscode_common.js.
'use strict';
const { cfg, sleep, ms, traceEvents, until, GHOST, openFile, goTo, run } = require('./vscode_common');

const R = { steps: {} };

run(R, async (page) => {
  await openFile(page, (step) => { R.steps[step] = ms(); });

  // Ghost text pieces in document order (outermost matching elements only): VS Code draws
  // the first line as inline decorations (possibly several spans) and further lines in a
  // view zone below.
  const readGhost = () => page.$$eval(GHOST, (els, sel) => els
    .filter((e) => !e.parentElement || !e.parentElement.closest(sel))
    .map((e) => e.textContent.replace(/\u00a0/g, ' ')), GHOST);

  // Go to line:column (Ctrl+G, 1-based), type, and wait for the ghost text (the spot has a
  // suggestion: the scripted checkpoint's).
  let typedAt = 0;
  let nInline = 0;
  let shown = false;
  const requestsSoFar = () => traceEvents().filter((e) => e.event === 'inline-request').length;
  const undoToOriginal = async () => {
    await page.keyboard.press('Escape');
    await page.keyboard.press('Control+Z'); // back to the original document
    await until('undo', () => {
      const t = traceEvents().filter((e) => e.event === 'text');
      return t.length && t[t.length - 1].text === cfg.original;
    }, 10000);
  };
  const spot = cfg.spot;
  for (let attempt = 0; !shown; attempt++) {
    await goTo(page, spot);
    nInline = traceEvents().filter((e) => e.event === 'inline').length;
    const nRequests = requestsSoFar();
    typedAt = ms();
    await page.keyboard.type(spot.typeText, { delay: 40 });
    const at = [spot.line, spot.col + spot.typeText.length];
    // VS Code asks by itself after a keystroke, but now and then it does not (seen right
    // after the file opened): then ask the way a user would, with Alt+\ (Trigger Inline
    // Suggestion), and if that is not heard either, type the spot again.
    let asked = await until('inline request', () => requestsSoFar() > nRequests, 3000).catch(() => false);
    if (!asked) {
      R.manualTriggers = (R.manualTriggers || 0) + 1;
      await page.keyboard.press('Alt+Backslash');
      asked = await until('inline request', () => requestsSoFar() > nRequests, 5000).catch(() => false);
    }
    if (!asked) {
      if (attempt >= 2) throw new Error('VS Code sent no inline completion request');
      R.retypes = (R.retypes || 0) + 1;
      await undoToOriginal();
      await sleep(1000);
      continue;
    }
    shown = await until('ghost text in the DOM', async () => (await readGhost()).join('').trim(),
      cfg.timeoutMs).catch((e) => {
      const ev = traceEvents();
      const asked = ev.filter((x) => x.event === 'inline-request').length;
      const answers = ev.filter((x) => x.event === 'inline').slice(nInline)
        .filter((x) => x.position[0] === at[0] && x.position[1] === at[1]);
      throw new Error(`${e.message} (${asked} inline requests so far, answers at the spot: ` +
        `${JSON.stringify(answers)})`);
    });
  }
  R.ghostMs = ms() - typedAt;
  await sleep(150); // let VS Code settle (it may re-render once after the item arrived)
  R.ghostDom = await readGhost();
  const inline = traceEvents().filter((e) => e.event === 'inline');
  R.inlineRequests = inline.length - nInline;
  R.shownItem = [...inline].reverse().find((e) => e.items.length > 0) || null;
  const texts = traceEvents().filter((e) => e.event === 'text');
  R.textBeforeAccept = texts.length ? texts[texts.length - 1].text : null;
  if (cfg.screenshot) await page.screenshot({ path: cfg.screenshot });
  R.statusBar = await page.$$eval('.statusbar-item', (els) =>
    els.map((e) => e.textContent.trim()).filter((t) => t.includes('diffill')));

  // Accept with Tab, in the browser.
  const nText = texts.length;
  await page.keyboard.press('Tab');
  const after = await until('document change after Tab', () => {
    const t = traceEvents().filter((e) => e.event === 'text');
    return t.length > nText ? t[nText] : null;
  }, 10000);
  R.textAfterAccept = after.text;
  R.acceptMs = ms();

  // "diffill: Toggle" from the command palette: the setting flips, the extension pushes it
  // with workspace/didChangeConfiguration and the status bar says off.
  await page.keyboard.press('Escape');
  await page.keyboard.press('Control+Shift+P');
  await page.waitForSelector('.quick-input-widget input', { state: 'visible', timeout: 10000 });
  await page.keyboard.type('diffill: Toggle', { delay: 10 });
  await until('command in the palette', () => page.$('.quick-input-list .monaco-list-row'), 10000);
  await page.keyboard.press('Enter');
  const off = await until('status after toggle', () =>
    traceEvents().find((e) => e.event === 'status' && e.on === false && e.status && e.status.options), 10000);
  R.serverEnabledAfterToggle = off.status.options.enabled;
  R.statusBarAfterToggle = await until('status bar says off', async () => {
    const t = await page.$$eval('.statusbar-item', (els) => els.map((e) => e.textContent.trim()));
    return t.find((x) => x.includes('diffill off')) || null;
  }, 10000);
}, async (page) => {
  R.focus = await page.evaluate(() => {
    const a = document.activeElement;
    return a ? `${a.tagName}.${a.className} in ${a.closest('[class]')?.className}` : null;
  }).catch(() => null);
  R.notifications = await page.$$eval('.notification-toast, .notifications-toasts .monaco-list-row',
    (els) => els.map((x) => x.textContent.trim().slice(0, 200))).catch(() => null);
});
