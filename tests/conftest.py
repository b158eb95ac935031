import pytest

from tests.harness import Bastion


@pytest.fixture
def bastion(tmp_path):
    b = Bastion(tmp_path)
    yield b
    b.close()
