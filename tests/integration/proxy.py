"""A TCP proxy in front of the Ray dashboard, for what a real deployment puts between Airflow and
Ray: TLS termination (an ingress) and outages (a head restart, a proxy reload).

``pause()`` closes the listening socket, so new connections are refused as by a restarting head;
``resume()`` listens again on the same port.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TlsFiles:
    ca_pem: Path
    cert_pem: Path
    key_pem: Path


def make_tls_files(folder: Path) -> TlsFiles:
    """A private CA and a certificate for 127.0.0.1 signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "raybatch test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(folder / "ca.pem", folder / "cert.pem", folder / "key.pem")
    files.ca_pem.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key_pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return files


class TcpProxy:
    """Forward 127.0.0.1:<port> to ``target_port``, optionally terminating TLS."""

    def __init__(self, target_port: int, tls: TlsFiles | None = None) -> None:
        self.target_port = target_port
        self._tls = None
        if tls is not None:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(tls.cert_pem, tls.key_pem)
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()  # the accepted client sockets, dropped by pause()
        self.connections = 0

    def start(self) -> TcpProxy:
        self.resume()
        return self

    def resume(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def pause(self) -> None:
        """Drop open connections and refuse new ones until :meth:`resume`, as a restarting head does
        (a client keeping connections alive must not ride an outage out on an old one)."""
        if self._listener is not None:
            listener, self._listener = self._listener, None
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked on it (Linux)
            listener.close()
        for sock in list(self._open):
            try:
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            except OSError:
                pass
        self._open.clear()

    stop = pause

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by pause()
            if listener is not self._listener:  # paused meanwhile: refuse what slipped in
                client.close()
                return
            self.connections += 1
            self._open.add(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            if self._tls is not None:
                client = self._tls.wrap_socket(client, server_side=True)
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
        except (OSError, ssl.SSLError):
            client.close()  # e.g. a client that refused our certificate
            return
        threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
        _pump(client, upstream)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.close()
