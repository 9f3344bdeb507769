"""A cluster of nodes: the Dask WorkerPlugin mounts on every worker of a real LocalCluster of processes."""

from __future__ import annotations

import os

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
