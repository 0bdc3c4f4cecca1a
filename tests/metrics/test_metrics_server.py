"""The endpoint as scrapers and bad clients use it: real sockets against `MetricsServer`, promtool's lint and a real
Prometheus on a full exposition (skipped with the reason where Debian's `prometheus` is not installed).

Why: the endpoint lives for a whole run beside the supervisor. A client that connects and never sends its request
(a port scanner, a half-open proxy connection) must not hold a thread for the rest of the run, nor can any number
of them pile up; only /metrics is the metrics (other paths 404, like every exporter); HEAD answers the headers;
and what a scrape gets must be accepted by Prometheus itself, not only by the Python parser.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from metrics_support import free_port, parse, wait_for
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

from podguard.job.store import store_series
from podguard.launch.watch.gpu_faults import GpuFault
from podguard.metrics.exposition import snapshot_registry
from podguard.metrics.series import SERIES
from podguard.metrics.server import MetricsServer
from podguard.metrics.state import GpuRow, MetricsState
from podguard.pods.thispod.meter import Budget, Meter
from podguard.rank.progress import Beat
from podguard.store.mirror import StoreStats

FAST = 0.5  # the whole-request deadline in these tests (the product's is DEADLINE_S)


def full_state() -> MetricsState:
    """Every series of the contract has samples: 2 GPUs read, an Xid, 2 ranks (one slow), a price, a store."""
    state = MetricsState(version="0.1.0", mode="auto", pod_id="pod123")
    state.begin_attempt(0, "per-gpu", [GpuRow(0, "GPU-aaaa", "NVIDIA H100 80GB HBM3"), GpuRow(1, "GPU-bbbb", "H100")])
    backend = SimpleNamespace(
        utilization=lambda i: 50 + i, memory_used=lambda i: 2**30 * (i + 1), sensors=lambda i: (300.5, 41 + i)
    )
    state.read_gpus(backend)
    now = time.monotonic()
    fault = GpuFault(index=1, uuid="GPU-bbbb", kind="xid", xid=79, fatal=True, text="Xid 79", at=now)
    state.observe(
        SimpleNamespace(
            beats={0: Beat(0, 10, 9, now, pid=1), 1: Beat(1, 7, 6, now, pid=2)},
            faults=[fault],
            progress=SimpleNamespace(labels={}, seen=True, last_at=now),
            rates=SimpleNamespace(slow={1: None}),
        )
    )
    state.set_price(Budget("pod123", (Meter("pod123", 3.52, 3600.0),), now))
    stats = StoreStats(step=1200, lag_s=12.5, uploaded_bytes=3 * 10**9, ok=4, failed=1)
    state.add_source(lambda: store_series(stats))  # --checkpoint-store
    return state


@pytest.fixture
def served():
    """A server on a free port over the full state, with a short request timeout; closed afterwards."""
    state = full_state()
    server = MetricsServer.bind(free_port(), snapshot_registry(state), deadline_s=FAST)
    try:
        yield server
    finally:
        server.close()


def get(port: int, path: str = "/metrics", method: str = "GET", **headers: str):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_only_metrics_is_served_and_head_answers_the_headers(served):
    status, headers, body = get(served.port)
    assert status == 200 and headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert {"podguard_up", "podguard_gpu_xid_errors", "podguard_spend_dollars"} <= set(parse(body.decode()))
    assert get(served.port, "/metrics/?x=1")[0] == 200
    for path in ("/", "/favicon.ico", "/metricsx", "/api/v1/query"):
        assert get(served.port, path)[0] == 404, path
    status, headers, body = get(served.port, method="HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 1000
    assert get(served.port, method="POST")[0] == 501


def test_a_scraper_that_asks_for_openmetrics_or_gzip_gets_it(served):
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    status, headers, body = get(served.port, Accept=accept, **{"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    names = {f.name for f in openmetrics_families(gzip.decompress(body).decode())}  # (it checks # EOF too)
    assert {s.name for s in SERIES} <= names


def _recv_closed(sock: socket.socket, timeout: float) -> bool:
    """True when the server has closed this connection (EOF or a reset) within `timeout`."""
    sock.settimeout(timeout)
    try:
        while True:
            if sock.recv(4096) == b"":
                return True
    except TimeoutError:
        return False
    except ConnectionError:
        return True


def test_silent_clients_are_dropped_and_never_block_other_scrapes_or_the_close(served):
    silent = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(6)]  # connect, send nothing
    lazy = []
    for _ in range(3):  # send a request, never read the answer
        sock = socket.create_connection(("127.0.0.1", served.port))
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        lazy.append(sock)
    try:
        with ThreadPoolExecutor(8) as pool:  # 24 scrapes at once beside them
            t0 = time.perf_counter()
            answers = list(pool.map(lambda _: get(served.port)[0], range(24)))
            took = time.perf_counter() - t0
        assert answers == [200] * 24 and took < 0.9, f"{took:.2f} s"  # (no wait for a SYN retry: 1 s)
        for sock in silent:  # the server hangs up on each at the deadline
            assert _recv_closed(sock, 10 * FAST), "a silent client must be dropped"
        wait_for(lambda: served.open_connections == 0, "every connection closed", timeout=5)
    finally:
        for sock in silent + lazy:
            sock.close()


class Tricklers:
    """`n` slow clients, each sending its request one byte at a time, a byte every `every_s` (more often than any
    per-read timeout), and connecting again when the server hangs up (as a client that means harm does)."""

    REQUEST = b"GET /metrics HTTP/1.1\r\nHost: podguard\r\nUser-Agent: slow\r\n\r\n"

    def __init__(self, port: int, n: int, every_s: float) -> None:
        self.port, self.every_s = port, every_s
        self.socks = [self._connect() for _ in range(n)]
        self.sent = [0] * n
        self.dropped: list[float] = []  # how long each dropped connection had lived
        self.born = [time.monotonic()] * n
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=5)

    def _run(self) -> None:
        body = self.REQUEST[:-4]  # never the blank line that ends the head
        while not self._stop.wait(self.every_s):
            for i, sock in enumerate(self.socks):
                try:
                    sock.sendall(body[self.sent[i] % len(body) :][:1])
                    self.sent[i] += 1
                except OSError:  # dropped by the server: count it and come back
                    self.dropped.append(time.monotonic() - self.born[i])
                    sock.close()
                    self.socks[i], self.sent[i], self.born[i] = self._connect(), 0, time.monotonic()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for sock in self.socks:
            sock.close()


def test_32_slow_clients_trickling_never_stop_scrapes_and_each_is_dropped_at_the_deadline():
    """A per-read timeout is no deadline: 32 clients each sending a byte more often than it, holding 32 slots, used
    to close every scrape for as long as they trickled."""
    server = MetricsServer.bind(free_port(), snapshot_registry(full_state()), deadline_s=FAST)
    slow = Tricklers(server.port, 32, every_s=FAST / 5)
    try:
        wait_for(lambda: server.open_connections >= 32, "the 32 slow clients", timeout=5)
        deadline = time.monotonic() + 6 * FAST
        answers = []
        while time.monotonic() < deadline:  # scrapes through several of the slow clients' lifetimes
            answers.append(get(server.port)[0])
            time.sleep(0.02)
        assert answers and set(answers) == {200}, answers
        wait_for(lambda: len(slow.dropped) >= 32, "each slow client dropped", timeout=10 * FAST)
        assert max(slow.dropped) < FAST + 2.0, slow.dropped  # at the deadline (a loaded machine's margin)
    finally:
        slow.close()
        server.close()


def test_at_the_product_s_deadline_32_clients_trickling_a_byte_every_second_leave_scrapes_alone():
    server = MetricsServer.bind(free_port(), snapshot_registry(full_state()))  # DEADLINE_S, MAX_CONNECTIONS
    slow = Tricklers(server.port, 32, every_s=1.0)
    try:
        wait_for(lambda: server.open_connections >= 32, "the 32 slow clients", timeout=5)
        for _ in range(20):
            assert get(server.port)[0] == 200
    finally:
        slow.close()
        server.close()


def test_connections_beyond_the_limit_close_the_oldest_and_a_new_scrape_is_served():
    server = MetricsServer.bind(free_port(), snapshot_registry(full_state()), deadline_s=30.0, max_connections=4)
    socks = []
    for _ in range(4):  # one by one: the first is the oldest
        socks.append(socket.create_connection(("127.0.0.1", server.port)))
        wait_for(lambda: server.open_connections == len(socks), "the connection accepted", timeout=5)
    try:
        assert get(server.port)[0] == 200, "a scrape beyond the limit must be served"
        assert _recv_closed(socks[0], 2.0), "the oldest connection makes room"
        assert not _recv_closed(socks[3], 0.2), "the newest silent one is still open"
        t0 = time.monotonic()
        server.close()  # three clients still connected and silent: the close does not wait for them
        assert time.monotonic() - t0 < 1.0
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", server.port)) != 0, "the port must be closed"
        assert _recv_closed(socks[3], 2.0), "the close hangs up on every client"
    finally:
        server.close()
        for sock in socks:
            sock.close()


def test_the_server_header_names_no_version_and_a_huge_request_head_is_refused(served):
    status, headers, _ = get(served.port)
    assert status == 200 and headers["Server"] == "podguard", headers
    assert "Date" in headers and "Python" not in str(headers)
    assert get(served.port, "/nothing")[1]["Server"] == "podguard"
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 20000)  # a head that never ends
        answer = b""
        with contextlib.suppress(ConnectionError):
            while chunk := sock.recv(4096):
                answer += chunk
    assert answer.startswith(b"HTTP/1.0 431 "), answer[:100]


PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")
def test_promtool_accepts_a_scrape_of_every_series(served):
    status, _, text = get(served.port)
    assert status == 200
    check = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, timeout=30)
    assert check.returncode == 0 and not check.stdout.strip(), (check.stdout + check.stderr).decode()


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian: apt-get install prometheus)")
def test_a_real_prometheus_scrapes_every_series(served, tmp_path):
    web = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs: [{{job_name: podguard, static_configs: [{{targets: ['127.0.0.1:{served.port}']}}]}}]\n"
    )
    args = [
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{web}",
    ]
    prom = subprocess.Popen([PROMETHEUS, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        target = wait_for(lambda: _scraped(web), "Prometheus's first scrape", timeout=30)
        assert target["health"] == "up" and target["lastError"] == "", target
        query = "count by (__name__) ({__name__=~'podguard_.*'})"
        names = {r["metric"]["__name__"] for r in _api(web, "query", query=query)["result"]}
        assert {s.name + ("_total" if s.kind == "counter" else "") for s in SERIES} <= names
    finally:
        prom.terminate()
        prom.wait(timeout=10)


def _api(port: int, what: str, **params: str):
    url = f"http://127.0.0.1:{port}/api/v1/{what}?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)["data"]


def _scraped(port: int):
    try:
        targets = _api(port, "targets")["activeTargets"]
    except OSError:
        return None
    return next((t for t in targets if t.get("lastScrape", "").startswith("20")), None)


def test_a_collector_that_raises_is_a_500_and_the_next_scrape_is_served():
    class Flaky:
        def __init__(self) -> None:
            self.calls = 0

        def collect(self):
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("a bug")
            return iter(())

    from prometheus_client.registry import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Flaky())
    server = MetricsServer.bind(free_port(), registry, deadline_s=FAST)
    try:
        assert get(server.port)[0] == 500
        assert get(server.port)[0] == 200
    finally:
        server.close()
