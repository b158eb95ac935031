"""What every Google runner repeats: the client, one execute, pages, deletes, labels.

Why here: the TPU, queued-resource and Compute runners (and a GKE runner) call Google APIs the
same way: a googleapiclient resource built offline from the packaged discovery document, each
thread with its own HTTP connection (httplib2 is not thread-safe and the daemon polls from a
pool), the same answers retried (429, 5xx and Compute's 403 rate limits), listings read to
their last page, and a delete that treats 404 as done. Ownership is labels, one scheme for
every resource: ``bastion-root`` (the daemon's root), ``bastion-runner`` (the runner kind that
made it), ``bastion-attempt-name`` (the attempt it is), and ``bastion-job`` /
``bastion-attempt`` for people.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

from google_auth_httplib2 import AuthorizedHttp
from googleapiclient import discovery
from googleapiclient.errors import HttpError
from googleapiclient.http import build_http

from bastion.runners.base import Attempt, CannotStart, RunnerError

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
RATE_LIMIT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded"})
ROOT_LABEL = "bastion-root"
RUNNER_LABEL = "bastion-runner"
ATTEMPT_LABEL = "bastion-attempt-name"


def retryable(error: Exception) -> bool:
    """429 and 5xx, and a 403 whose reason is a rate limit (Compute answers a burst of calls
    with 403 rateLimitExceeded, which is not a refusal of the request)."""
    if not isinstance(error, HttpError):
        return False
    if error.status_code in RETRYABLE_STATUS:
        return True
    details = error.error_details if isinstance(error.error_details, list) else []
    return error.status_code == 403 and any(
        isinstance(d, dict) and d.get("reason") in RATE_LIMIT_REASONS for d in details
    )


def build_client(api: str, version: str, endpoint: str | None, credentials: str | None = None):
    """A googleapiclient resource from the packaged (static, offline) discovery document.
    With an explicit endpoint (a stand-in) the credentials are anonymous unless
    ``credentials`` is ``"default"``; with Google's, google-auth's standard chain."""
    import google.auth
    import google.auth.exceptions
    from google.auth.credentials import AnonymousCredentials

    if endpoint and credentials != "default":
        creds = AnonymousCredentials()
    else:
        try:
            creds, _ = google.auth.default(
                scopes=["https://www.googleapis.com/auth/cloud-platform"]
            )
        except google.auth.exceptions.DefaultCredentialsError as e:
            raise CannotStart(
                f"no Google credentials for the {api} API ({_first_sentence(e)}); on the daemon's "
                "machine run `gcloud auth application-default login`, or set "
                "GOOGLE_APPLICATION_CREDENTIALS to a service account key file"
            ) from None
    options = {"api_endpoint": endpoint} if endpoint else None
    return discovery.build(
        api,
        version,
        static_discovery=True,
        cache_discovery=False,
        credentials=creds,
        client_options=options,
    )


def _first_sentence(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text.split(". ")[0].rstrip(".")


def refusal(error: Exception) -> CannotStart | None:
    """A 401 or 403 that is not a rate limit (no credentials accepted, permission denied, the
    API not enabled): nothing this daemon starts can succeed until someone fixes it."""
    if not isinstance(error, HttpError) or error.status_code not in (401, 403) or retryable(error):
        return None
    return CannotStart(
        f"the Google API refused the daemon's credentials ({error.status_code}: "
        f"{_first_sentence(Exception(error.reason or error))}); grant its account the role "
        "the runner needs or enable the API in the project"
    )


class GoogleApi:
    """A client and how to call it: ``execute`` with bounded retries on a per-thread
    connection; ``sleep`` is the retries' pause (tests make it instant)."""

    def __init__(self, client: Any, num_retries: int) -> None:
        self.client = client
        self.num_retries = num_retries
        self.sleep: Callable[[float], None] = time.sleep
        self._local = threading.local()

    def execute(self, request: Any, retries: int | None = None) -> Any:
        """googleapiclient retries 429/5xx with exponential backoff, bounded by ``retries``
        (default ``num_retries``), on this thread's own connection (same credentials, with
        googleapiclient's default timeout)."""
        request._sleep = self.sleep
        http = getattr(self._local, "http", None)
        if http is None:
            creds = getattr(request.http, "credentials", None)
            http = build_http() if creds is None else AuthorizedHttp(creds, http=build_http())
            self._local.http = http
        return request.execute(
            http=http, num_retries=self.num_retries if retries is None else retries
        )

    def paginate(self, list_call: Callable[[str | None], Any], key: str) -> list[dict]:
        """Every item of a paged listing: ``list_call(page_token)`` makes the request of one
        page; ``key`` names the page's items (``nodes``, ``queuedResources``, ``items``)."""
        found: list[dict] = []
        token = None
        while True:
            page = self.execute(list_call(token))
            found += page.get(key) or []
            if not (token := page.get("nextPageToken")):
                return found

    def delete(self, request: Any) -> None:
        """Issue a delete; a 404 (already gone) is success."""
        try:
            self.execute(request)
        except HttpError as e:
            if e.status_code != 404:
                raise


_LABEL_BAD = re.compile(r"[^a-z0-9_-]+")


def label_value(text: str) -> str:
    """A legal GCP label value: lowercase ``[a-z0-9_-]``, at most 63 characters."""
    return _LABEL_BAD.sub("-", text.lower()).strip("-")[:63]


def labels_for(attempt: Attempt, tag: str, kind: str) -> dict[str, str]:
    """What a resource is, in labels (see the module's docstring).

    An attempt name is an RFC 1035 label of at most 63 characters (lowercase letters, digits,
    hyphens): a legal label value as it is, checked here rather than silently changed."""
    if label_value(attempt.name) != attempt.name:
        raise RunnerError(f"attempt name {attempt.name!r} is not a legal label value")
    return {
        ROOT_LABEL: tag,
        RUNNER_LABEL: kind,
        ATTEMPT_LABEL: attempt.name,
        "bastion-job": label_value(attempt.job) or "job",
        "bastion-attempt": str(attempt.attempt),
    }


def short_name(resource: dict) -> str:
    """``projects/p/locations/z/nodes/NAME`` (or a bare name): NAME."""
    return resource["name"].rsplit("/", 1)[-1]


def ours(
    labels: dict[str, str], name: str, tag: str, kind: str, legacy: Callable[[], bool]
) -> bool:
    """Whether a listed resource named ``name`` with ``labels`` is an attempt of runner
    ``kind`` of the root ``tag``: labelled with this root, with this runner's kind, and with an
    attempt name that is the resource's own (a node a queued resource made for an attempt
    carries that attempt's labels under a name of its own: it is a part of the attempt, which
    another runner owns). Never a daemon's own VM (``bastion-role``, :mod:`bastion.vm`).
    Resources an older daemon made have no ``bastion-runner``: ``legacy()`` decides."""
    if labels.get(ROOT_LABEL) != tag or labels.get("bastion-role"):
        return False
    made_by = labels.get(RUNNER_LABEL)
    if made_by is None:
        return legacy()
    return made_by == kind and labels.get(ATTEMPT_LABEL) in (None, name)


def region_of(zone: str) -> str:
    """``us-central2-b``: ``us-central2``."""
    return zone.rsplit("-", 1)[0]


def quota_failure(error: HttpError) -> str | None:
    """The quota a 429 with QuotaFailure details names (a rate limit has none), or None."""
    details = error.error_details if isinstance(error.error_details, list) else []
    for detail in details:
        if isinstance(detail, dict) and detail.get("@type", "").endswith("QuotaFailure"):
            violations = detail.get("violations") or [{}]
            text = violations[0].get("description") or str(error.reason)
            m = re.search(r"Quota '([^']+)'", text)
            return m.group(1) if m else text
    return None
