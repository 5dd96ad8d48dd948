"""``zoo generate`` on a multi-node Ray cluster simulated on this machine (``ray.cluster_utils``:
a head raylet without CPUs, where the driver connects, and two worker raylets on 127.0.0.1), so
every chunk task runs on another node than the driver: into object storage (the loopback S3
server), and into a local folder of the driver's machine while a worker node is killed."""

import json
import threading
import time

import pytest

from generate_helpers import TINY, assert_identical_stores
from zoo.generate.run import GenerateOptions, generate

ray = pytest.importorskip("ray")
QUIET = dict(log=lambda *_: None)
#: chunks slow enough (about a second each) that a node can be killed in the middle of the run
SLOW = dict(kind="sine-regression", limit=48, chunk_size=8, steps=200, progress=False)


@pytest.fixture(scope="module")
def cluster(s3_server):
    """Head (no CPUs: no task runs beside the driver) and two one-CPU worker nodes. Started after
    the S3 server's environment is set, which the nodes' workers inherit."""
    from ray.cluster_utils import Cluster

    head = {"num_cpus": 0, "include_dashboard": False,
            # notice a killed node within about a second and a half
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3}}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    workers = [cluster.add_node(num_cpus=1, wait=False) for _ in range(2)]
    cluster.wait_for_nodes()
    # one driver connection for the module: `zoo generate --address` joins it, and the nodes' workers
    # (their imports take seconds) serve every test instead of starting again for each run
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    yield cluster, workers
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def slow_reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("slow") / "store"
    generate(GenerateOptions(out=str(out), **SLOW), **QUIET)
    return out


def test_tasks_on_other_nodes_write_a_store_to_s3_equal_to_a_local_one(cluster, tiny_store, s3_bucket):
    c, _ = cluster
    url = f"{s3_bucket}/cluster"
    generate(GenerateOptions(out=url, address=c.address, workers=2, **TINY), **QUIET)
    assert_identical_stores(tiny_store, url)
    here = ray.get_runtime_context().get_node_id()  # the driver's node has no CPU for a chunk task
    assert [n["Resources"].get("CPU", 0) for n in ray.nodes() if n["NodeID"] == here] == [0]
    assert sum(n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]) == 2


def test_classifier_images_reach_tasks_on_other_nodes_through_rays_object_store(cluster, tmp_path):
    """The images are put once into the driver node's object store; tasks on the worker nodes
    read them from there and hand their chunks back to the driver, which writes the folder."""
    from clf_helpers import write_cifar_like

    c, _ = cluster
    data = write_cifar_like(tmp_path / "cifar-like", per_batch=30, n_test=60)
    opts = dict(kind="cifar10-classifiers", data_root=str(data), source_options={"verify": False}, limit=6,
                batch_size=16, steps=4, chunk_size=2, progress=False)
    generate(GenerateOptions(out=str(tmp_path / "here"), **opts), **QUIET)
    generate(GenerateOptions(out=str(tmp_path / "cluster"), address=c.address, workers=2, **opts), **QUIET)
    assert_identical_stores(tmp_path / "here", tmp_path / "cluster")


def test_a_run_survives_losing_a_worker_node(cluster, slow_reference, tmp_path):
    """One worker node's processes are killed as soon as two chunks are in (both nodes have just
    started their next chunk, so the killed one dies in the middle of it): its task is retried on
    the other node, and the store (a folder on the driver's machine, written by the driver) is the
    same as an undisturbed one."""
    c, workers = cluster
    out = tmp_path / "store"
    failures = []

    def run():
        try:
            generate(GenerateOptions(out=str(out), address=c.address, workers=2, **SLOW), **QUIET)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.time() + 180
    while time.time() < deadline and thread.is_alive():
        try:
            listed = json.loads((out / "manifest.json").read_text())["complete_chunks"]
        except (FileNotFoundError, json.JSONDecodeError):
            listed = []
        if len(listed) >= 2:
            break
        time.sleep(0.05)
    assert thread.is_alive() and len(listed) < 6, "the run finished before a node could be killed"
    c.remove_node(workers[1], allow_graceful=False)
    thread.join(timeout=300)
    assert not thread.is_alive() and not failures, failures
    assert_identical_stores(slow_reference, out)
