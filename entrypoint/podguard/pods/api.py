"""The one interface every pod operation goes through, and the factory that picks an implementation.

    api = open_api("rest", retry_for=60)        # REST v2 over the stdlib (the default; used inside pods)
    api = open_api("graphql")                    # the `runpod` SDK: spot pods and `--api graphql`
    pod = api.get_pod("abc123")

Everything above this interface (spec, placement, readiness, heal, self-heal, CLI) is written once.
Idempotent calls retry transient failures inside the implementation; `create_pod` is a single attempt,
because only the caller can tell whether a lost answer created a pod (see placement.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from podguard.pods.auth import api_base_url, load_api_key
from podguard.pods.pod import ApiKind, LogEvent, Pod, PodAction, PodRequest, TemplateRequest
from podguard.pods.rest_api import RestApi
from podguard.pods.retry import RetryPolicy
from podguard.pods.tuning import Tuning

__all__ = ["ApiKind", "LogStream", "PodApi", "open_api"]


class LogStream(Protocol):
    """An open, never-ending log stream; `close()` may be called from another thread."""

    def __iter__(self) -> Iterator[LogEvent]: ...

    def close(self) -> None: ...

    def __enter__(self) -> LogStream: ...

    def __exit__(self, *exc: object) -> None: ...


class PodApi(Protocol):
    kind: ApiKind
    policy: RetryPolicy

    def list_pods(self) -> list[Pod]:
        """Every pod of the account (terminated ones are gone from the list)."""
        ...

    def get_pod(self, pod_id: str) -> Pod:
        """One pod; ApiError(NOT_FOUND) when there is none."""
        ...

    def create_pod(self, request: PodRequest) -> Pod:
        """One create attempt, not retried (the caller looks a lost answer up by name)."""
        ...

    def act(self, pod_id: str, action: PodAction) -> Pod | None:
        """start/stop/restart (the updated pod) or terminate (None). 409 -> ApiError(CONFLICT)."""
        ...

    def open_logs(
        self, pod_id: str, *, since: str | None, tail: int | None, last_event_id: str = "", source: str | None = None
    ) -> LogStream:
        """The pod's log stream from `since` (RFC 3339) or its last `tail` lines, then live; `source`
        "container" or "system" (None: both)."""
        ...

    def upsert_template(self, request: TemplateRequest) -> tuple[str, bool]:
        """Create the template or update the one with that name: (id, created)."""
        ...


def open_api(kind: ApiKind | str = ApiKind.REST, *, retry_for: float = 60.0, tuning: Tuning | None = None) -> PodApi:
    """An API client with the key and base URL from the environment (ApiError AUTH -> exit 77 if no key)."""
    tuning = tuning or Tuning.from_env()
    policy = RetryPolicy(budget_s=retry_for, base_s=tuning.backoff_s, cap_s=tuning.backoff_cap_s)
    base = api_base_url()
    key = load_api_key()
    rest = RestApi(base, key, policy=policy, timeout_s=tuning.request_timeout_s, stream_idle_s=tuning.stream_idle_s)
    if ApiKind(kind) is ApiKind.REST:
        return rest
    from podguard.pods.graphql_api import GraphqlApi  # noqa: PLC0415  lazy: runpod SDK (podguard[pods]): only --api graphql and spot pods load it

    return GraphqlApi(key, rest=rest, policy=policy)
