#!/usr/bin/env bash
# write_damaged_checkpoint.sh DIRECTORY WRITER: a fresh DIRECTORY holding checkpoint-000000000007.h5
# as checkpoint_crash_writer (WRITER) saves it, 1 MiB of doubles 7.0, with one byte of that array
# changed: HDF5 opens the file as before, and only the array's checksum finds the damage.
set -euo pipefail
directory=$1 writer=$2
rm -rf "$directory"
"$writer" "$directory" 7 1 > /dev/null
file=$directory/checkpoint-000000000007.h5
# The array starts at its first 7.0 (little-endian 00 00 00 00 00 00 1c 40); the metadata before
# it holds none.
offsets=$(LC_ALL=C grep -obUaP '\x00\x00\x00\x00\x00\x00\x1c\x40' "$file" | cut -d: -f1)
start=${offsets%%$'\n'*}
[[ -n $start ]] || { echo "no array of 7.0 in $file" >&2; exit 1; }
printf '\377' | dd of="$file" bs=1 seek=$((start + 65536)) conv=notrunc status=none
