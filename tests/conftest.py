import os
import uuid

import pytest

from tests.docker_engine import docker_engine  # noqa: F401 (a session fixture)
from tests.gcs_emulator import GcsEmulator
from tests.harness import Bastion
from tests.kube_cluster import cluster, kube  # noqa: F401 (a real kube-apiserver, played controllers)
from tests.slurm_cluster import slurm, slurm_cluster  # noqa: F401 (session fixture and its reset)

BUCKET = "bastion-test"


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """One emulator for the session; each test gets its own prefix in one bucket."""
    emulator = GcsEmulator(tmp_path_factory.mktemp("gcs")).start()
    emulator.create_bucket(BUCKET)
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
        root = f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"
    b = Bastion(tmp_path, root=root)
    yield b
    b.close()


@pytest.fixture
def local_bastion(tmp_path):
    b = Bastion(tmp_path)
    yield b
    b.close()
