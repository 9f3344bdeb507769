"""A cluster of nodes: the Dask WorkerPlugin mounts on every worker of a real LocalCluster of processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import force_unmount, is_mounted
from tests.support.datasets import kerchunk_refs, oracle_bytes

distributed = pytest.importorskip("distributed")


def read_key(path: str) -> tuple[int, bytes]:
    with open(path, "rb") as f:
        return os.getpid(), f.read()


def test_dask_plugin_mounts_on_every_worker(tmp_path, datasets, http_data):
    from refmount.dask import RefmountPlugin

    refs = kerchunk_refs(datasets["air"], url=http_data.url_for(datasets["air"].name))
    expected = oracle_bytes(refs, "air/0.0.0", url_to_path=http_data.path_for)
    mnt = tmp_path / "shared"
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                      worker_dashboard_address=None) as cluster, distributed.Client(cluster) as client:
            client.register_plugin(RefmountPlugin(refs, str(mnt), view="raw"))
            mounted = client.run(lambda: os.path.ismount(str(mnt)))
            assert len(mounted) == 2 and all(mounted.values())
            futures = [client.submit(read_key, str(mnt / "air" / "0.0.0"), pure=False, workers=[w])
                       for w in client.scheduler_info()["workers"]]
            results = client.gather(futures)
            assert len({pid for pid, _ in results}) == 2  # both workers read
            assert all(data == expected for _, data in results)
            # the two workers shared one mount; unregistering the plugin unmounts it, registering mounts again
            client.unregister_worker_plugin(f"refmount:{mnt}")
            assert not is_mounted(mnt)
            client.register_plugin(RefmountPlugin(refs, str(mnt), view="raw"))
            assert is_mounted(mnt)
        assert not is_mounted(mnt)  # the workers' teardown unmounted it
    finally:
        force_unmount(mnt)
        for path in RefmountPlugin(refs, str(mnt))._state_paths():  # the machine-wide worker count
            Path(path).unlink(missing_ok=True)


def all_chunk_keys(refs) -> list[str]:
    return sorted(k for k in refs["refs"] if not k.rsplit("/", 1)[-1].startswith("."))


def test_shared_cache_tier_serves_the_second_node(tmp_path, datasets, http_data, mount):
    """Two mounts ("two nodes") read through one nginx proxy_cache + slice in front of the origin: the
    second one's cold reads are served by the cache; the origin sees each slice once."""
    from tests.support.nginx import Nginx

    origin = http_data.url
    block = f"""
        location / {{
            slice 1m;
            proxy_cache refs;
            proxy_cache_key $uri$is_args$args$slice_range;
            proxy_set_header Range $slice_range;
            proxy_http_version 1.1;
            proxy_cache_valid 200 206 1h;
            proxy_cache_lock on;
            proxy_pass {origin};
        }}"""
    with Nginx(tmp_path / "cache-tier", block) as tier:
        name = datasets["air"].name
        refs = kerchunk_refs(datasets["air"], url=f"{tier.url}/{name}")
        keys = all_chunk_keys(refs)
        expected = {k: oracle_bytes(refs, k, url_to_path=lambda u: datasets["air"]) for k in keys}
        http_data.reset_stats()
        first = mount(refs, "--view", "raw")
        assert {k: (first / k).read_bytes() for k in keys} == expected
        cold = http_data.stats["requests"]
        assert cold >= 1
        second = mount(refs, "--view", "raw")
        assert {k: (second / k).read_bytes() for k in keys} == expected
        assert http_data.stats["requests"] == cold  # the second node's cold reads never reached the origin
        assert second.stats()["fetch"]["requests"] >= 1  # ... although it did fetch them (from the tier)


def test_proxy_option_and_environment(tmp_path, datasets, http_data, mount):
    """Targets on a host that does not resolve are reachable only through the proxy: with --proxy, and
    with HTTP_PROXY in the environment."""
    from tests.support.nginx import Nginx

    origin = http_data.url
    with Nginx(tmp_path / "proxy", f"location / {{ proxy_pass {origin}; }}") as proxy:
        name = datasets["air"].name
        refs = kerchunk_refs(datasets["air"], url=f"http://data.refmount-test.invalid/{name}")
        key = all_chunk_keys(refs)[0]
        expected = oracle_bytes(refs, key, url_to_path=lambda u: datasets["air"])
        via_option = mount(refs, "--view", "raw", "--proxy", proxy.url, "--read-timeout", "10")
        assert (via_option / key).read_bytes() == expected
        env = {**os.environ, "HTTP_PROXY": proxy.url}
        via_env = mount(refs, "--view", "raw", "--read-timeout", "10", env=env)
        assert (via_env / key).read_bytes() == expected
        assert sum("data.refmount-test.invalid" in line or name in line for line in proxy.access_log()) >= 2
