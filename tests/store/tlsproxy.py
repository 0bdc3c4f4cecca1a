"""What lets the docs' recipes run exactly as printed, against real hostnames, without leaving this machine: an
HTTPS proxy on loopback (HTTPS_PROXY) whose tunnels end in TLS with a certificate for those names, signed by a
test CA (AWS_CA_BUNDLE), and lead to the local S3 server. No name is resolved and nothing leaves 127.0.0.1.

    ca = LoopbackCA(tmp_path, ["s3api-eu-ro-1.runpod.io", "*.s3api-eu-ro-1.runpod.io"])
    proxy = TlsProxy(server.port, ca); env = {"HTTPS_PROXY": proxy.url, "AWS_CA_BUNDLE": str(ca.bundle)}
"""

from __future__ import annotations

import contextlib
import datetime
import select
import socket
import ssl
import threading
from pathlib import Path


class LoopbackCA:
    """A CA and one server certificate for `names` (cryptography's x509 builder)."""

    def __init__(self, folder: Path, names: list[str]) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "podguard test CA")])
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        folder.mkdir(parents=True, exist_ok=True)
        self.bundle = folder / "ca.pem"
        self.bundle.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self.cert = folder / "server.pem"
        self.cert.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
        self.key = folder / "server.key"
        self.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )


class TlsProxy:
    """CONNECT host:443 -> TLS (the test CA's certificate) -> plain HTTP to 127.0.0.1:target. `hosts`: the names
    asked for."""

    def __init__(self, target_port: int, ca: LoopbackCA) -> None:
        self.target = target_port
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(str(ca.cert), str(ca.key))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.hosts: list[str] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        upstream = None
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            method, target = head.split(b" ", 2)[:2]
            if method != b"CONNECT":
                conn.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                return
            self.hosts.append(target.decode().rsplit(":", 1)[0])
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            tls = self.context.wrap_socket(conn, server_side=True)
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=30)
            _pump(tls, upstream)
        except (OSError, ValueError, ssl.SSLError):
            return
        finally:
            for s in (conn, upstream):
                if s is not None:
                    with contextlib.suppress(OSError):
                        s.close()


def _pump(tls: ssl.SSLSocket, plain: socket.socket) -> None:
    while True:
        if not tls.pending():
            ready, _, _ = select.select([tls, plain], [], [], 30)
            if not ready:
                return
        else:
            ready = [tls]
        if tls in ready:
            try:
                data = tls.recv(1 << 16)
            except ssl.SSLWantReadError:
                continue
            if not data:
                return
            plain.sendall(data)
        if plain in ready:
            data = plain.recv(1 << 16)
            if not data:
                return
            tls.sendall(data)
