#!/usr/bin/env bash
# Install everything the tests need on a fresh machine, then run every check:
# ruff, ruff format, mypy (strict) and pytest. Exits non-zero if any of them fails.
#
# Usage: deploy/test.sh [pytest arguments]   (for example -m "not container" tests/deploy)
set -euo pipefail
cd "$(dirname "$0")/.."

# --help answers at once: no package installed, no check run before it.
for arg in "$@"; do
    case "$arg" in
        -h | --help)
            sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
            if [ -x .venv/bin/pytest ]; then
                echo
                .venv/bin/pytest --help
            else
                echo "pytest's own options: .venv/bin/pytest --help (after a first run of this script)"
            fi
            exit 0
            ;;
        --) break ;;
    esac
done

# System packages the integration tests use: a real Mosquitto broker (started by a test
# fixture on a free loopback port, never as a system service) and its clients, openssl for
# the test CA, systemd-analyze to verify the units, headless Chromium for the dashboard, and
# PostgreSQL (a throwaway cluster per test session, started by a fixture as an unprivileged user),
# and systemd-nspawn and debootstrap for the deployment test, which boots a Debian container
# and runs deploy/install.sh in it (tests/deploy/test_container.py; root only); a C compiler and
# make for the agent's C client and the generated C code (tests/clients/); a colour emoji font, so
# the dashboard's test sees released emoji drawn (tests/collector/test_dashboard_numbers.py).
need=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need+=(mosquitto)
command -v mosquitto_sub >/dev/null 2>&1 || need+=(mosquitto-clients)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
fc-list 2>/dev/null | grep -q "Noto Color Emoji" || need+=(fonts-noto-color-emoji)
command -v node >/dev/null 2>&1 || need+=(nodejs)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v systemd-nspawn >/dev/null 2>&1 || need+=(systemd-container)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v make >/dev/null 2>&1 || need+=(make)
if [ ${#need[@]} -gt 0 ]; then
    echo "== installing ${need[*]} from Debian's packages"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[dev]'

echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy"
.venv/bin/mypy
echo "== pytest"
.venv/bin/pytest "$@"
