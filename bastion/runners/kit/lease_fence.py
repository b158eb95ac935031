"""The lease-term check before a create at a provider that takes no fencing token.

Why: a daemon frozen in the middle of a start (SIGSTOP, a VM pause) may resume after a newer
daemon took the lease over, and perhaps ran and deleted this very attempt; its create would
make a second copy. Cloud APIs and cluster schedulers take no fencing token, so the lease
itself is read just before the create, and a start from an older term is refused
(:class:`bastion.runners.base.Fenced`). What is left is the instant between this read and the
call; a resource made in it belongs to no live attempt and the successor's sweep deletes it.

Not to be confused with :mod:`bastion.runners.fence`, the token file on this host that the
local and Docker runners hold across a start.
"""

from __future__ import annotations

from bastion.bucket.store import Store
from bastion.runners.base import Attempt, Fenced


def check_term(store: Store, attempt: Attempt) -> None:
    """Raise :class:`Fenced` when the lease's term is newer than the attempt's ``fence``
    (a start without a lease, ``fence`` 0, is never refused)."""
    if attempt.fence <= 0:
        return
    found = store.lease.read()
    term = int((found[0] if found else {}).get("term") or 0)
    if term > attempt.fence:
        raise Fenced(
            f"lease term {term} is newer than this daemon's {attempt.fence}: "
            f"not creating {attempt.name}"
        )
