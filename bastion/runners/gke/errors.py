"""What the apiserver's refusals mean for a job: one clear reason the user acts on, or a retry.

Why apart: every call the runner makes (list, create, get, delete) turns an ``ApiException``
into the same words: no credentials (401), RBAC (403: which verb on which resource), the JobSet
CRD or the namespace missing (404), an admission webhook's or the schema's refusal (400/422,
with the apiserver's own message); a transient answer (429, 5xx, no answer) is tried again.
"""

from __future__ import annotations

import json

from bastion.runners.base import RunnerError, TryAgain
from bastion.runners.gke.shape import GROUP, PLURAL, VERSION

RETRYABLE_STATUS = frozenset({0, 408, 429, 500, 502, 503, 504})


def brief(text: str, limit: int = 300) -> str:
    """``text`` on one line, at most ``limit`` characters: what a reason can carry."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def api_message(error: Exception) -> str:
    """The apiserver's Status message of an ApiException (its body), else the error's text."""
    body = getattr(error, "body", None)
    try:
        status = json.loads(body) if body else {}
    except (TypeError, ValueError):
        status = {}
    if not isinstance(status, dict):
        status = {}
    return brief(status.get("message") or getattr(error, "reason", None) or str(error))


def refusal(error: Exception, verb: str, what: str) -> Exception:
    """What an ApiException means for the job: RunnerError (the user acts) or TryAgain."""
    code = int(getattr(error, "status", 0) or 0)
    message = api_message(error)
    if code in RETRYABLE_STATUS:
        return TryAgain(f"{verb} {what}: the apiserver answered {code}: {message}")
    if code == 401:
        return RunnerError(
            f"the cluster refused the daemon's credentials (401 Unauthorized) "
            f"to {verb} {what}: {message}; fix [runners.gke] kubeconfig/context"
        )
    if code == 403 and "admission webhook" in message:
        return _rejected(code, verb, what, message)
    if code == 403:
        return RunnerError(
            f"forbidden to {verb} {what} (403): {message}; grant the daemon's "
            f"account '{verb}' on {PLURAL}.{GROUP} in RBAC"
        )
    if code == 404 and "namespace" in message.lower():
        return RunnerError(f"cannot {verb} {what}: {message}; fix [runners.gke] namespace")
    if code == 404:
        return RunnerError(
            f"cannot {verb} {what}: the JobSet CRD ({PLURAL}.{GROUP}/{VERSION}) is "
            f"not installed in the cluster ({message}); install JobSet "
            "(kubectl apply --server-side -f the JobSet release manifests)"
        )
    if code in (400, 422):
        return _rejected(code, verb, what, message)
    return RunnerError(f"the cluster refused to {verb} {what} ({code}): {message}")


def _rejected(code: int, verb: str, what: str, message: str) -> RunnerError:
    """The manifest itself was refused (validation or an admission webhook): retrying the
    same JobSet cannot help, so the job fails at once with the cluster's words."""
    by = "an admission webhook" if "admission webhook" in message else "the cluster's validation"
    return RunnerError(
        f"{by} refused to {verb} {what} ({code}): {message}; change the job's options "
        "or the cluster's policy, then submit again"
    )
