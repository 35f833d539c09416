#!/usr/bin/env bash
# Refresh vendor/asv-www/: the JavaScript and CSS that asv's published page loads from CDNs, taken
# from the npm registry (`npm pack`), so scripts/asv_offline_html.py can make html/ work offline.
# (bootstrap.min.css finds its fonts at ../fonts/, hence js/ css/ fonts/.) Only needed when asv is upgraded and its page asks for other files; the result is committed.
set -euo pipefail
cd "$(dirname "$0")/.."
destination=vendor/asv-www
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
packages=(jquery@3.3.1 flot@0.8.3 flot-orderbars@1.0.0 stupid-table-plugin@1.1.3 blueimp-md5@2.19.0 bootstrap@3.1.1)
(cd "$work" && for package in "${packages[@]}"; do
  npm pack --silent "$package" >/dev/null
  name=${package%@*}; version=${package##*@}
  mkdir -p "$name" && tar -xzf "$name-$version.tgz" -C "$name"
done)
rm -rf "$destination" && mkdir -p "$destination/js" "$destination/css" "$destination/fonts"
cp "$work/jquery/package/dist/jquery.min.js" "$destination/js/jquery-3.3.1.min.js"
for plugin in flot flot.time flot.selection flot.categories; do
  cp "$work/flot/package/jquery.$plugin.js" "$destination/js/jquery.$plugin.js"
done
cp "$work/flot-orderbars/package/js/jquery.flot.orderBars.js" "$destination/js/"
cp "$work/stupid-table-plugin/package/stupidtable.min.js" "$destination/js/"
cp "$work/blueimp-md5/package/js/md5.min.js" "$destination/js/"
cp "$work/bootstrap/package/dist/js/bootstrap.min.js" "$destination/js/"
cp "$work/bootstrap/package/dist/css/bootstrap.min.css" "$destination/css/"
cp "$work/bootstrap/package/dist/fonts/"* "$destination/fonts/"
for package in "${packages[@]}"; do
  name=${package%@*}
  license=$(ls "$work/$name/package" | grep -i -m1 '^licen[cs]e' || true)
  [ -n "$license" ] && cp "$work/$name/package/$license" "$destination/LICENSE.$name"
done
printf '%s\n' "${packages[@]}" > "$destination/PACKAGES"
echo "vendored ${#packages[@]} npm packages into $destination"
