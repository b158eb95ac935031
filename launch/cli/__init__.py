"""The ``bastion`` command: one verb per user action, flags in absl style (as AXLearn's).

    bastion start [--poll_seconds=S] [--once]
    bastion launch --name=N --project_id=P [--resources=v4=8,cpu=4] [--priority=3] -- CMD...
    bastion list [--all] [--json]        bastion logs NAME [--follow] [--exit_status]
    bastion cancel NAME [--force]        bastion history NAME
    bastion update NAME [--force] -- CMD...  bastion why NAME
    bastion quota check FILE             bastion simulate --quota_file=F --trace=T [--json]

Every verb takes --root (else $BASTION_ROOT, else a local directory). Each module of this
package holds a few verbs with the flags only they take (``submit``, ``view``, ``admin``);
``common`` holds the flags several verbs share; ``main`` parses, checks and dispatches.
A new verb is a ``Verb`` in one of those modules (or a new one listed in ``main.VERB_MODULES``).
"""

from launch.cli.main import main, run

__all__ = ["main", "run"]
