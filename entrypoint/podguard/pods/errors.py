"""podguard's own API errors: every transport or API failure becomes one of these, with a retry decision.

    raise ApiError(ApiErrorKind.RATE_LIMITED, "GET /v2/pods: HTTP 429 rate limit exceeded", retry_after=12)

The kind decides both whether a call is retried and which exit code the command ends with (docs/pods.md:
64 bad request, 66 no such pod, 69 no capacity, 75 transient, 77 key or account). Messages never carry
the API key: the transports scrub it from anything the server echoes before building one.
"""

from __future__ import annotations

from enum import StrEnum

from podguard.errors import ExitCode, PodguardError

__all__ = ["ApiError", "ApiErrorKind"]


class ApiErrorKind(StrEnum):
    TRANSIENT = "transient"  # 5xx, HTML error page, dropped connection, timeout: retry with backoff
    RATE_LIMITED = "rate_limited"  # 429: wait for Retry-After, then retry
    NO_CAPACITY = "no_capacity"  # 400 "no capacity" / "not enough free GPUs on the host": try elsewhere
    REJECTED = "rejected"  # 400 rule violation: this candidate will never work
    INVALID = "invalid"  # 422 or another 4xx: the request is wrong, never retry
    CONFLICT = "conflict"  # 409: the action is not allowed in the pod's status
    NOT_FOUND = "not_found"  # 404
    AUTH = "auth"  # no key, or 401
    NO_BALANCE = "no_balance"  # 402
    FORBIDDEN = "forbidden"  # 403


_EXIT = {
    ApiErrorKind.TRANSIENT: ExitCode.GPUS_BUSY,
    ApiErrorKind.RATE_LIMITED: ExitCode.GPUS_BUSY,
    ApiErrorKind.NO_CAPACITY: ExitCode.GPUS_MISSING,
    ApiErrorKind.REJECTED: ExitCode.USAGE,
    ApiErrorKind.INVALID: ExitCode.USAGE,
    ApiErrorKind.CONFLICT: ExitCode.USAGE,
    ApiErrorKind.NOT_FOUND: ExitCode.NO_SUCH_POD,
    ApiErrorKind.AUTH: ExitCode.API_ACCESS,
    ApiErrorKind.NO_BALANCE: ExitCode.API_ACCESS,
    ApiErrorKind.FORBIDDEN: ExitCode.API_ACCESS,
}


class ApiError(PodguardError):
    """A failed API call. `retryable` says whether the same call may succeed if sent again."""

    def __init__(
        self,
        kind: ApiErrorKind,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        detail: str = "",
    ) -> None:
        super().__init__(message, _EXIT[kind])
        self.kind = kind
        self.status = status
        self.retry_after = retry_after
        self.detail = detail

    @property
    def retryable(self) -> bool:
        return self.kind in (ApiErrorKind.TRANSIENT, ApiErrorKind.RATE_LIMITED)

    def __repr__(self) -> str:
        return f"ApiError({self.kind.value}, {self.message!r})"
