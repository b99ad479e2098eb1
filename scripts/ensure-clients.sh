#!/usr/bin/env bash
# Installs the clients the tests run besides Go: Node with npm's amqplib and
# rhea (docs/consumers/, pinned by its package-lock.json, into the ignored
# docs/consumers/node_modules), and Debian's python3-pika and
# python3-qpid-proton for /usr/bin/python3 (a pyenv python3 on the PATH
# does not see Debian's packages). e2e/clients_test.go and
# e2e/amqp10_test.go run the guide's snippets and the AMQP 1.0 client with
# them. The console's browser test (internal/console TestBrowser) drives
# Debian's chromium with npm's playwright-core (e2e/console/, pinned by its
# package-lock.json). Safe to run again and again: it installs only what
# is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

debian_python() { [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import $1" 2>/dev/null; }

missing=()
command -v node >/dev/null 2>&1 || missing+=(nodejs)
# A nodejs package from elsewhere (NodeSource) carries its own npm, which
# Debian's npm package would conflict with.
command -v npm >/dev/null 2>&1 || missing+=(npm)
debian_python pika || missing+=(python3-pika)
debian_python proton || missing+=(python3-qpid-proton)
[ -x /usr/bin/chromium ] || missing+=(chromium)
if ((${#missing[@]})); then
  echo "ensure-clients: installing ${missing[*]} from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# amqplib and rhea (AMQP 1.0) at the versions package.json pins, from the
# lock file.
for pkg in amqplib rhea; do
  want=$(node -p "require('./docs/consumers/package.json').dependencies['$pkg']")
  have=$(node -p "require('./docs/consumers/node_modules/$pkg/package.json').version" 2>/dev/null || true)
  if [ "$have" != "$want" ]; then
    echo "ensure-clients: npm ci in docs/consumers ($pkg $want)" >&2
    npm ci --prefix docs/consumers --no-audit --no-fund --loglevel=error >/dev/null
    break
  fi
done

# playwright-core at the version e2e/console/package.json pins; it drives
# /usr/bin/chromium and downloads no browser of its own.
want=$(node -p "require('./e2e/console/package.json').dependencies['playwright-core']")
have=$(node -p "require('./e2e/console/node_modules/playwright-core/package.json').version" 2>/dev/null || true)
if [ "$have" != "$want" ]; then
  echo "ensure-clients: npm ci in e2e/console (playwright-core $want)" >&2
  npm ci --prefix e2e/console --no-audit --no-fund --loglevel=error >/dev/null
fi
