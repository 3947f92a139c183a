#!/usr/bin/env bash
# System packages the test suite uses beyond pip's: qemu-user-static runs the aarch64 exports
# (tests/export/test_cross_targets.py). Installed with apt-get when this machine has it and
# we may use it; otherwise a note says which tests will be skipped. Never fails the setup.
set -u
if command -v qemu-aarch64-static >/dev/null 2>&1 || command -v qemu-aarch64 >/dev/null 2>&1; then
    exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ]; then
        apt-get install -y -q qemu-user-static >/dev/null 2>&1 ||
            { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q qemu-user-static >/dev/null 2>&1; }
    elif sudo -n true >/dev/null 2>&1; then
        sudo -n apt-get install -y -q qemu-user-static >/dev/null 2>&1
    fi
fi
if ! command -v qemu-aarch64-static >/dev/null 2>&1 && ! command -v qemu-aarch64 >/dev/null 2>&1; then
    echo "note: qemu-user-static is not installed (apt-get install qemu-user-static);" \
         "the aarch64 export test will be skipped" >&2
fi
exit 0
