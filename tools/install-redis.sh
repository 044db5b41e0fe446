#!/usr/bin/env bash
# Install Debian's redis-server, the Celery broker of `make cluster`, when it is missing.
# Idempotent: does nothing when redis-server is on PATH. The package's own service is kept
# from starting (policy-rc.d): the cluster runs its own server on 127.0.0.1 and stops it.
set -euo pipefail
command -v redis-server >/dev/null 2>&1 && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
policy=/usr/sbin/policy-rc.d
created=""
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod +x "$policy"
    created=1
fi
cleanup() { if [ -n "$created" ]; then $sudo rm -f "$policy"; fi; }
trap cleanup EXIT
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends redis-server >/dev/null
redis-server --version
