#!/usr/bin/env bash
# The main job on the shipped example: serve a compressed netCDF-4 file over local HTTP, mount its
# kerchunk reference set, look at it with ls, cat and Debian's ncdump, and unmount.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${REFMOUNT_PYTHON:-$here/../.venv/bin/python}"
refmount="${REFMOUNT:-$here/../.venv/bin/refmount}"
work="$(mktemp -d /tmp/refmount-example.XXXXXX)"
mnt="$work/mnt"
server_pid=""

cleanup() {
  if grep -qs " $mnt " /proc/mounts; then "$refmount" umount "$mnt" || fusermount3 -u -z "$mnt" || true; fi
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n$ %s\n' "$*"; "$@"; }

"$python" "$here/serve.py" "$here" "$work/port" &
server_pid=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.05; done
port="$(cat "$work/port")"
echo "serving $here on http://127.0.0.1:$port (Range requests honoured)"

# The shipped reference set names its server through a v1 template; point it at this port.
sed "s#http://127.0.0.1:8642#http://127.0.0.1:$port#" "$here/air-zlib.json" > "$work/air-zlib.json"
mkdir "$mnt"

step "$refmount" mount "$work/air-zlib.json" "$mnt"
step ls -l "$mnt" "$mnt/air"
step cat "$mnt/air/.zarray"
step getfattr -d "$mnt/air/0.0.0"
step ncdump -h "file://$mnt#mode=nczarr,file"

echo
echo "\$ ncdump -v lat,lon 'file://$mnt#mode=nczarr,file' | sed -n '/^data:/,\$p'"
ncdump -v lat,lon "file://$mnt#mode=nczarr,file" | sed -n '/^data:/,$p'

# A slice of the compressed variable, and a check of every value against the source file.
data_of() { ncdump -v air "$1" | sed -n '/^ air =/,$p'; }
echo
echo "first values of air (time 0), through the mount:"
data_of "file://$mnt#mode=nczarr,file" | sed -n 1,4p  # (head would SIGPIPE ncdump under pipefail)
if diff <(data_of "file://$mnt#mode=nczarr,file") <(data_of "$here/air-zlib.nc") >/dev/null; then
  echo "all $(( 124 * 11 * 21 )) values of air equal ncdump of the source netCDF-4 file"
else
  echo "MISMATCH between the mount and the source file" >&2
  exit 1
fi

step "$refmount" list
step "$refmount" stats "$mnt"
step "$refmount" umount "$mnt"

# The netCDF-4 file itself, from the same server, with no reference set: scanned at mount.
step "$refmount" mount "http://127.0.0.1:$port/air-zlib.nc" "$mnt"
if diff <(data_of "file://$mnt#mode=nczarr,file") <(data_of "$here/air-zlib.nc") >/dev/null; then
  echo "the file mounted directly: all $(( 124 * 11 * 21 )) values of air equal ncdump of the file"
else
  echo "MISMATCH between the directly mounted file and the file" >&2
  exit 1
fi
step "$refmount" umount "$mnt"
echo
echo "example finished: mounted (references, then the file itself), listed, read with ncdump and unmounted"
