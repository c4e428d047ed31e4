"""A hosted rendezvous's per-job secret: where it comes from, and the TLS CA and etcd password derived from it.

The secret is 32 random bytes, written as 64 hex digits in a file only its owner may read (`runner secret --new
PATH`; mode 0600). It is found in rendezvous.secret_file, else in the file named by the RUNNER_SECRET_FILE variable
(hosted jobs only). From it, HKDF-SHA256 (salt SALT, info naming the purpose and the job) derives:
- the key of the job's certificate authority (EC P-256): every node derives the same key, so every node trusts the
  server certificate that the hosting node makes for its etcd, and nobody without the secret can make one;
- the password of etcd's `root` user: every node authenticates with it.
Neither is written anywhere but in the hosting node's private temp folder (the server's certificate and key, removed
at stop) and, for the guard that revokes a dead agent's lease, in memory (docs/security.md). The secret's path
reaches no worker (launch_plan.agent_secret_vars drops RUNNER_SECRET_FILE) and no shared spec tree.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from runner.contract import SECRET_ENV
from runner.errors import RendezvousError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey
    from cryptography.x509 import Name

    from runner.config.spec import Rendezvous

SECRET_FIELD = "rendezvous.secret_file"  # noqa: S105 - a field name
SECRET_BYTES = 32
SALT = b"runner-hosted-rendezvous-v1"
ROOT_USER = "root"
# The CA certificate's validity is fixed (every node builds the same one); the server's is one run's.
CA_NOT_BEFORE = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
CA_NOT_AFTER = dt.datetime(2200, 1, 1, tzinfo=dt.UTC)
SERVER_VALIDITY = dt.timedelta(days=3650)
# The order of P-256: a derived private key is an integer in [1, order - 1].
P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551

NEW_FIX = (f"runner secret --new PATH (its mode is 600), then give PATH in rendezvous.secret_file or export "
           f"{SECRET_ENV}=PATH on every node")


@dataclass(frozen=True)
class SecretSource:
    """Where a job's secret is read from, and under which name an error talks about it."""

    path: str
    named_by: str  # SECRET_FIELD or f"{SECRET_ENV} (environment)"


def secret_source(rdzv: Rendezvous, environ: Mapping[str, str] | None = None) -> SecretSource | None:
    """The secret's file for a hosted rendezvous: rendezvous.secret_file, else $RUNNER_SECRET_FILE; None if neither.

    A job that is not hosted has no secret (checks.py refuses secret_file there; the variable is not read).
    """
    if not rdzv.hosted:
        return None
    if rdzv.secret_file:
        return SecretSource(rdzv.secret_file, SECRET_FIELD)
    env = os.environ if environ is None else environ
    path = env.get(SECRET_ENV)
    return SecretSource(path, f"{SECRET_ENV} (environment)") if path else None


def read_secret(source: SecretSource) -> bytes:
    """The secret's 32 bytes; a RendezvousError naming the field (or variable) and the fix when it cannot be used."""
    path = Path(source.path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        msg = f"cannot read the job's secret {source.named_by} '{path}': {exc.strerror}"
        raise RendezvousError(msg, fix=f"fix the path, or make a secret: {NEW_FIX}") from exc
    try:
        mode = os.fstat(fd).st_mode
        text = os.read(fd, 4096).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    if not stat.S_ISREG(mode):
        msg = f"the job's secret {source.named_by} '{path}' is not a regular file"
        raise RendezvousError(msg, fix=NEW_FIX)
    if mode & 0o077:
        msg = (f"the job's secret {source.named_by} '{path}' can be read by others (mode {stat.S_IMODE(mode):04o}): "
               "anyone who reads it can join, read and stop the job")
        raise RendezvousError(msg, fix=f"chmod 600 {path}")
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = b""
    if len(secret) != SECRET_BYTES:
        msg = f"the job's secret {source.named_by} '{path}' is not {SECRET_BYTES * 2} hex digits"
        raise RendezvousError(msg, fix=f"write a new one: {NEW_FIX}")
    return secret


def new_secret_file(path: Path) -> None:
    """Write a new secret to `path` (mode 0600, umask 077); FileExistsError when it exists (never overwritten)."""
    old = os.umask(0o077)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    finally:
        os.umask(old)
    try:
        os.write(fd, os.urandom(SECRET_BYTES).hex().encode() + b"\n")
    finally:
        os.close(fd)


@dataclass(frozen=True)
class JobTrust:
    """What a job's secret gives: the CA's certificate (PEM) every node trusts, and etcd root's password."""

    job: str
    ca_pem: bytes
    password: str = field(repr=False)
    named_by: str = SECRET_FIELD
    _secret: bytes = field(default=b"", repr=False)  # kept for the hosting node's server certificate only

    def server_credentials(self, names: tuple[str, ...]) -> tuple[bytes, bytes]:
        """(certificate PEM, key PEM) of a fresh server key, signed by the job's CA for `names` (hosts or IPs)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        ca_key = _ca_key(self._secret, self.job)
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        alt: list[x509.GeneralName] = []
        for name in dict.fromkeys(names):
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(name.split("%", 1)[0])))
            except ValueError:
                alt.append(x509.DNSName(name))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"runner hosted etcd of {self.job}")]))
            .issuer_name(_ca_name(self.job))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + SERVER_VALIDITY)
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            # client auth too: a member presents it to the other members (etcd's --peer-client-cert-auth)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return cert.public_bytes(serialization.Encoding.PEM), key_pem


def derive(secret: bytes, job: str, named_by: str = SECRET_FIELD) -> JobTrust:
    """The job's CA certificate and root password from its secret (the same on every node)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    ca_key = _ca_key(secret, job)
    name = _ca_name(job)
    ca = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(ca_key.public_key())
        .serial_number(int.from_bytes(_hkdf(secret, job, b"ca-serial", 16)) >> 1 | 1)
        .not_valid_before(CA_NOT_BEFORE)
        .not_valid_after(CA_NOT_AFTER)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    password = _hkdf(secret, job, b"etcd-root-password", 32).hex()
    return JobTrust(job, ca.public_bytes(serialization.Encoding.PEM), password, named_by, secret)


def job_trust(rdzv: Rendezvous, job: str, environ: Mapping[str, str] | None = None) -> JobTrust | None:
    """The spec's JobTrust when its hosted rendezvous has a secret; None when it has none."""
    source = secret_source(rdzv, environ)
    if source is None:
        return None
    return derive(read_secret(source), job, source.named_by)


def _hkdf(secret: bytes, job: str, purpose: bytes, length: int) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    info = purpose + b"\0" + job.encode()
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=SALT, info=info).derive(secret)


def _ca_key(secret: bytes, job: str) -> EllipticCurvePrivateKey:
    from cryptography.hazmat.primitives.asymmetric import ec

    scalar = int.from_bytes(_hkdf(secret, job, b"ca-key", 48)) % (P256_ORDER - 1) + 1
    return ec.derive_private_key(scalar, ec.SECP256R1())


def _ca_name(job: str) -> Name:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "runner"),
                      x509.NameAttribute(NameOID.COMMON_NAME, f"runner job CA of {job}")])
