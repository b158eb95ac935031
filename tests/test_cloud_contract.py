"""The runner contract (tests/runner_contract.py) on the Google runners: ``tpu``, ``tpu-qr`` and
``gce``, through the real googleapiclient against their stand-ins (tests/standins), with the
real agent on each "VM" (the stand-in's on_ready hook starts the startup script, as in
tests/test_cloud_runners.py). The stand-in's clock ticks every 0.1 s in a thread, as a cloud
moves on its own whether anyone polls; the root is a local directory the agents write to.

Two documented differences from a runner on this host: a cloud delete is verified on a later
call (``deletes_at_once = False``), and ``stop`` deletes the machines at once, whatever the
deadline (``stop_waits_for_deadline = False``): the VMs' shutdown is the agent's grace.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from bastion.runners import base
from tests.runner_contract import RunnerContract
from tests.standins.compute import ComputeServer
from tests.standins.tpu import TpuServer
from tests.test_cloud_runners import Guests, settings


def _tick(server, stop: threading.Event) -> None:
    while not stop.wait(0.1):
        server.tick()


class CloudContract(RunnerContract):
    server_type: type = TpuServer
    deletes_at_once = False
    stop_waits_for_deadline = False
    timeout = 60.0

    def make_root(self, tmp_path) -> str:
        return str(tmp_path / f"root-{uuid.uuid4().hex[:8]}")

    @pytest.fixture(autouse=True)
    def _cloud(self, tmp_path):
        guests = Guests(tmp_path)
        stop = threading.Event()
        with self.server_type(on_ready=guests.on_ready) as server:
            self.server = server
            ticker = threading.Thread(target=_tick, args=(server, stop), daemon=True)
            ticker.start()
            yield
            stop.set()
            ticker.join(10)
            guests.close()

    def make_runner(self, tmp_path):
        runner = base.factory_for(self.kind)(settings(self.root, self.server.endpoint))
        runner.sleep = lambda _s: None
        return runner

    def attempt(self, name_suffix, command, root=None, **options):
        return super().attempt(name_suffix, command, root, **self.options, **options)


class TestTpuContract(CloudContract):
    __test__ = True
    kind = "tpu"
    options = {"accelerator_type": "v4-8"}


class TestQueuedContract(CloudContract):
    __test__ = True
    kind = "tpu-qr"
    options = {"accelerator_type": "v4-8"}


class TestGceContract(CloudContract):
    __test__ = True
    kind = "gce"
    server_type = ComputeServer
    options = {"machine_type": "a3-highgpu-8g"}
