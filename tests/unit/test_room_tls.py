"""The room over HTTPS (lab.course.room.tls): the day's certificate is for this host and verifies against itself
(as a browser pinning it does), a certificate and key given are checked before anything is made, and each wrong
one is refused in one line. tests/infra/test_room.py serves the real room with the day's certificate and logs in
through it with requests and a browser."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from lab.course.room import tls
from lab.errors import LabError


def test_the_days_certificate_is_this_hosts_and_a_client_that_trusts_it_connects(tmp_path):
    cert, key = tls.day_certificate(tmp_path, "127.0.0.1")
    assert key.stat().st_mode & 0o777 == 0o600
    assert tls.checked(str(cert), str(key)) == (cert, key)
    assert len(tls.fingerprint(cert).split(":")) == 32 and len(tls.spki_hash(cert)) == 44

    class Hello(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"room")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Hello)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = ssl.create_default_context(cafile=str(cert))  # hostname checked: 127.0.0.1 is in its names
        with socket.create_connection(("127.0.0.1", server.server_port)) as raw:
            with client.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
                conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
                reply = b"".join(iter(lambda: conn.recv(1024), b""))
                assert reply.startswith(b"HTTP/1.0 200") and reply.endswith(b"room")
    finally:
        server.shutdown()


def test_a_wrong_certificate_or_key_is_one_line_before_anything_is_made(tmp_path):
    cert, key = tls.day_certificate(tmp_path / "a", "127.0.0.1")
    other_cert, other_key = tls.day_certificate(tmp_path / "b", "127.0.0.1")
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    for args, said in (
        ((str(tmp_path / "none.pem"), str(key)), "--tls-cert .*none.pem: cannot be read"),
        ((str(tmp_path / "junk.pem"), str(key)), "--tls-cert .*junk.pem: not a PEM certificate"),
        ((str(cert), str(tmp_path / "junk.pem")), "--tls-key .*junk.pem: not an unencrypted PEM private key"),
        ((str(cert), str(other_key)), "--tls-key .*: not the key of --tls-cert"),
    ):
        with pytest.raises(LabError, match=said):
            tls.checked(*args)
    assert tls.checked(str(other_cert), str(other_key))[0] == other_cert.resolve()
    room = tmp_path / "room"

    def serve(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, "-m", "lab", "room", "serve", "--room-dir", str(room), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr  # one line, exit 2
        assert not room.exists() and "Traceback" not in done.stderr  # refused before anything is made
        return done

    assert "not the key of --tls-cert" in serve("--tls-cert", str(cert), "--tls-key", str(other_key)).stderr
    assert "--tls-cert and --tls-key go together" in serve("--tls-cert", str(cert)).stderr
    # a certificate for the day is made only once every check has passed: a bad class list leaves none behind
    assert (
        "no-class.txt: cannot be read" in serve("--tls-self-signed", "--class", str(tmp_path / "no-class.txt")).stderr
    )
