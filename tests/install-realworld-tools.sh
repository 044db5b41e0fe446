#!/usr/bin/env bash
# Install the PDF producers that tests/realworld.py drives (see tests/realworld-packages.txt).
# Idempotent: exits 0 without touching apt when every package is already installed. Needs root
# (or sudo) and Debian's apt; recommends are skipped to keep the install lean.
set -euo pipefail
cd "$(dirname "$0")"

mapfile -t wanted < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' realworld-packages.txt)
missing=()
for package in "${wanted[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
    [[ $status == "install ok installed" ]] || missing+=("$package")
done
if ((${#missing[@]} == 0)); then
    echo "real-world PDF producers already installed: ${wanted[*]}"
    exit 0
fi

if ((EUID == 0)); then
    sudo=()
elif command -v sudo >/dev/null; then
    sudo=(sudo)
else
    echo "need root to install: ${missing[*]}" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
echo "installing: ${missing[*]}"
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "installed: ${missing[*]}"
