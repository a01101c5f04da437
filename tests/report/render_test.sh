#!/usr/bin/env bash
# The run report as a browser shows it: a short run writes --report, headless Chromium (Debian's
# chromium) renders it; the screenshot must not be blank (enough pixels in the charts' colours) and the
# rendered page must hold each chart's points. Skipped (77) where chromium is not installed.
#   usage: render_test.sh EXAMPLE
set -uo pipefail
example=$1
fail() { echo "FAIL: $*"; exit 1; }
command -v chromium >/dev/null || { echo "chromium is not installed (apt-get install chromium)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
timeout 300 "$example" --train-samples 1500 --epochs 3 --threads 1 --verbosity silent --report "$work/run.html" \
  >"$work/log" 2>&1 || { cat "$work/log"; fail "the run failed"; }
browse() { timeout 120 chromium --headless --no-sandbox --disable-gpu --user-data-dir="$work/profile" "$@" "file://$work/run.html"; }
browse --window-size=1200,1800 --screenshot="$work/shot.png" >/dev/null 2>&1 || fail "chromium could not render the report"
browse --dump-dom >"$work/dom.html" 2>/dev/null || fail "chromium could not load the report"
for chart in loss accuracy; do
  grep -q ">$chart</text>" "$work/dom.html" || fail "the rendered page has no $chart chart"
done
[ "$(grep -o 'data-points="3"' "$work/dom.html" | wc -l)" -ge 6 ] || fail "the curves do not have a point per epoch"
python3 - "$work/shot.png" <<'PY' || fail "the screenshot looks blank"
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
chunks, at = {}, 8
while at < len(data):
    length, kind = struct.unpack(">I4s", data[at:at + 8])
    chunks.setdefault(kind, []).append(data[at + 8:at + 8 + length])
    at += 12 + length
width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][0][:10])
assert depth == 8 and colour in (2, 6), f"PNG depth {depth} colour type {colour}"
channels = 3 if colour == 2 else 4
raw = zlib.decompress(b"".join(chunks[b"IDAT"]))
stride = width * channels
previous = bytearray(stride)
blue = orange = 0
for row in range(height):
    kind, line = raw[row * (stride + 1)], bytearray(raw[row * (stride + 1) + 1:(row + 1) * (stride + 1)])
    for i in range(stride):  # the PNG filters: none, sub, up, average, Paeth
        left = line[i - channels] if i >= channels else 0
        up, corner = previous[i], previous[i - channels] if i >= channels else 0
        if kind == 1: line[i] = (line[i] + left) & 255
        elif kind == 2: line[i] = (line[i] + up) & 255
        elif kind == 3: line[i] = (line[i] + (left + up) // 2) & 255
        elif kind == 4:
            p = left + up - corner
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
            line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
    for x in range(0, stride, channels):
        r, g, b = line[x], line[x + 1], line[x + 2]
        blue += abs(r - 0x1f) < 24 and abs(g - 0x77) < 24 and abs(b - 0xb4) < 24
        orange += abs(r - 0xff) < 24 and abs(g - 0x7f) < 24 and abs(b - 0x0e) < 24
    previous = line
print(f"report rendered {width}x{height}: {blue} training-blue and {orange} validation-orange pixels")
sys.exit(0 if blue > 2000 and orange > 200 else 1)
PY
echo "report render: passed"
