"""A throw-away certificate authority and broker keystore for the sandbox's SASL_SSL listener.

Generated once per sandbox directory with ``cryptography``: ``ca.pem`` (what clients trust, librdkafka's
``ssl.ca.location``) and ``broker.p12`` (the broker's PKCS12 keystore, certificate for ``localhost`` and
``127.0.0.1`` unless told other names). The keystore password is random and written only to files inside the
sandbox directory.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID


def ensure_tls_material(tls_dir: Path, names: tuple[str, ...] = ("localhost", "127.0.0.1")) -> dict[str, str]:
    """Create (or reuse) the CA and broker keystore in ``tls_dir``; returns paths and the keystore password.
    The broker certificate carries ``names`` (DNS names and IP addresses) as subject alternative names."""
    meta_path = tls_dir / "tls.json"
    if meta_path.exists():
        return json.loads(meta_path.read_text())
    tls_dir.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Shoal sandbox CA (throw-away)")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    broker_key = ec.generate_private_key(ec.SECP256R1())
    broker_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(broker_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName([_san(name) for name in names]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    password = secrets.token_urlsafe(18)
    keystore = pkcs12.serialize_key_and_certificates(
        b"broker", broker_key, broker_cert, [ca_cert],
        serialization.BestAvailableEncryption(password.encode()),
    )
    ca_path, keystore_path = tls_dir / "ca.pem", tls_dir / "broker.p12"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    keystore_path.write_bytes(keystore)
    keystore_path.chmod(0o600)
    meta = {"ca": str(ca_path), "keystore": str(keystore_path), "password": password}
    meta_path.write_text(json.dumps(meta))
    meta_path.chmod(0o600)
    return meta


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def pem_server_material(tls_dir: Path, names: tuple[str, ...] = ("localhost",)) -> dict[str, str]:
    """The broker certificate and key of :func:`ensure_tls_material` as PEM files (for a Python TLS server: tests
    and benchmarks that play the broker); returns the paths of the CA, certificate and key."""
    meta = ensure_tls_material(tls_dir, names)
    key, cert, _ = pkcs12.load_key_and_certificates(Path(meta["keystore"]).read_bytes(), meta["password"].encode())
    (tls_dir / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                        serialization.NoEncryption()))
    (tls_dir / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return {"ca": meta["ca"], "cert": str(tls_dir / "cert.pem"), "key": str(tls_dir / "key.pem")}
