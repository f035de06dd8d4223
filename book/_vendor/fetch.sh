#!/usr/bin/env bash
# Re-create book/_vendor from the npm registry (developers only; readers never need this).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
npm pack --silent mathjax@3.2.2 @jupyter-widgets/html-manager@1.0.15 requirejs@2.3.8 >/dev/null
for f in *.tgz; do mkdir -p "${f%.tgz}"; tar xzf "$f" -C "${f%.tgz}"; done
cp mathjax-3.2.2/package/es5/tex-svg-full.js mathjax-3.2.2/package/LICENSE "$here/mathjax/"
hm=jupyter-widgets-html-manager-1.0.15/package/dist
cp "$hm"/embed-amd.js "$hm"/*.woff "$hm"/*.woff2 "$here/html-manager/"
cp "$hm"/embed.js.LICENSE.txt "$here/html-manager/THIRD-PARTY-LICENSES.txt"
cp requirejs-2.3.8/package/require.js "$here/requirejs/"
cd "$here" && sha256sum -c SHA256SUMS
