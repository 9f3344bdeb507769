#!/usr/bin/env bash
# The WAN benchmark (issue 13), as root on Debian 12:
#
#     bench/bench_wan.sh [--quick] [--rtt 0,20,80] [other bench_wan.py options]
#
# Installs what is missing (nginx-light, rclone, curl, iproute2, fuse3, and for --link nfqueue iptables,
# gcc and libnetfilter-queue-dev, from Debian), then runs
# bench/bench_wan.py, which builds its own network namespace and veth pair, serves from nginx inside the
# namespace, measures refmount, rclone mount, fsspec and curl at each RTT and prints one table. The
# benchmark removes everything it made; this EXIT trap removes whatever is left if it was killed outright:
# its mounts, its namespaces (with nginx, the delay proxy and nfqdelay in them, stopped by the pids in
# their pid files) and its veth pair.
# Not part of CI.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
venv=${REFMOUNT_VENV:-/tmp/v}
python=$venv/bin/python

[ "$(id -u)" = 0 ] || { echo "bench_wan.sh: needs root (network namespaces, FUSE mounts, drop_caches)" >&2; exit 1; }
[ -x "$python" ] || { echo "bench_wan.sh: no venv at $venv (set REFMOUNT_VENV)" >&2; exit 1; }

missing=()
for pair in nginx:nginx-light rclone:rclone curl:curl ip:iproute2 tc:iproute2 fusermount3:fuse3 \
        iptables-legacy:iptables gcc:gcc; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
[ -e /usr/include/libnetfilter_queue/libnetfilter_queue.h ] || missing+=(libnetfilter-queue-dev)
if ((${#missing[@]})); then
    echo "bench_wan.sh: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(printf '%s\n' "${missing[@]}" | sort -u) >/dev/null
fi

run_dir=$(mktemp -d /tmp/refmount-wan-run.XXXXXX)
serve_dir=$(mktemp -d /dev/shm/refmount-wan-data.XXXXXX)

cleanup() {
    local mnt ns veth router pid
    for mnt in "$run_dir"/mnt-*; do
        mountpoint -q "$mnt" 2>/dev/null && fusermount3 -u -z "$mnt" 2>/dev/null || true
    done
    if [ -s "$run_dir/proxy.pid" ]; then  # bench/delayproxy.py (kernels without sch_netem)
        pid=$(cat "$run_dir/proxy.pid")
        kill "$pid" 2>/dev/null || true
    fi
    if [ -s "$run_dir/nfqdelay.pid" ]; then  # bench/nfqdelay.c (--link nfqueue)
        pid=$(cat "$run_dir/nfqdelay.pid")
        kill "$pid" 2>/dev/null || true
    fi
    if [ -s "$run_dir/nginx.pid" ]; then
        pid=$(cat "$run_dir/nginx.pid")
        kill "$pid" 2>/dev/null || true
    fi
    if [ -s "$run_dir/link" ]; then
        read -r ns veth router < "$run_dir/link"
        ip link del "$veth" 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
        [ -z "$router" ] || ip netns del "$router" 2>/dev/null || true
    fi
    rm -rf --one-file-system "$run_dir" "$serve_dir"
}
on_signal() {
    [ -n "${pypid:-}" ] && kill -TERM "$pypid" 2>/dev/null && wait "$pypid" 2>/dev/null
    exit "$1"
}
trap cleanup EXIT
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
trap 'on_signal 129' HUP

export BENCH_COMMAND="bench/bench_wan.sh $*"  # the command line the run's JSON records
"$python" "$here/bench_wan.py" --run-dir "$run_dir" --serve-dir "$serve_dir" "$@" &
pypid=$!
wait "$pypid"
