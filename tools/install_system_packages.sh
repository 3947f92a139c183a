#!/usr/bin/env bash
# System packages the test suite uses beyond pip's (tests/export/test_cross_targets.py):
# qemu-user-static runs the aarch64 exports, chromium opens the wasm32-browser page headless.
# Installed with apt-get when this machine has it and we may use it; otherwise a note says
# which tests will be skipped. Never fails the setup.
set -u
missing=()
command -v qemu-aarch64-static >/dev/null 2>&1 || command -v qemu-aarch64 >/dev/null 2>&1 ||
    missing+=(qemu-user-static)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 ||
    command -v google-chrome >/dev/null 2>&1 || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0
install() {
    "$@" apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
        { "$@" apt-get update -q >/dev/null 2>&1 &&
          "$@" apt-get install -y -q "${missing[@]}" >/dev/null 2>&1; }
}
if command -v apt-get >/dev/null 2>&1; then
    echo "installing ${missing[*]} for the export tests (apt-get)" >&2
    if [ "$(id -u)" = "0" ]; then
        install env DEBIAN_FRONTEND=noninteractive
    elif sudo -n true >/dev/null 2>&1; then
        install sudo -n env DEBIAN_FRONTEND=noninteractive
    fi
fi
for package in "${missing[@]}"; do
    case $package in
        qemu-user-static) command -v qemu-aarch64-static >/dev/null 2>&1 ||
            echo "note: qemu-user-static is not installed; the aarch64 export test will be" \
                 "skipped (apt-get install qemu-user-static)" >&2 ;;
        chromium) command -v chromium >/dev/null 2>&1 ||
            echo "note: chromium is not installed; the browser export test will be skipped" \
                 "(apt-get install chromium)" >&2 ;;
    esac
done
exit 0
