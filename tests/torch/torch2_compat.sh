#!/usr/bin/env bash
# PyTorch 2.x compatibility: torch 2.6 from Debian 13 in a debootstrap root (spec
# pytorch-checkpoint.md §6), cached in the build folder. Loads our checkpoints with
# weights_only=True and reloads them into a PyTorch model.
# usage: torch2_compat.sh path/to/tiny-qwen3 CACHE_DIR     (exit 77 = skipped)
set -euo pipefail
bin=$(realpath "$1")
root=$2
here=$(cd "$(dirname "$0")" && pwd)
if ! chroot "$root" python3 -c 'import torch' >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP: building the Debian 13 torch root needs root (debootstrap, chroot)"
    exit 77
  fi
  command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  rm -rf "$root.tmp"
  echo "building the torch 2.x root (Debian 13, once per build folder)..."
  debootstrap --variant=minbase --include=python3-torch,python3-numpy trixie "$root.tmp" \
    "${mirror:-http://deb.debian.org/debian}" >"$root.log" 2>&1 || {
    # no Debian 13 packages to be had (mirror unreachable): nothing about tiny-qwen3 was tested
    echo "SKIP: debootstrap of Debian 13 failed (network?), see $root.log:"
    tail -3 "$root.log"
    rm -rf "$root.tmp"
    exit 77
  }
  rm -rf "$root" && mv "$root.tmp" "$root"
fi
work="$root/tq"
rm -rf "$work" && mkdir -p "$work"
"$bin" train --output "$work/bf16.pt" >/dev/null
"$bin" train --dtype float32 --output "$work/f32.pt" >/dev/null
cp "$here/qwen3_ref.py" "$here/torch2_check.py" "$work/"
chroot "$root" python3 /tq/torch2_check.py /tq/bf16.pt /tq/f32.pt 2> >(grep -v -e "cpuinfo" -e "UCX" >&2)
