#!/usr/bin/env bash
# Install Debian's headless-capable Chromium for the HTML report tests (tests/integration/test_html_report.py).
# Idempotent and quiet: does nothing when /usr/bin/chromium exists. Needs root (or sudo) and apt.
# Exit status is 0 even when the install is impossible; the tests then skip with the reason.
set -u

if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_browser.sh: apt-get not found; HTML report browser tests will be skipped" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        echo "install_browser.sh: not root and no passwordless sudo; HTML report browser tests will be skipped" >&2
        exit 0
    fi
fi
export DEBIAN_FRONTEND=noninteractive
if ! { $SUDO apt-get update -qq >/dev/null && \
       $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null; }; then
    echo "install_browser.sh: apt-get install chromium failed; HTML report browser tests will be skipped" >&2
fi
exit 0
