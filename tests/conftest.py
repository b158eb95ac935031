import os
import uuid

import pytest

from tests.docker_engine import docker_engine  # noqa: F401 (a session fixture)
from tests.gcs_emulator import GcsEmulator
from tests.harness import Bastion
from tests.kube_cluster import cluster, kube  # noqa: F401 (a real kube-apiserver, played controllers)
from tests.s3_server import s3_server  # noqa: F401 (a session fixture: moto's S3 server)
from tests.slurm_cluster import slurm, slurm_cluster  # noqa: F401 (session fixture and its reset)

BUCKET = "bastion-test"  # the session emulator's shared bucket, for a few objects only
_SESSION: list[GcsEmulator] = []


def fresh_gcs_root(prefix: str = "root") -> str:
    """``gs://<a new bucket>/<prefix>`` on the session emulator (its fixture must be up).

    A bucket per root, not a prefix in one shared bucket: fake-gcs-server's writes slow down
    with every object already in their bucket (a create took 1.2 ms in an empty bucket and
    9.4 ms beside 3,000 objects), so one bucket shared by the whole session made every GCS
    test near its end several times slower than at its start, and timed some of them out."""
    bucket = f"bastion-test-{uuid.uuid4().hex[:16]}"
    _SESSION[0].create_bucket(bucket)
    return f"gs://{bucket}/{prefix}"


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """One emulator for the session; each root gets a bucket of its own (fresh_gcs_root)."""
    emulator = GcsEmulator(tmp_path_factory.mktemp("gcs")).start()
    emulator.create_bucket(BUCKET)
    _SESSION.append(emulator)
    os.environ["STORAGE_EMULATOR_HOST"] = emulator.endpoint
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    yield emulator
    emulator.stop()


@pytest.fixture(params=["local", "gcs"])
def bastion(request, tmp_path):
    """A Bastion root on a local directory, and the same on gs:// (the GCS emulator)."""
    root = None
    if request.param == "gcs":
        request.getfixturevalue("gcs_emulator")
        root = fresh_gcs_root()
    b = Bastion(tmp_path, root=root)
    yield b
    b.close()


@pytest.fixture
def local_bastion(tmp_path):
    b = Bastion(tmp_path)
    yield b
    b.close()
