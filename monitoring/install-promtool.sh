#!/bin/sh
# Print the path of a promtool, installing it first when there is none: quiet, idempotent.
#
# promtool comes from Debian's `prometheus` package. Only the promtool binary is taken out
# of the package (into .local/tools/), so no Prometheus server is installed or started and
# no root is needed once the package lists are fresh. Exit status 2: apt is not available.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
tools="$here/.local/tools"

if found=$(command -v promtool 2>/dev/null); then
    echo "$found"
    exit 0
fi
if [ -x "$tools/promtool" ]; then
    echo "$tools/promtool"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
    echo "install-promtool: apt-get and dpkg-deb are not available; install promtool" \
        "(Prometheus 2.x or later) and put it on PATH" >&2
    exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
if ! apt-get download prometheus >/dev/null 2>&1; then
    # Stale or missing package lists; refreshing them needs root.
    if [ "$(id -u)" -ne 0 ]; then
        echo "install-promtool: 'apt-get download prometheus' failed; run 'apt-get update'" \
            "as root, or install promtool yourself" >&2
        exit 1
    fi
    apt-get update -qq >/dev/null
    apt-get download prometheus >/dev/null
fi
dpkg-deb -x prometheus_*.deb extracted
mkdir -p "$tools"
install -m 0755 extracted/usr/bin/promtool "$tools/promtool.tmp"
mv "$tools/promtool.tmp" "$tools/promtool"
"$tools/promtool" --version >/dev/null 2>&1
echo "$tools/promtool"
