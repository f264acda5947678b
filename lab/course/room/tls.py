"""The room over HTTPS: a certificate the instructor has (`--tls-cert`, `--tls-key`), or one made for the day
(`--tls-self-signed`) whose fingerprint the learners compare with what their browser shows. JupyterHub's proxy
serves it (`c.JupyterHub.ssl_cert`, `ssl_key`); the hub and the seats' servers behind the proxy talk as before.

Made with `cryptography` (JupyterHub's own certificates for internal SSL come from the same library, through
certipy): an RSA key and a certificate for this host's name, its addresses and the bind address, valid for 3 days.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
from pathlib import Path

from lab import atomic
from lab.errors import LabError

DAY_CERT, DAY_KEY = "room-cert.pem", "room-key.pem"  # in the room's folder (the owner's alone)
VALID_DAYS = 3


def day_certificate(folder: Path, bind: str) -> tuple[Path, Path]:
    """A self-signed certificate for this host (its name, its addresses, `bind`), written into `folder`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    host = socket.getfqdn()
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dict.fromkeys([host, socket.gethostname(), "localhost"])]
    addresses = {"127.0.0.1", *([bind] if _is_address(bind) and bind != "0.0.0.0" else [])}
    try:
        addresses.update(str(info[4][0]) for info in socket.getaddrinfo(host, None, socket.AF_INET))
    except OSError:
        pass  # a host whose name resolves to nothing: its loopback and bind address still
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in sorted(addresses)]
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, host), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "lab room")]
    )
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / DAY_CERT, folder / DAY_KEY
    pem = serialization.Encoding.PEM
    private = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    atomic.write_bytes(key_path, private, mode=0o600)
    atomic.write_bytes(cert_path, cert.public_bytes(pem))
    return cert_path, key_path


def checked(cert: str, key: str) -> tuple[Path, Path]:
    """A certificate and its key as given: both readable PEM, the key the certificate's. LabError in one line."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert_path, key_path = Path(cert).resolve(), Path(key).resolve()
    try:
        certificate = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except OSError as exc:
        raise LabError(f"--tls-cert {cert}: cannot be read ({exc.strerror})") from None
    except ValueError:
        raise LabError(f"--tls-cert {cert}: not a PEM certificate (-----BEGIN CERTIFICATE-----)") from None
    try:
        private = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except OSError as exc:
        raise LabError(f"--tls-key {key}: cannot be read ({exc.strerror})") from None
    except (ValueError, TypeError):
        raise LabError(
            f"--tls-key {key}: not an unencrypted PEM private key (the proxy cannot ask for a passphrase)"
        ) from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(serialization.Encoding.PEM, public) != certificate.public_key().public_bytes(
        serialization.Encoding.PEM, public
    ):
        raise LabError(f"--tls-key {key}: not the key of --tls-cert {cert} (their public keys differ)")
    return cert_path, key_path


def fingerprint(cert: Path) -> str:
    """The certificate's SHA-256 fingerprint as browsers show it (AB:CD:...)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    digest = x509.load_pem_x509_certificate(Path(cert).read_bytes()).fingerprint(hashes.SHA256())
    return ":".join(f"{b:02X}" for b in digest)


def spki_hash(cert: Path) -> str:
    """The base64 SHA-256 of the certificate's public key: what a browser pins (chromium's
    --ignore-certificate-errors-spki-list) to trust this one certificate and no other."""
    import base64
    import hashlib

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    spki = (
        x509.load_pem_x509_certificate(Path(cert).read_bytes())
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
