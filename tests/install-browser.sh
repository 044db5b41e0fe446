#!/usr/bin/env bash
# Install Debian's Chromium (and a font) for the browser test, tests/e2e/test_ui_in_airflow.py,
# which drives it with Playwright (Playwright's own browser download cannot work here).
# Idempotent and quiet: exits 0 at once when Chromium is there. Needs root (or sudo) and apt;
# exits 1 when it cannot install, and the browser test then skips, saying why.
set -euo pipefail

packages=(chromium fonts-dejavu-core)
missing=()
for package in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
    [[ $status == "install ok installed" ]] || missing+=("$package")
done
if ((${#missing[@]} == 0)) && [[ -x /usr/bin/chromium ]]; then
    exit 0
fi

if ! command -v apt-get >/dev/null; then
    echo "install-browser: no apt-get here; install ${missing[*]} by hand" >&2
    exit 1
fi
if ((EUID == 0)); then
    sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
else
    echo "install-browser: need root to install ${missing[*]}" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
echo "install-browser: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq >/dev/null
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
/usr/bin/chromium --version
