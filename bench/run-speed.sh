#!/usr/bin/env bash
# One command for the speed benchmark (Debian 12, as root):
#
#     bench/run-speed.sh [--quick] [other bench_speed.py options]
#
# Installs what is missing (nginx-light, rclone, curl, netcdf-bin, fuse3 from Debian; matplotlib into the
# venv), then runs bench/bench_speed.py, which starts its own nginx on a free loopback port, mounts,
# measures, prints one table and writes bench/out/speed.json and bench/out/speed.png.
# Ctrl-C or SIGTERM is forwarded to the benchmark, which unmounts and stops its nginx; the EXIT trap then
# removes whatever is left even if the benchmark was killed outright: its mounts, its nginx (by the pid in
# its own pid file) and its scratch directories.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
venv=${REFMOUNT_VENV:-/tmp/v}
python=$venv/bin/python

[ "$(id -u)" = 0 ] || { echo "run-speed.sh: needs root (FUSE mounts, drop_caches, apt-get)" >&2; exit 1; }
[ -x "$python" ] || { echo "run-speed.sh: no venv at $venv (set REFMOUNT_VENV)" >&2; exit 1; }

missing=()
for pair in nginx:nginx-light rclone:rclone curl:curl ncdump:netcdf-bin fusermount3:fuse3; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
if ((${#missing[@]})); then
    echo "run-speed.sh: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
"$python" -c 'import matplotlib' 2>/dev/null || "$python" -m pip install -q matplotlib

run_dir=$(mktemp -d /tmp/refmount-speed-run.XXXXXX)
serve_dir=$(mktemp -d /dev/shm/refmount-speed-data.XXXXXX)

cleanup() {
    local mnt pid
    for mnt in "$run_dir"/mnt-*; do
        mountpoint -q "$mnt" 2>/dev/null && fusermount3 -u -z "$mnt" 2>/dev/null || true
    done
    if [ -s "$run_dir/nginx.pid" ]; then
        pid=$(cat "$run_dir/nginx.pid")
        kill "$pid" 2>/dev/null || true
    fi
    rm -rf --one-file-system "$run_dir" "$serve_dir"
}
on_signal() {  # forward to the benchmark (it unmounts and stops nginx itself), then clean up what is left
    [ -n "${pypid:-}" ] && kill -TERM "$pypid" 2>/dev/null && wait "$pypid" 2>/dev/null
    exit "$1"
}
trap cleanup EXIT
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
trap 'on_signal 129' HUP

# In the background so that a signal reaches the trap at once rather than after the benchmark ends.
export BENCH_COMMAND="bench/run-speed.sh $*"  # the command line the run's JSON records
"$python" "$here/bench_speed.py" --run-dir "$run_dir" --serve-dir "$serve_dir" "$@" &
pypid=$!
wait "$pypid"
