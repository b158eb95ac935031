"""Each project's queue from a caller's last pass, for its next (``QueueMemo``): the daemon
plans the same queue again and again, and sorting 100,000 waiting jobs afresh each time took a
sixth of a pass. Pure: a cache whose every answer is what sorting afresh gives.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from itertools import compress, count, islice
from operator import is_not

from quota.model import JobRequest


class QueueMemo:
    """Each project's queue from the caller's last pass, for the next (a cache: what it gives
    is what sorting afresh gives). At 100,000 waiting jobs, making and comparing their sort
    keys took a sixth of a pass, though from one pass to the next a queue mostly gains or
    loses a few jobs and its users keep their order. The daemon hands in its jobs in a stable
    order, the same request object for a job that did not change; so this pass's jobs are
    compared with the last pass's, object by object (in C), and when they differ by a few
    taken out, put in or replaced, the last order stands less those gone, with the new ones
    put in place by bisection. It is sorted afresh when the users' order changed (see
    ``group_ranks``) or more changed than ``MOST_CHANGES``."""

    MOST_CHANGES = 32  # (each one found costs a walk of the list in C; a bisection moves it)

    def __init__(self) -> None:
        # project -> (ranks, its jobs as handed in, in queue order)
        self._last: dict[str, tuple[tuple, list[JobRequest], list[JobRequest]]] = {}

    def ordered(
        self,
        project: str,
        filed: list[JobRequest],
        ranks: tuple,
        key: Callable[[JobRequest], tuple],
    ) -> list[JobRequest]:
        """``filed`` (the project's valid pending jobs as handed in) in queue order."""
        last = self._last.get(project)
        queue: list[JobRequest] | None = None
        if last is not None and last[0] == ranks:
            changes = _changes(last[1], filed, self.MOST_CHANGES)
            if changes is not None:
                queue = _edited(last[2], *changes, key)
        if queue is None:
            queue = sorted(filed, key=key)
        self._last[project] = (ranks, filed, queue)
        return list(queue)  # (the pass's own list: the memo's is never handed out)

    def keep_only(self, projects: Mapping[str, object]) -> None:
        """Forget the projects that have no valid pending job now."""
        for p in [p for p in self._last if p not in projects]:
            del self._last[p]


def _changes(
    before: list[JobRequest], after: list[JobRequest], most: int
) -> tuple[list[JobRequest], list[JobRequest]] | None:
    """The requests gone from ``before`` and new in ``after`` when ``after`` is ``before``
    with at most ``most`` of them taken out, put in or replaced, the others in the same order
    and the same objects; None otherwise. Any alignment found is a right answer (a job that
    moved is gone and new: taken out and put back in place), so at a difference the walk
    takes the first explanation that fits."""
    gone: list[JobRequest] = []
    new: list[JobRequest] = []
    i = j = 0
    while True:
        same = map(is_not, islice(before, i, None), islice(after, j, None))
        k = next(compress(count(), same), None)  # (the first difference, found in C)
        if k is None:  # one list ended: the other's tail is gone, or new
            common = min(len(before) - i, len(after) - j)
            gone += before[i + common :]
            new += after[j + common :]
            break
        i, j = i + k, j + k
        if len(gone) + len(new) >= most:
            return None
        if i + 1 < len(before) and before[i + 1] is after[j]:
            gone.append(before[i])
            i += 1
        elif j + 1 < len(after) and before[i] is after[j + 1]:
            new.append(after[j])
            j += 1
        else:
            gone.append(before[i])
            new.append(after[j])
            i, j = i + 1, j + 1
    return (gone, new) if len(gone) + len(new) <= most else None


def _edited(
    queue: list[JobRequest],
    gone: list[JobRequest],
    new: list[JobRequest],
    key: Callable[[JobRequest], tuple],
) -> list[JobRequest]:
    """``queue`` (sorted by ``key``, every key distinct: names are) less ``gone``, plus
    ``new`` in place."""
    if not (gone or new):
        return queue
    out = list(queue)
    for j in gone:
        at = bisect.bisect_left(out, key(j), key=key)
        if at < len(out) and out[at] is j:
            del out[at]
        else:  # (not where its key puts it: cannot be, but never wrong)
            out.remove(j)
    for j in new:
        bisect.insort(out, j, key=key)
    return out


def group_ranks(
    groups: set[tuple[str, int, str]], user_usage: Mapping[str, float]
) -> dict[str, tuple]:
    """Per project, its (priority, user) groups in queue order with the rank of their key
    (equal keys, equal ranks: their jobs interleave by arrival). A queue sorted under one
    usage is sorted under another exactly when these are the same: jobs of one group keep
    their order whatever the usage, and two groups compare as their ranks do."""
    uu = user_usage.get
    by_project: dict[str, list[tuple[int, float, str]]] = {}
    for p, priority, user in groups:
        by_project.setdefault(p, []).append((priority, uu(user, 0.0), user))
    out = {}
    for p, entries in by_project.items():
        entries.sort()
        ranked, rank, before = [], -1, None
        for priority, usage, user in entries:
            if (priority, usage) != before:
                rank, before = rank + 1, (priority, usage)
            ranked.append((priority, user, rank))
        out[p] = tuple(ranked)
    return out
