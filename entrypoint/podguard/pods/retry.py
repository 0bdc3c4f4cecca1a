"""Retry one API call while its failures are transient: backoff with full jitter, `Retry-After` honoured.

    pods = with_retry(lambda: api.list_pods(), RetryPolicy(budget_s=60), what="list pods")

Only `ApiError.retryable` failures (5xx, HTML error pages, dropped connections, timeouts, 429) are
retried, for at most `budget_s` per call (`--retry-for`); 4xx answers such as 422/402/403 never are.
`before_retry` runs before each new attempt and may return a result instead (a create whose answer was
lost is looked up by name rather than sent twice).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from podguard import console
from podguard.pods.errors import ApiError, ApiErrorKind

__all__ = ["RetryPolicy", "with_retry"]

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    budget_s: float = 60.0
    base_s: float = 0.5
    cap_s: float = 8.0
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    rng: Callable[[], float] = random.random

    def delay(self, attempt: int, error: ApiError) -> float:
        """Seconds before attempt `attempt + 1`: Retry-After when the server gave one, else jittered backoff."""
        if error.retry_after is not None:
            return max(error.retry_after, 0.0)
        ceiling = min(self.cap_s, self.base_s * (2**attempt))
        return ceiling * (0.5 + 0.5 * self.rng())  # "equal jitter": never zero, never above the ceiling


def with_retry(
    call: Callable[[], T],
    policy: RetryPolicy,
    *,
    what: str,
    before_retry: Callable[[ApiError], T | None] | None = None,
    announce: bool = False,
) -> T:
    """Run `call` until it succeeds, fails for good, or the budget is spent (then ApiError TRANSIENT, exit 75).
    `announce`: each wait is a console line (a create the user is watching)."""
    started = policy.clock()
    attempt = 0
    while True:
        try:
            return call()
        except ApiError as exc:
            if not exc.retryable:
                raise
            error = exc
        wait = policy.delay(attempt, error)
        left = policy.budget_s - (policy.clock() - started)
        if wait > left:
            raise _exhausted(what, error, policy, wait, left)
        if announce:
            console.say(f"{what}: {error.message}; retrying in {wait:.1f}s")
        policy.sleep(wait)
        attempt += 1
        if before_retry is not None:
            found = before_retry(error)
            if found is not None:
                return found


def _exhausted(what: str, error: ApiError, policy: RetryPolicy, wait: float, left: float) -> ApiError:
    if error.kind is ApiErrorKind.RATE_LIMITED and error.retry_after is not None:
        reason = f"rate limited: RunPod asks to wait {wait:.0f}s, more than the {max(left, 0):.0f}s left"
    else:
        reason = error.message
    return ApiError(
        ApiErrorKind.TRANSIENT,
        f"{what}: still failing after retrying for up to {policy.budget_s:g}s (--retry-for): {reason}",
        status=error.status,
    )
