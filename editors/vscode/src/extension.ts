// diffill for VS Code: starts `diffill serve` (stdio) through vscode-languageclient.
// Completion items and inline completions (ghost text, LSP 3.18) are registered by the
// client library itself from the server's capabilities; this file adds the settings
// plumbing, a status bar item fed by `diffill/status`, and the toggle/restart commands.
import * as fs from 'fs';
import * as vscode from 'vscode';
import {
  DidChangeConfigurationNotification,
  LanguageClient,
  LanguageClientOptions,
  Executable,
  State,
} from 'vscode-languageclient/node';
import { documentSelector, serverCommand, serverOptions } from './options';

const SECTION = 'diffill';

/** Reply of the custom `diffill/status` request (fields read defensively). */
interface DiffillStatus {
  loaded?: boolean;
  loading?: boolean;
  error?: string | null;
  model?: string | null;
  device?: string | null;
  options?: { enabled?: boolean };
  last_ms?: number | null;
  p50_ms?: number | null;
  [key: string]: unknown;
}

let client: LanguageClient | undefined;
let statusItem: vscode.StatusBarItem;
let output: vscode.LogOutputChannel;
/**
 * Until when (Date.now() ms) a completion request comes from the `diffill.suggest` command.
 * VS Code opens the suggestion list by itself (trigger characters, quick suggestions) with its
 * first item selected, and Enter accepts it by default (`editor.acceptSuggestionOnEnter`):
 * typing `[` then Enter would put diffill's whole suggestion into the document. So, unless
 * `diffill.suggestionList` is `always`, diffill's items go only into a list the user asked
 * for with that command; ghost text (accepted with Tab only) is the automatic path.
 */
let listAskedUntil = 0;
/** Set in end-to-end tests only: JSON lines describing what the editor received. */
const tracePath = process.env.DIFFILL_VSCODE_TRACE;

function settings(): vscode.WorkspaceConfiguration {
  return vscode.workspace.getConfiguration(SECTION);
}

function trace(event: Record<string, unknown>): void {
  if (!tracePath) return;
  fs.appendFileSync(tracePath, JSON.stringify({ t: Date.now(), ...event }) + '\n');
}

function plainRange(r: vscode.Range | undefined): number[] | undefined {
  return r && [r.start.line, r.start.character, r.end.line, r.end.character];
}

function makeClient(): LanguageClient {
  const { command, args } = serverCommand(settings());
  // No `transport` field: vscode-languageclient would append `--stdio` to the arguments.
  const executable: Executable = { command, args };
  const clientOptions: LanguageClientOptions = {
    // `diffill.languages`: the languages diffill completes (default: those the server parses).
    documentSelector: documentSelector(settings()),
    outputChannel: output,
    initializationOptions: { [SECTION]: serverOptions(settings()) },
    middleware: {
      provideCompletionItem: async (document, position, context, token, next) => {
        const asked = Date.now() < listAskedUntil;
        const always = settings().get<string>('suggestionList') === 'always';
        trace({ event: 'completion-request', triggerKind: context.triggerKind, asked, always });
        if (!asked && !always) return { isIncomplete: true, items: [] };
        return next(document, position, context, token);
      },
      provideInlineCompletionItems: async (document, position, context, token, next) => {
        trace({ event: 'inline-request', version: document.version, position: [position.line, position.character] });
        const result = await next(document, position, context, token);
        const items = Array.isArray(result) ? result : result?.items ?? [];
        trace({
          event: 'inline',
          uri: document.uri.toString(),
          version: document.version,
          position: [position.line, position.character],
          items: items.map((i) => ({
            insertText: typeof i.insertText === 'string' ? i.insertText : i.insertText.value,
            range: plainRange(i.range),
          })),
        });
        void refreshStatus();
        return result;
      },
    },
  };
  return new LanguageClient('diffill', 'diffill', { run: executable, debug: executable }, clientOptions);
}

async function startClient(): Promise<void> {
  client = makeClient();
  try {
    await client.start();
  } catch (err) {
    showStatus({ text: '$(error) diffill', tooltip: `diffill failed to start: ${String(err)}` });
    return;
  }
  await refreshStatus();
}

async function stopClient(): Promise<void> {
  const c = client;
  client = undefined;
  if (c && c.state !== State.Stopped) await c.stop().catch(() => undefined);
}

function showStatus(s: { text: string; tooltip: string }): void {
  statusItem.text = s.text;
  statusItem.tooltip = s.tooltip;
  statusItem.show();
}

let statusTimer: NodeJS.Timeout | undefined;

/** Ask the server for `diffill/status` and show on/off + the last latency. */
async function refreshStatus(): Promise<void> {
  const enabledSetting = settings().get<boolean>('enabled') !== false;
  let st: DiffillStatus | undefined;
  if (client?.state === State.Running) {
    st = await client.sendRequest<DiffillStatus>('diffill/status', {}).catch(() => undefined);
  }
  const on = st?.options?.enabled ?? enabledSetting;
  // The latest completion's latency when the server reports it, else the median.
  const last = typeof st?.last_ms === 'number';
  const ms = last ? st?.last_ms : typeof st?.p50_ms === 'number' ? st.p50_ms : undefined;
  const latency = typeof ms === 'number' ? ` ${Math.round(ms)} ms` : '';
  const lines = [on ? 'diffill: on (click to turn off)' : 'diffill: off (click to turn on)'];
  if (st?.model) lines.push(`model: ${st.model}`);
  if (st?.device) lines.push(`device: ${st.device}`);
  if (latency) lines.push(`${last ? 'last' : 'median'} completion:${latency}`);
  if (st?.error) {
    showStatus({ text: '$(error) diffill', tooltip: `diffill: ${st.error}` });
  } else if (st && !st.loaded) {
    showStatus({ text: '$(sync~spin) diffill', tooltip: 'diffill: loading the model' });
  } else {
    showStatus({ text: on ? `$(sparkle) diffill${latency}` : '$(circle-slash) diffill off', tooltip: lines.join('\n') });
  }
  trace({ event: 'status', on, status: st ?? null });
  // While the model loads, look again shortly.
  if (statusTimer) clearTimeout(statusTimer);
  statusTimer = st && !st.loaded && !st.error ? setTimeout(() => void refreshStatus(), 1000) : undefined;
}

async function toggle(): Promise<void> {
  const cfg = settings();
  const now = cfg.get<boolean>('enabled') !== false;
  const inspect = cfg.inspect<boolean>('enabled');
  const target =
    inspect?.workspaceValue !== undefined ? vscode.ConfigurationTarget.Workspace : vscode.ConfigurationTarget.Global;
  await cfg.update('enabled', !now, target);
  // onDidChangeConfiguration pushes the new options and refreshes the status bar.
}

async function onConfigurationChanged(e: vscode.ConfigurationChangeEvent): Promise<void> {
  if (!e.affectsConfiguration(SECTION)) return;
  // The document selector is fixed when the client starts: a new language list, like a new
  // command line, restarts the client.
  if (e.affectsConfiguration(`${SECTION}.serverCommand`) || e.affectsConfiguration(`${SECTION}.languages`)) {
    await stopClient();
    await startClient();
    return;
  }
  if (client?.state === State.Running) {
    await client.sendNotification(DidChangeConfigurationNotification.type, {
      settings: { [SECTION]: serverOptions(settings()) },
    });
  }
  await refreshStatus();
}

export async function activate(ctx: vscode.ExtensionContext): Promise<void> {
  output = vscode.window.createOutputChannel('diffill', { log: true });
  statusItem = vscode.window.createStatusBarItem('diffill.status', vscode.StatusBarAlignment.Right, 100);
  statusItem.name = 'diffill';
  statusItem.command = 'diffill.toggle';
  showStatus({ text: '$(sync~spin) diffill', tooltip: 'diffill: starting the language server' });
  ctx.subscriptions.push(
    output,
    statusItem,
    vscode.commands.registerCommand('diffill.toggle', toggle),
    vscode.commands.registerCommand('diffill.suggest', async () => {
      listAskedUntil = Date.now() + 5000;
      await vscode.commands.executeCommand('editor.action.triggerSuggest');
    }),
    vscode.commands.registerCommand('diffill.restart', async () => {
      await stopClient();
      await startClient();
    }),
    vscode.commands.registerCommand('diffill.showOutput', () => output.show()),
    vscode.workspace.onDidChangeConfiguration(onConfigurationChanged),
  );
  if (tracePath) {
    ctx.subscriptions.push(
      vscode.workspace.onDidChangeTextDocument((e) => {
        if (e.document.uri.scheme === 'file' && e.contentChanges.length > 0) {
          trace({ event: 'text', uri: e.document.uri.toString(), version: e.document.version, text: e.document.getText() });
        }
      }),
    );
  }
  await startClient();
}

export async function deactivate(): Promise<void> {
  if (statusTimer) clearTimeout(statusTimer);
  await stopClient();
}
