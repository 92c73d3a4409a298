// Settings -> the options object the diffill server reads (camelCase wire names).
// Only settings the user actually set are sent: null/empty means "the server's default",
// and the server reports unknown keys as warnings, so nothing else goes on the wire.

/** `diffill.*` settings forwarded to the server, under the same names. */
export const SERVER_OPTIONS = [
  'enabled',
  'modelPath',
  'recipe',
  'device',
  'latencyBudgetMs',
  'maxTokens',
  'contextTokens',
  'multiline',
  'numCandidates',
  'steps',
  'tokenHealing',
  'drafts',
  'syntaxCheck',
  'extraContext',
  'workspaceIndex',
  'workspaceMaxFiles',
  'workspaceMaxMb',
  'workspaceDrafts',
  'workspaceContext',
  'definitionsContext',
  'recentContext',
] as const;

export type ServerOptionName = (typeof SERVER_OPTIONS)[number];
export type ServerOptions = Partial<Record<ServerOptionName, string | number | boolean>>;

/** Minimal view of `vscode.WorkspaceConfiguration` (keeps this module free of `vscode`). */
export interface SettingsReader {
  get<T>(name: string): T | undefined;
}

/** Build the server options from the `diffill` configuration section. */
export function serverOptions(settings: SettingsReader): ServerOptions {
  const out: ServerOptions = {};
  for (const name of SERVER_OPTIONS) {
    const value = settings.get<unknown>(name);
    if (value === null || value === undefined || value === '') continue;
    if (typeof value === 'string' || typeof value === 'number' || typeof value === 'boolean') {
      out[name] = value;
    }
  }
  return out;
}

/** The server command line from `diffill.serverCommand`, validated. */
export function serverCommand(settings: SettingsReader): { command: string; args: string[] } {
  const raw = settings.get<unknown>('serverCommand');
  const argv = Array.isArray(raw) ? raw.filter((a): a is string => typeof a === 'string' && a !== '') : [];
  if (argv.length === 0) return { command: 'diffill', args: ['serve'] };
  return { command: argv[0], args: argv.slice(1) };
}

/**
 * Default of `diffill.languages`: the VS Code language ids of the languages the server
 * guards with a parser (lsp_server/text/languages.py). `*` in the list means every language.
 */
export const DEFAULT_LANGUAGES = [
  'python',
  'javascript',
  'javascriptreact',
  'typescript',
  'typescriptreact',
  'go',
  'rust',
  'java',
  'c',
  'cpp',
  'csharp',
  'ruby',
  'php',
  'lua',
  'shellscript',
] as const;

/** One entry of a document selector (the shape of `vscode.DocumentFilter` this module needs). */
export interface DocumentFilter {
  scheme: string;
  language?: string;
}

/**
 * The client's document selector from `diffill.languages`: files and untitled documents of
 * those language ids; every language when the list holds `*`. A missing or malformed setting
 * gives the default list; an empty list selects nothing (diffill attached to no document).
 */
export function documentSelector(settings: SettingsReader): DocumentFilter[] {
  const raw = settings.get<unknown>('languages');
  const ids = Array.isArray(raw)
    ? raw.filter((a): a is string => typeof a === 'string' && a.trim() !== '').map((a) => a.trim())
    : [...DEFAULT_LANGUAGES];
  if (ids.includes('*')) return [{ scheme: 'file' }, { scheme: 'untitled' }];
  const out: DocumentFilter[] = [];
  for (const language of [...new Set(ids)]) {
    out.push({ scheme: 'file', language }, { scheme: 'untitled', language });
  }
  return out;
}
