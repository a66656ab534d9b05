#!/bin/sh
# Vendors uPlot (the console's charts) from the npm registry into the Python package, so the
# console never fetches it at run time. Run again only to change the pinned version: set both
# lines below from `npm view uplot@<version> dist.integrity`, run `make vendor`, commit the files.
set -eu

VERSION=1.6.32
INTEGRITY=sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw==

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST="$ROOT/src/mqgate/console/static/vendor/uplot"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# npm checks the registry's integrity itself; the pin here also catches a changed registry entry.
(cd "$WORK" && npm pack --silent "uplot@$VERSION" >/dev/null)
TARBALL="$WORK/uplot-$VERSION.tgz"
GOT="sha512-$(openssl dgst -sha512 -binary "$TARBALL" | base64 | tr -d '\n')"
if [ "$GOT" != "$INTEGRITY" ]; then
    echo "uplot-$VERSION.tgz: integrity $GOT, expected $INTEGRITY" >&2
    exit 1
fi

tar -xzf "$TARBALL" -C "$WORK" package/dist/uPlot.iife.min.js package/dist/uPlot.min.css package/LICENSE
mkdir -p "$DEST"
cp "$WORK/package/dist/uPlot.iife.min.js" "$WORK/package/dist/uPlot.min.css" "$WORK/package/LICENSE" "$DEST/"
echo "uplot $VERSION ($INTEGRITY) -> $DEST"
ls -l "$DEST"
