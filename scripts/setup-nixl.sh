#!/usr/bin/env bash
# Sets up what kvtwin-backends' `nixl` feature needs, idempotently:
#   - libclang (nixl-sys generates its bindings with bindgen): Debian's libclang1-14 and
#     libclang-common-14-dev, installed with apt-get only when missing;
#   - libnixl_capi.so and the libraries it loads: the nixl-cu12==1.5.1 wheel, fetched
#     with pip (no other Python is involved), checked against its SHA-256, and its two
#     library folders unpacked into target/nixl/ (ignored by git). They must stay side by
#     side: the libraries find each other through $ORIGIN run paths.
# Progress goes to stderr; stdout is the environment to use, so that
#   eval "$(scripts/setup-nixl.sh)"
# exports it. Override the folder with KVTWIN_NIXL_HOME.
set -euo pipefail
cd "$(dirname "$0")/.."

NIXL_VERSION=1.5.1
# The manylinux x86_64 CPython 3.11 wheel; its libraries do not depend on Python.
WHEEL="nixl_cu12-${NIXL_VERSION}-cp311-cp311-manylinux_2_28_x86_64.whl"
WHEEL_SHA256=341d0dfa499f941c054614252f1d8047d1380e33f29c87707372ff5ec7d3779a
HOME_DIR="${KVTWIN_NIXL_HOME:-$PWD/target/nixl}"
LIB_DIR="$HOME_DIR/.nixl_cu12.mesonpy.libs"
STAMP="$HOME_DIR/.unpacked-$WHEEL_SHA256"

log() { printf 'setup-nixl: %s\n' "$*" >&2; }

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
    log "only Linux x86_64 is supported (the wheel is manylinux x86_64)"
    exit 1
fi

# --- libclang ---------------------------------------------------------------------------
as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        log "need root for: $*"
        return 1
    fi
}
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'; }

missing=()
for package in libclang1-14 libclang-common-14-dev; do
    installed "$package" || missing+=("$package")
done
command -v unzip >/dev/null || missing+=(unzip)
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    as_root apt-get update -qq >&2
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
else
    log "libclang 14 and unzip are installed"
fi
LIBCLANG_PATH=/usr/lib/llvm-14/lib
if [ ! -e "$LIBCLANG_PATH/libclang.so.1" ]; then
    log "libclang not found in $LIBCLANG_PATH after installing libclang1-14"
    exit 1
fi

# --- the wheel's libraries ---------------------------------------------------------------
if [ -f "$STAMP" ] && [ -f "$LIB_DIR/libnixl_capi.so" ]; then
    log "nixl-cu12 $NIXL_VERSION already unpacked in $HOME_DIR"
else
    mkdir -p "$HOME_DIR/wheel"
    if ! echo "$WHEEL_SHA256  $HOME_DIR/wheel/$WHEEL" | sha256sum -c --status 2>/dev/null; then
        log "downloading nixl-cu12==$NIXL_VERSION"
        rm -f "$HOME_DIR/wheel/$WHEEL"
        if command -v pip3 >/dev/null; then pip=(pip3); else pip=(python3 -m pip); fi
        "${pip[@]}" download --quiet --disable-pip-version-check --no-deps \
            --only-binary=:all: --platform manylinux_2_28_x86_64 --python-version 3.11 \
            --implementation cp --abi cp311 -d "$HOME_DIR/wheel" "nixl-cu12==$NIXL_VERSION" >&2
        echo "$WHEEL_SHA256  $HOME_DIR/wheel/$WHEEL" | sha256sum -c --quiet >&2
    fi
    log "unpacking the libraries into $HOME_DIR"
    rm -rf "$LIB_DIR" "$HOME_DIR/nixl_cu12.libs" "$HOME_DIR"/.unpacked-*
    unzip -q -o "$HOME_DIR/wheel/$WHEEL" '.nixl_cu12.mesonpy.libs/*' 'nixl_cu12.libs/*' \
        -d "$HOME_DIR"
    rm -f "$HOME_DIR/wheel/$WHEEL"
    touch "$STAMP"
fi

# --- the environment ---------------------------------------------------------------------
cat <<EOF
export LIBCLANG_PATH=$LIBCLANG_PATH
export KVTWIN_NIXL_LIB_DIR=$LIB_DIR
export NIXL_PLUGIN_DIR=$LIB_DIR/plugins
# Keep UCX off real network interfaces (tests move bytes between agents of one process).
export UCX_NET_DEVICES=lo
# kvtwin loads libnixl_capi.so by path from KVTWIN_NIXL_LIB_DIR; a program that uses
# nixl-sys directly needs the loader to find it by name instead:
# export LD_LIBRARY_PATH=$LIB_DIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
EOF
