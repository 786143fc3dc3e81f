#!/usr/bin/env bash
# The README's test command: install what is needed, then run the whole suite (unit, property and integration
# tests against real Kafka brokers that the suite starts itself and stops afterwards). Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
# the Shoal page's browser test drives Debian's Chromium (no browser download): install it when missing
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  echo "shoal: installing Chromium for the UI test (apt-get install chromium)" >&2
  if [ "$(id -u)" = 0 ]; then sudo_cmd=(); else sudo_cmd=(sudo -n); fi
  { "${sudo_cmd[@]}" apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq chromium; } \
    >/dev/null 2>&1 || echo "shoal: could not install chromium; the browser test will say so" >&2
fi
cd "$root"
exec "$root/.venv/bin/python" -m pytest "$@"
