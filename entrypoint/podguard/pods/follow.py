"""Follow a pod's log stream in a background thread, reopening it from the last event after a drop.

    follower = LogFollower(api, pod.id, since=pod.started_at, tail=None, source="container")
    follower.start()
    item = follower.queue.get(timeout=5)     # a LogEvent, or an ApiError that ended the follower
    follower.stop()

RunPod's stream never ends by itself; proxies and networks cut it. The follower resumes with
`Last-Event-ID` so no line is lost or repeated, and backs off when reopened streams keep dying at once.
The caller's thread stays free to check the pod's status and its own deadline.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from podguard.pods.api import LogStream, PodApi
from podguard.pods.errors import ApiError
from podguard.pods.pod import LogEvent

__all__ = ["LogFollower", "drain_quiet", "print_logs"]


class LogFollower(threading.Thread):
    def __init__(
        self,
        api: PodApi,
        pod_id: str,
        *,
        since: str | None,
        tail: int | None,
        source: str | None = None,
        backoff_s: float = 0.5,
        backoff_cap_s: float = 8.0,
        sink: Callable[[LogEvent | ApiError], None] | None = None,
        last_event_id: str = "",
    ) -> None:
        super().__init__(name=f"podguard-logs-{pod_id}", daemon=True)
        self.queue: queue.Queue[LogEvent | ApiError] = queue.Queue()
        self._put = sink or self.queue.put  # several followers may share one sink (a cluster's nodes)
        self.reopened = 0
        self._api = api
        self._pod_id = pod_id
        self._since = since
        self._tail = tail
        self._source = source
        self._resume_from = last_event_id  # a keeper started again resumes where it left off
        self._backoff = (backoff_s, backoff_cap_s)
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._stream: LogStream | None = None

    def run(self) -> None:
        last_id = self._resume_from
        quick_failures = 0
        while not self._halt.is_set():
            try:
                stream = self._api.open_logs(
                    self._pod_id, since=self._since, tail=self._tail, last_event_id=last_id, source=self._source
                )
            except ApiError as exc:  # open_logs already retried transient failures for --retry-for
                if not self._halt.is_set():
                    self._put(exc)
                return
            with self._lock:
                if self._halt.is_set():
                    stream.close()
                    return
                self._stream = stream
            got_any = False
            try:
                for event in stream:
                    got_any = True
                    if event.id:
                        last_id = event.id
                    self._put(event)
            except ApiError:
                pass  # dropped or silent too long: reopen from last_id
            finally:
                stream.close()
            quick_failures = 0 if got_any else quick_failures + 1
            base, cap = self._backoff
            self._halt.wait(min(cap, base * (2 ** min(quick_failures, 10))) if quick_failures else base / 10)
            self.reopened += 1

    def stop(self) -> None:
        """End the thread: close the open stream (unblocks its read) and wait briefly for it."""
        self._halt.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.close()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=2.0)

    def get(self, timeout: float) -> LogEvent | ApiError | None:
        """The next item, or None when nothing came within `timeout` seconds."""
        try:
            return self.queue.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None


def drain_quiet(follower: LogFollower, *, idle_s: float, limit: int | None, deadline: float) -> list[LogEvent]:
    """Events until the stream stays quiet for `idle_s`, `limit` events arrived, or `deadline` (monotonic)."""
    events: list[LogEvent] = []
    while limit is None or len(events) < limit:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        item = follower.get(min(idle_s, left))
        if item is None:
            break
        if isinstance(item, ApiError):
            raise item
        events.append(item)
    return events


def print_logs(
    follower: LogFollower, *, follow: bool, tail: int, idle_s: float, emit: Callable[[LogEvent], None]
) -> None:
    """`pod logs`: the recent lines (until the stream is quiet), or with `follow` every line until interrupted."""
    follower.start()
    try:
        if not follow:
            for event in drain_quiet(follower, idle_s=idle_s, limit=tail, deadline=time.monotonic() + 60):
                emit(event)
            return
        while True:
            item = follower.get(3600.0)
            if isinstance(item, ApiError):
                raise item
            if item is not None:
                emit(item)
    finally:
        follower.stop()
