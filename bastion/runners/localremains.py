"""What a local attempt left behind once its wrapper ended, and the stops it was told.

A stop signals the attempt's process group; whatever is still alive once the wrapper has ended
(a process that left the group with ``setsid``, a background child the command did not wait
for) is found by the ``BASTION_ATTEMPT_NAME`` marker every process of an attempt carries
(:mod:`bastion.leftovers`), gets SIGTERM, SIGKILL after the grace, and is named in the
attempt's history. The record (``left_behind`` in the attempt's directory: the history line,
the pids, when SIGKILL is due) is kept on disk, so a restarted daemon finishes the job and
notes the attempt's end once.

The local runner composes one :class:`Remains`; it knows nothing of how attempts start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from bastion import leftovers
from bastion.outputs.supervise import JOB_GROUP_FILE
from bastion.runners.base import Handle
from bastion.runners.localproc import in_group, leader_gone, read_int, read_json, write_json

log = logging.getLogger("bastion.runners.local")

RECORD = "left_behind"  # in the attempt's directory


class Remains:
    """The stops told to each attempt (their deadlines, whether the group was warned) and
    what each left behind. ``dir_of`` names an attempt's directory."""

    def __init__(self, prefix: str, dir_of: Callable[[str], str], grace: float) -> None:
        self.grace = grace  # seconds from SIGTERM to SIGKILL for what outlived the command
        self._dir = dir_of
        self._scanner = leftovers.Scanner(prefix)  # one /proc scan for many askers
        self._warned: set[str] = set()  # attempts whose group got the stop's SIGTERM
        self._deadlines: dict[str, float] = {}  # attempt -> its stop's deadline
        self._records: dict[str, dict[str, Any]] = {}  # attempt -> its left_behind record

    # -- stops -----------------------------------------------------------------------------

    def note_deadline(self, name: str, deadline: float) -> float | None:
        """A stop's deadline (what the attempt leaves behind gets this grace too); the one
        noted before, if any."""
        told = self._deadlines.get(name)
        self._deadlines[name] = deadline
        return told

    def warned(self, name: str) -> bool:
        return name in self._warned

    def mark_warned(self, name: str) -> None:
        """The group got the stop's SIGTERM: its members are not sent a second one (a second
        SIGTERM means "now" to many programs)."""
        self._warned.add(name)

    def forget(self, name: str) -> None:
        """The attempt is deleted: nothing of it is remembered."""
        self._warned.discard(name)
        self._deadlines.pop(name, None)
        self._records.pop(name, None)

    # -- what is left ----------------------------------------------------------------------

    def record(self, handle: Handle) -> dict[str, Any]:
        """Once, when the wrapper has ended: SIGTERM whatever of the attempt still runs (its
        group, and every process carrying its marker wherever it went) and record it, with
        the history line that names it and when SIGKILL is due (:meth:`gone` sends it). Asked
        again, the same record: one attempt's end is noted once, on a restarted daemon too."""
        name = str(handle["name"])
        record = self._records.get(name)
        if record is None:
            record = read_json(os.path.join(self._dir(name), RECORD))
        if record is None:
            found = self._scanner.find(name, since=self._ended_at(handle))
            # A scan begun as the wrapper was exiting sees it, and perhaps its own `mv`: the
            # wrapper's, not left behind (no orphan has the wrapper for a parent: it waits).
            wrapper = int(handle.get("pid") or 0)
            found = [p for p in found if wrapper not in (p.pid, p.ppid)]
            record = self._end(handle, found, {})
        self._records[name] = record
        return record

    def gone(self, handle: Handle) -> bool:
        """For ``delete``: True once a scan made after the wrapper ended finds nothing of the
        attempt; until then SIGTERM what is new, SIGKILL everything once the grace is over."""
        name = str(handle["name"])
        record = self.record(handle)
        if not record.get("pids"):
            return True  # a scan begun after the wrapper had ended found nothing of it
        found = self._scanner.find(name)  # (a fresh scan: after our signals)
        if not found:
            return True
        if {p.pid for p in found} - set(record.get("pids") or []):
            record = self._end(handle, found, record)  # forked since, or an adopted attempt's
            self._records[name] = record
        if time.time() >= float(record.get("kill_at") or 0):
            log.warning("%s: SIGKILL to %s", name, ", ".join(map(str, found)))
            _signal_group(handle, signal.SIGKILL)
            leftovers.send(found, signal.SIGKILL)
        return False

    def _ended_at(self, handle: Handle) -> float:
        """When the command ended: its ``exit`` file's time (the wrapper writes it once the
        command has ended), else now (killed, or gone before it could write it)."""
        try:
            return os.path.getmtime(os.path.join(self._dir(handle["name"]), "exit"))
        except OSError:
            return time.time()

    def _end(
        self, handle: Handle, found: list[leftovers.Process], record: dict[str, Any]
    ) -> dict[str, Any]:
        """SIGTERM the processes ``found`` that were not signalled yet, and the group. A stop
        has already sent SIGTERM to the group: its members are not sent a second one. Returns
        the record, kept on disk."""
        name = str(handle["name"])
        warned = name in self._warned
        job_group = read_int(os.path.join(self._dir(name), JOB_GROUP_FILE)) or 0
        groups = {int(handle.get("pid") or 0), job_group} - {0}  # (both got the stop's warning)
        if not warned:
            _signal_group(handle, signal.SIGTERM)  # (unmarked members of the group too)
        signalled = set(record.get("pids") or [])
        leftovers.send(
            [p for p in found if p.pid not in signalled and not (warned and in_group(p, groups))],
            signal.SIGTERM,
        )
        if found:
            log.warning("%s: %s (SIGTERM)", name, leftovers.describe(found))
        grace_until = max(time.time() + self.grace, self._deadlines.get(name, 0.0))
        record = {
            "note": record.get("note", leftovers.describe(found) if found else ""),
            "pids": sorted(signalled | {p.pid for p in found}),
            "kill_at": record.get("kill_at") or (grace_until if found else None),
        }
        if record["pids"]:  # (nothing found: nothing a restarted daemon must finish)
            with contextlib.suppress(OSError):  # (its directory already gone: nothing to keep)
                write_json(os.path.join(self._dir(name), RECORD), record)
        return record


def _signal_group(handle: Handle, sig: int) -> None:
    """Signal the finished attempt's group: what is left in it is ours."""
    pid = int(handle.get("pid") or 0)
    if pid <= 0 or not leader_gone(handle):
        return  # a live process that is not ours holds the pid: never signal its group
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
