#!/bin/bash
# Re-pack the carried wheels (bench/gpu/pack.sh's DEST/p1..p6 and pack_extras.sh's DEST/x) as one tar in
# pieces DEST/c1, DEST/c2, ... of at most PIECE_MIB (default 57) MiB each, so that each device call's
# carry plus the working tree (which travels with every call) stays under the device's 64 MiB: the
# recipe's 60 MiB parts no longer fit beside a ~5 MiB checkout. On the device, calls 1..N each run
# `mkdir -p /tmp/wh && cp .gpu/cK/* /tmp/wh/`; run_gpu.sh's "install" joins wheels.tar.* and unpacks it.
# usage: bash bench/gpu/pack.sh .gpu && bash bench/gpu/pack_extras.sh .gpu && bash bench/gpu/pack_scale.sh .gpu
set -euo pipefail
DEST=$(cd "${1:-.gpu}" && pwd); PIECE=${PIECE_MIB:-57}
for d in p1 p2 p3 p4 p5 p6 x; do [ -d "$DEST/$d" ] || { echo "missing $DEST/$d: run pack.sh and pack_extras.sh first" >&2; exit 1; }; done
rm -rf "$DEST"/c[0-9]* "$DEST/tarsplit"; mkdir -p "$DEST/tarsplit"
# one flat folder of files: every part's files side by side, as /tmp/wh holds them on the device
# and pack_airflow.sh's Airflow side, when made, as the folder af/ (installed apart: run_gpu.sh "install")
AF=(); [ -d "$DEST/af" ] && AF=(-C "$DEST" af)
tar cf - -C "$DEST/p1" . -C "$DEST/p2" . -C "$DEST/p3" . -C "$DEST/p4" . -C "$DEST/p5" . -C "$DEST/p6" . -C "$DEST/x" . "${AF[@]}" \
  | split -b "${PIECE}M" -a 2 - "$DEST/tarsplit/wheels.tar."
k=0
for f in $(ls "$DEST"/tarsplit/wheels.tar.* | sort); do k=$((k + 1)); mkdir -p "$DEST/c$k"; mv "$f" "$DEST/c$k/"; done
rmdir "$DEST/tarsplit"
# What travels with every call besides a piece (tracked + untracked-not-ignored files of the checkout).
tree=$(cd "$(git -C "$DEST/.." rev-parse --show-toplevel)" && { git ls-files; git ls-files --others --exclude-standard; } | sort -u \
  | while read -r f; do [ -f "$f" ] && stat -c %s "$f"; done | awk '{s += $1} END {printf "%.1f", s / 1048576}')
echo "$k pieces of <= $PIECE MiB in $DEST/c1..c$k; the working tree: $tree MiB (each call: piece + tree <= 64 MiB)"
du -sm "$DEST"/c[0-9]* | sort -t c -k2 -n
awk -v t="$tree" -v p="$PIECE" 'BEGIN { if (t + p > 63.5) { print "TOO LARGE: lower PIECE_MIB (e.g. PIECE_MIB=" int(63 - t) ")"; exit 1 } }'
