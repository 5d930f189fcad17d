"""TLS certificates and SuperNode authentication keys for a powerfl federation.

Writes, under ``--out`` (default ``deploy/credentials``)::

    ca.crt  ca.key            the federation's own certificate authority (keep ca.key offline)
    server.crt  server.key    the SuperLink's certificate, signed by the CA, with subject
                              alternative names 127.0.0.1, ::1, localhost and every --host
    nodes/<name>              a SuperNode's private key (OpenSSH, ECDSA P-384)
    nodes/<name>.pub          its public key, to register with ``flwr supernode register``

Where each file goes:

* SuperLink host: ``ca.crt``, ``server.crt``, ``server.key``
  (``flower-superlink --ssl-ca-certfile ca.crt --ssl-certfile server.crt
  --ssl-keyfile server.key --enable-supernode-auth``).
* Each device: ``ca.crt`` and its own ``nodes/<name>`` private key
  (``flower-supernode --root-certificates ca.crt --auth-supernode-private-key nodes/<name>``).
* Operator machine: ``ca.crt`` (the connection's ``root-certificates``) and every
  ``nodes/<name>.pub`` (``flwr supernode register nodes/<name>.pub <connection>``).

Existing files are kept (so a re-run adds nodes without changing the CA), unless
``--force`` is given. Only ``cryptography`` is needed, which Flower already depends on.

Usage::

    python -m deploy.credentials --out deploy/credentials --host 192.168.1.10 \\
        --host flower-server.lan --node nano-1 --node orin-1
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fl_client.argparse_once import OnceParser

DEFAULT_OUT = Path(__file__).resolve().parent / "credentials"
# Names the SuperLink certificate always carries, so the one-machine setup needs no --host.
LOOPBACK_NAMES = ("127.0.0.1", "::1", "localhost")
CERT_DAYS = 365
CA_DAYS = 3650


@dataclass(frozen=True)
class Credentials:
    """Paths of what ``make_credentials`` wrote (or found)."""

    out: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    node_keys: dict[str, Path]  # node name -> private key; public key is <path>.pub

    def node_public_key(self, name: str) -> Path:
        return self.node_keys[name].with_name(self.node_keys[name].name + ".pub")


def _write_private(path: Path, data: bytes) -> None:
    """Write a secret readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _san(names: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    seen: set[str] = set()
    for name in names:
        name = name.strip()
        if not name or name in seen:
            continue
        seen.add(name)
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)  # tolerate clock skew


def make_ca(out: Path, common_name: str = "powerfl federation CA") -> tuple[Path, Path]:
    """A self-signed CA (P-384), written as ``ca.crt`` / ``ca.key``."""
    key = ec.generate_private_key(ec.SECP384R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA384())
    )
    ca_cert, ca_key = out / "ca.crt", out / "ca.key"
    _write_private(ca_key, _pem_key(key))
    ca_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return ca_cert, ca_key


def make_server_cert(out: Path, ca_cert: Path, ca_key: Path, hosts: Sequence[str]) -> Path:
    """The SuperLink's certificate for ``hosts`` (plus loopback), signed by the CA."""
    ca = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    signer = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    if not isinstance(signer, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca_key}: expected an EC private key")
    names = [*hosts, *LOOPBACK_NAMES]
    key = ec.generate_private_key(ec.SECP384R1())
    first_dns = next((n for n in names if not _is_ip(n)), "localhost")
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, first_dns)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + dt.timedelta(days=CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName(_san(names)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()),
            critical=False,
        )
        .sign(signer, hashes.SHA384())
    )
    server_cert = out / "server.crt"
    _write_private(out / "server.key", _pem_key(key))
    server_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return server_cert


def make_node_key(out: Path, name: str) -> Path:
    """A SuperNode key pair in OpenSSH format (ECDSA P-384), as Flower expects."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"node name: {name!r} is not a valid file name")
    key = ec.generate_private_key(ec.SECP384R1())
    path = out / "nodes" / name
    _write_private(
        path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ),
    )
    pub = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    path.with_name(name + ".pub").write_bytes(pub + f" powerfl-{name}\n".encode())
    return path


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def server_cert_names(server_cert: Path) -> list[str]:
    """The subject alternative names a certificate carries (for checks and messages)."""
    cert = x509.load_pem_x509_certificate(server_cert.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(n.value) for n in san]


def make_credentials(
    out: Path = DEFAULT_OUT,
    hosts: Sequence[str] = (),
    nodes: Sequence[str] = (),
    *,
    force: bool = False,
) -> Credentials:
    """CA, server certificate and node keys; existing files are kept unless ``force``.

    The server certificate is re-issued when a requested host is missing from it.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = out / "ca.crt", out / "ca.key"
    new_ca = force or not (ca_cert.is_file() and ca_key.is_file())
    if new_ca:
        make_ca(out)
    server_cert, server_key = out / "server.crt", out / "server.key"
    wanted = {*hosts, *LOOPBACK_NAMES}
    if (
        new_ca
        or not (server_cert.is_file() and server_key.is_file())
        or not wanted <= set(server_cert_names(server_cert))
    ):
        make_server_cert(out, ca_cert, ca_key, hosts)
    node_keys: dict[str, Path] = {}
    for name in nodes:
        path = out / "nodes" / name
        if force or not (path.is_file() and path.with_name(name + ".pub").is_file()):
            make_node_key(out, name)
        node_keys[name] = path
    return Credentials(out, ca_cert, ca_key, server_cert, server_key, node_keys)


def main(argv: Sequence[str] | None = None) -> int:
    parser = OnceParser(
        prog="python -m deploy.credentials",
        description="Make a CA, the SuperLink's TLS certificate and SuperNode auth keys.",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    parser.add_argument(
        "--host",
        action="append",
        default=[],
        help="a name or IP address the SuperNodes and the operator use to reach the "
        "SuperLink (repeatable); 127.0.0.1, ::1 and localhost are always included",
    )
    parser.add_argument(
        "--node", action="append", default=[], help="a SuperNode key pair to make (repeatable)"
    )
    parser.add_argument("--force", action="store_true", help="replace existing files")
    args = parser.parse_args(argv)
    creds = make_credentials(args.out, args.host, args.node, force=args.force)
    print(f"CA certificate      {creds.ca_cert}   (SuperLink, every SuperNode, operator)")
    print(f"CA key              {creds.ca_key}   (keep offline; only needed to re-issue)")
    print(f"SuperLink cert/key  {creds.server_cert}, {creds.server_key}")
    print(f"  names: {', '.join(server_cert_names(creds.server_cert))}")
    for name, path in creds.node_keys.items():
        print(f"SuperNode {name}: private {path} (device only), public {path}.pub (register)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
