"""The cluster as the gke runner sees it: the official ``kubernetes`` client, counted calls,
and this root's JobSets and pods listed once per cycle.

Why apart: every request goes through here, so the cost per cycle is visible in one place
(``calls``, for the benchmark) and does not grow with the number of jobs: one label-selected
list of this root's JobSets for every poll, start and delete of a cycle, and one list of their
pods only when an attempt needs pod detail (:class:`bastion.runners.kit.listing.CycleListing`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from bastion.runners.base import RunnerError, TryAgain
from bastion.runners.gke.errors import refusal
from bastion.runners.gke.shape import (
    ATTEMPT_LABEL,
    GROUP,
    PLURAL,
    ROOT_LABEL,
    RUNNER_LABEL,
    VERSION,
    jobset_name,
)
from bastion.runners.kit.listing import CycleListing

JobSets = dict[str, dict[str, Any]]
PodsByAttempt = dict[str, list[dict[str, Any]]]


class Cluster:
    """One namespace of one cluster, and this root's objects in it (by their labels)."""

    def __init__(
        self,
        settings: Mapping[str, Any],
        tag: str,
        kind: str,
        listing_ttl: float,
        api_client: Any = None,
    ) -> None:
        self.settings = settings
        self.tag, self.kind = tag, kind
        self.namespace = str(settings.get("namespace") or "default")
        self.selector = f"{ROOT_LABEL}={tag},{RUNNER_LABEL}={kind}"
        self._api_client = api_client
        self._lock = threading.RLock()
        self.calls = 0  # API calls made (for the benchmark)
        self._jobsets: CycleListing[None, JobSets] = CycleListing(
            lambda _key: self._list_jobsets(), listing_ttl
        )
        self._pods: CycleListing[None, PodsByAttempt] = CycleListing(
            lambda _key: self._list_pods(), listing_ttl
        )

    # -- the client ----------------------------------------------------------------------------
    def client(self) -> Any:
        """The kubernetes ApiClient, made on first use: in-cluster, or from a kubeconfig."""
        with self._lock:
            if self._api_client is None:
                self._api_client = self._new_client()
            return self._api_client

    def _new_client(self) -> Any:
        from kubernetes import client, config

        try:
            if self.settings.get("in_cluster"):
                config.load_incluster_config()
                return client.ApiClient()
            path = (
                self.settings.get("kubeconfig")
                or os.environ.get("KUBECONFIG")
                or os.path.expanduser("~/.kube/config")
            )
            if not os.path.exists(str(path).split(os.pathsep)[0]):
                raise RunnerError(
                    f"runner gke: no kubeconfig at {path}; set [runners.gke] "
                    "kubeconfig (and context), or in_cluster = true in a pod"
                )
            return config.new_client_from_config(
                config_file=str(path), context=self.settings.get("context") or None
            )
        except config.ConfigException as e:
            raise RunnerError(
                f"runner gke: cannot load the cluster's config: {e}; "
                "fix [runners.gke] kubeconfig/context/in_cluster"
            ) from e

    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.client())

    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.client())

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """One request, counted."""
        with self._lock:
            self.calls += 1
        return fn(*args, **kwargs)

    # -- listings, once per cycle --------------------------------------------------------------
    @property
    def per_cycle(self) -> bool:
        """A daemon drives the cycles (each listing lasts one cycle)."""
        return self._jobsets.per_cycle

    def begin_cycle(self) -> None:
        self._jobsets.begin_cycle()
        self._pods.begin_cycle()

    def jobsets(self, fresh: bool = False) -> JobSets:
        """This root's JobSets by name (ours by their labels), one list call per cycle."""
        return self._jobsets.get(None, fresh=fresh)

    def pods(self) -> PodsByAttempt:
        """This root's pods by attempt name (their template's labels), one call per cycle,
        made only when an attempt needs pod detail."""
        return self._pods.get(None)

    def created(self) -> None:
        """A create was made: the attempt's first poll must see it, so list afresh."""
        self._jobsets.invalidate(None)

    def deleted(self) -> None:
        """A delete was made: without a daemon list afresh; with one, the next cycle's
        listing shows it (a listing per deleted job would grow with the jobs)."""
        self._jobsets.deleted(None)

    def _list_all(self, fn: Any, *args: Any) -> list[dict[str, Any]]:
        items, token = [], None
        while True:
            kwargs: dict[str, Any] = {"label_selector": self.selector, "limit": 500}
            if token:
                kwargs["_continue"] = token
            page = self.call(fn, *args, **kwargs)
            if not isinstance(page, dict):  # a model (pods): the API's own camelCase JSON
                page = self.client().sanitize_for_serialization(page)
            items += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    def _list_jobsets(self) -> JobSets:
        try:
            items = self._list_all(
                self.custom().list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL
            )
        except RunnerError:
            raise
        except Exception as e:
            if hasattr(e, "status"):
                raise refusal(e, "list", f"{PLURAL} in namespace {self.namespace}") from e
            raise TryAgain(f"listing {PLURAL}: {e}") from e
        return {js["metadata"]["name"]: js for js in items if self.ours(js)}

    def _list_pods(self) -> PodsByAttempt:
        found: PodsByAttempt = {}
        for pod in self._list_all(self.core().list_namespaced_pod, self.namespace):
            attempt = (pod["metadata"].get("labels") or {}).get(ATTEMPT_LABEL)
            if attempt:
                found.setdefault(attempt, []).append(pod)
        return found

    def ours(self, js: dict[str, Any]) -> bool:
        """Labelled with this root and runner, and named after the attempt its label names."""
        meta = js.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(ROOT_LABEL) != self.tag or labels.get(RUNNER_LABEL) != self.kind:
            return False
        attempt = labels.get(ATTEMPT_LABEL)
        return bool(attempt) and jobset_name(attempt) == meta.get("name")

    # -- single objects ------------------------------------------------------------------------
    def create_jobset(self, body: dict[str, Any]) -> None:
        self.call(
            self.custom().create_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            body,
        )

    def get_jobset(self, name: str) -> dict[str, Any]:
        return self.call(
            self.custom().get_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            name,
        )

    def delete_jobset(self, name: str, grace: int) -> None:
        """Foreground delete with ``grace`` seconds for the pods; absent is done."""
        from kubernetes import client

        try:
            self.call(
                self.custom().delete_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
                grace_period_seconds=grace,
                propagation_policy="Foreground",
                body=client.V1DeleteOptions(
                    propagation_policy="Foreground", grace_period_seconds=grace
                ),
            )
        except Exception as e:
            if getattr(e, "status", None) == 404:
                return
            if getattr(e, "status", None) in (401, 403):
                raise refusal(e, "delete", f"JobSet {name}") from e
            raise
        self.deleted()

    def kill_pods(self, attempt: str) -> None:
        """Delete the attempt's pods with grace 0 (the stop deadline passed)."""
        for pod in self.pods().get(attempt, []):
            try:
                self.call(
                    self.core().delete_namespaced_pod,
                    pod["metadata"]["name"],
                    self.namespace,
                    grace_period_seconds=0,
                )
            except Exception as e:
                if getattr(e, "status", None) != 404:
                    raise

    def close(self) -> None:
        with self._lock:
            if self._api_client is not None and hasattr(self._api_client, "close"):
                self._api_client.close()
            self._api_client = None
