"""What ``exec`` accepts: a spec whose command and environment are over it could never
start, so the client refuses it at submit (see ``JobSpec.validate``)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from bastion.spec_errors import SpecError, shorten

MAX_ARG_STRLEN = 131072  # Linux: the most bytes of one argv or environment string, NUL included
# Kept free of a spec's command and env_vars under the platform's ARG_MAX: what the daemon adds
# to a job's environment (its own environment, the BASTION_* variables, AXLearn's serialized
# spec of at most 64 KiB) and the wrapper's own arguments.
EXEC_RESERVE_BYTES = 256 << 10
_POINTER_BYTES = 8  # each argv and envp entry also costs its pointer


class ExecLimitError(SpecError):
    """The spec's command and environment are over what ``exec`` accepts (per string or in
    all): no start could ever succeed, so the client refuses it at submit."""


def exec_arg_max() -> int:
    """This host's ARG_MAX (``sysconf(SC_ARG_MAX)``: on Linux a quarter of the stack limit),
    or 2 MiB where the platform does not say."""
    try:
        value = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError, AttributeError):
        value = -1
    return value if value > 0 else 2 << 20


def exec_limit_problem(
    env: Mapping[str, str],
    args: Sequence[str],
    reserve: int = 0,
    arg_max: int | None = None,
    in_spec: bool = False,
) -> str | None:
    """Why ``exec`` would refuse ``args`` with ``env`` (E2BIG), naming the variable; None when
    it fits. One string (``NAME=VALUE``, or an argument) may be at most MAX_ARG_STRLEN bytes;
    all strings and their pointers together at most ARG_MAX less ``reserve``. ``in_spec``:
    name variables as fields of the spec (``env_vars.NAME``)."""

    def name(key: str) -> str:
        key = shorten(key, 40)
        return f"field env_vars.{key}" if in_spec else f"environment variable {key}"

    fix = (
        "put large data in a file (in the job's bundle or the bucket) and pass its path in "
        "the variable instead"
    )
    sizes = {
        key: len(key.encode(errors="replace")) + len(value.encode(errors="replace")) + 2
        for key, value in env.items()
    }
    for key, size in sizes.items():
        if size > MAX_ARG_STRLEN:
            return (
                f"{name(key)}: {size:,} bytes (NAME=VALUE); exec takes at most "
                f"{MAX_ARG_STRLEN:,} bytes for one environment variable (Linux's "
                f"MAX_ARG_STRLEN): {fix}"
            )
    arg_sizes = [len(arg.encode(errors="replace")) + 1 for arg in args]
    for size in arg_sizes:
        if size > MAX_ARG_STRLEN:
            return (
                f"an argument of {size:,} bytes (the command) is over exec's limit of "
                f"{MAX_ARG_STRLEN:,} bytes for one (Linux's MAX_ARG_STRLEN): put the long part "
                "in a file of the bundle and run that"
            )
    total = sum(sizes.values()) + sum(arg_sizes) + _POINTER_BYTES * (len(sizes) + len(args) + 2)
    arg_max = arg_max or exec_arg_max()
    limit = arg_max - reserve
    if total <= limit:
        return None
    largest = sorted(sizes, key=lambda k: -sizes[k])[:3]
    named = ", ".join(f"{name(k).removeprefix('field ')} ({sizes[k]:,} bytes)" for k in largest)
    kept = f", less {reserve:,} kept for what the daemon adds" if reserve else ""
    return (
        f"{'field env_vars: ' if in_spec else ''}"
        f"the command and environment are {total:,} bytes in all; exec takes at most "
        f"{limit:,} (this host's ARG_MAX of {arg_max:,}{kept}); the largest: "
        f"{named or 'none'}: {fix}"
    )
