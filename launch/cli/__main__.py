"""``python -m launch.cli``: the ``bastion`` command."""

from launch.cli.main import run

run()
