"""`a3c-certs`: a small certificate authority for a cluster without a PKI (docs/guide/tls.md).

    a3c-certs ca [--dir certs] [--days 3650]
        the CA: DIR/ca.crt (give it to every service as A3C_TLS_CA) and DIR/ca.key (mode 0600;
        keep it off the cluster's hosts once the certificates are made). An existing CA is never
        replaced.
    a3c-certs host NAME [ADDRESS ...] [--dir certs] [--days 825]
        a host's certificate, signed by DIR's CA: DIR/NAME.crt (the leaf alone: the CA travels
        separately, as A3C_TLS_CA) and DIR/NAME.key (mode 0600), its A3C_TLS_CERT and
        A3C_TLS_KEY. NAME is the subject's common name and the files' stem; NAME and every
        ADDRESS are its subject alternative names, an IP address where one parses (IPv4, IPv6)
        and a DNS name otherwise: the names the others reach it by. It is both a server's and a
        client's certificate (extended key usage serverAuth and clientAuth): the service serves
        HTTPS with it and, under mutual TLS (A3C_TLS_MUTUAL=true), presents it on its own calls.
        Running it again for the same NAME replaces that host's files (a renewal).

EC P-256 keys, SHA-256 signatures, unencrypted PEM keys (the services read them without a
passphrase). Made with the `cryptography` package, the `tls` extra; the services themselves need
only Python's ssl. A mistake (no CA yet, a bad address, a folder that cannot be written) is one
line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CA_DAYS = 3650  # ten years: the CA outlives many host certificates
HOST_DAYS = 825  # what browsers and Apple's platforms still accept for a leaf
MAX_DAYS = 36500
CA_NAME = "a3c-http CA"
# A certificate is valid from a few minutes before it was made: hosts whose clocks lag a little
# behind this one's still accept it.
BACKDATE = dt.timedelta(minutes=5)
INSTALL = (
    "a3c-certs needs the cryptography package: pip install 'a3c-http[tls]' "
    "(or make the certificates with openssl: see docs/guide/tls.md)"
)
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)\Z")


class CertError(Exception):
    """A mistake of the user's (or of the file system's): one line, exit status 2."""


@dataclass(frozen=True)
class Written:
    cert: Path
    key: Path
    not_after: dt.datetime
    names: tuple[str, ...] = ()  # the subject alternative names, as written
    replaced: bool = False


def _require_cryptography() -> None:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        raise CertError(INSTALL) from None


def parse_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | str:
    """An IP address (IPv4, IPv6, `[::1]` too) or a DNS name (ASCII or IDNA, `*.` allowed in front
    of one); CertError for anything else."""
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        return ipaddress.ip_address(bare)
    except ValueError:
        pass
    name = text.rstrip(".") if text != "." else text
    try:
        ascii_name = name.encode("idna").decode("ascii")
    except UnicodeError:
        raise CertError(f"not an IP address or a DNS name: {text!r}") from None
    labels = ascii_name.split(".")
    if labels[0] == "*" and len(labels) > 2:
        labels = labels[1:]
    if len(ascii_name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise CertError(f"not an IP address or a DNS name: {text!r}")
    if all(label.isdigit() for label in labels):
        raise CertError(f"not an IP address or a DNS name: {text!r}")
    return ascii_name


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def _stage(temporary: Path, data: bytes, mode: int) -> None:
    """`data` into a new file with `mode` from the start: a key is never readable by others, not
    even for a moment."""
    temporary.unlink(missing_ok=True)  # a leftover, whose mode might be wider
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(temporary, mode)  # whatever the umask took away from a certificate's mode


def _folder(directory: Path) -> None:
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise CertError(f"cannot make the folder {directory}: {exc.strerror or exc}") from None
    if not directory.is_dir():
        raise CertError(f"{directory} is not a folder")


def _save(files: list[tuple[Path, bytes, int]]) -> None:
    """The files (path, content, mode), each written whole to a temporary file first and then all
    renamed: a write that fails (a full disk, a folder that cannot be written) leaves the folder as
    it was, rather than a new key beside the old certificate."""
    staged: list[tuple[Path, Path]] = []
    current = files[0][0]
    try:
        for current, data, mode in files:
            temporary = current.with_name(f".{current.name}.{os.getpid()}.tmp")
            staged.append((temporary, current))
            _stage(temporary, data, mode)
        for temporary, current in staged:
            os.replace(temporary, current)
    except OSError as exc:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)
        raise CertError(f"cannot write {current}: {exc.strerror or exc}") from None


def _new_key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem_cert(cert: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _check_days(days: int) -> None:
    if not 1 <= days <= MAX_DAYS:
        raise CertError(f"--days must be from 1 to {MAX_DAYS}, not {days}")


def _key_usage(signs: bool) -> Any:
    """Digital signatures, and with `signs` the signing of certificates and CRLs (a CA)."""
    from cryptography import x509

    no = dict.fromkeys(("content_commitment", "key_encipherment", "data_encipherment",
                        "key_agreement", "encipher_only", "decipher_only"), False)
    return x509.KeyUsage(digital_signature=True, key_cert_sign=signs, crl_sign=signs, **no)


def make_ca(directory: Path, days: int = CA_DAYS, name: str = CA_NAME) -> Written:
    """DIR/ca.crt and DIR/ca.key; CertError if either exists already."""
    _require_cryptography()
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    _check_days(days)
    cert_path, key_path = directory / "ca.crt", directory / "ca.key"
    existing = [p for p in (cert_path, key_path) if p.exists()]
    if existing:
        raise CertError(
            f"{existing[0]} exists: a CA is never replaced (its hosts' certificates depend on it); "
            f"remove {cert_path} and {key_path} yourself, or use another --dir"
        )
    _folder(directory)
    key = _new_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    not_after = now + dt.timedelta(days=days)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        # A CA that signs hosts only, never another CA.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    _save([(key_path, _pem_key(key), 0o600), (cert_path, _pem_cert(cert), 0o644)])
    return Written(cert_path, key_path, not_after)


def _load_ca(directory: Path) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    cert_path, key_path = directory / "ca.crt", directory / "ca.key"
    if not cert_path.is_file() or not key_path.is_file():
        raise CertError(
            f"no CA in {directory} ({cert_path.name} and {key_path.name}): "
            f"make one first with: a3c-certs ca --dir {directory}"
        )
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except OSError as exc:
        raise CertError(f"cannot read {cert_path}: {exc.strerror or exc}") from None
    except ValueError:
        raise CertError(f"{cert_path} is not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except OSError as exc:
        raise CertError(f"cannot read {key_path}: {exc.strerror or exc}") from None
    except TypeError:
        raise CertError(f"{key_path} is encrypted: a3c-certs reads unencrypted keys only") from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise CertError(f"{key_path} is not a PEM private key ({exc})") from None
    if key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise CertError(f"{key_path} is not the key of {cert_path}")
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise CertError(f"{cert_path} is not a CA's certificate (basicConstraints CA:TRUE)")
    if not isinstance(
        key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey
    ):
        raise CertError(f"{key_path}: a3c-certs signs with EC, RSA or Ed25519 keys only")
    return cert, key


def make_host(
    directory: Path, name: str, addresses: list[str] | tuple[str, ...] = (), days: int = HOST_DAYS
) -> Written:
    """DIR/NAME.crt and DIR/NAME.key, signed by DIR's CA (they replace an older pair)."""
    _require_cryptography()
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    _check_days(days)
    if name in ("", ".", "..") or "/" in name or "\\" in name or name.startswith("-"):
        raise CertError(f"{name!r} cannot name a certificate's files")
    if name.lower() == "ca":
        raise CertError("'ca' is the CA's own name (ca.crt, ca.key): give the host another NAME")
    parsed = [parse_address(a) for a in (name, *addresses)]
    names: list[x509.GeneralName] = []
    for value in dict.fromkeys(parsed):  # in order, each once
        if isinstance(value, str):
            names.append(x509.DNSName(value))
        else:
            names.append(x509.IPAddress(value))
    ca_cert, ca_key = _load_ca(directory)
    now = _now()
    not_after = min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    if not_after <= now:
        raise CertError(f"the CA in {directory} has expired: make a new one in another --dir")
    key = _new_key()
    public = key.public_key()
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        authority = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)
    except x509.ExtensionNotFound:  # a CA made elsewhere, without one
        authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs=False), critical=True)
        # One certificate for both ends: the service's HTTPS and, under mutual TLS, its calls.
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(authority, critical=False)
        # Ed25519 signs without a separate hash.
        .sign(ca_key, None if isinstance(ca_key, ed25519.Ed25519PrivateKey) else hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    replaced = cert_path.exists() or key_path.exists()
    _save([(key_path, _pem_key(key), 0o600), (cert_path, _pem_cert(cert), 0o644)])
    written = tuple(str(v) for v in dict.fromkeys(parsed))
    return Written(cert_path, key_path, not_after, written, replaced)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="a3c-certs",
        description=(
            "Make a CA and hosts' certificates for the services' TLS (A3C_TLS_CERT, A3C_TLS_KEY, "
            "A3C_TLS_CA; docs/guide/tls.md). Needs the cryptography package, the tls extra."
        ),
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{ca,host}")
    ca = commands.add_parser(
        "ca",
        help="make the CA: DIR/ca.crt and DIR/ca.key (never replaces one)",
        description="Make the CA: DIR/ca.crt (A3C_TLS_CA) and DIR/ca.key (mode 0600).",
    )
    ca.add_argument("--dir", type=Path, default=Path("certs"), help="the folder (certs)")
    ca.add_argument("--days", type=int, default=CA_DAYS, help=f"valid this long ({CA_DAYS})")
    host = commands.add_parser(
        "host",
        help="make a host's certificate, signed by DIR's CA: DIR/NAME.crt and DIR/NAME.key",
        description=(
            "Make a host's certificate, signed by DIR's CA: DIR/NAME.crt (A3C_TLS_CERT) and "
            "DIR/NAME.key (A3C_TLS_KEY, mode 0600), for serverAuth and clientAuth. NAME and each "
            "ADDRESS are the names it answers to (IP addresses or DNS names)."
        ),
    )
    host.add_argument("name", metavar="NAME", help="the common name and the files' stem")
    host.add_argument(
        "addresses",
        metavar="ADDRESS",
        nargs="*",
        default=[],
        help="more names the host is reached by: IP addresses or DNS names",
    )
    host.add_argument("--dir", type=Path, default=Path("certs"), help="the CA's folder (certs)")
    host.add_argument("--days", type=int, default=HOST_DAYS, help=f"valid this long ({HOST_DAYS})")
    args = parser.parse_args(argv)
    try:
        if args.command == "ca":
            written = make_ca(args.dir, args.days)
            print(
                f"wrote {written.cert} (the CA's certificate, until {written.not_after:%Y-%m-%d})"
            )
            print(f"wrote {written.key} (the CA's private key, mode 0600: keep it safe)")
            print("every service (the master, each worker) takes:")
            print(f"A3C_TLS_CA={written.cert}")
            print(
                f"next, a certificate for each host: a3c-certs host NAME [ADDRESS ...] "
                f"--dir {args.dir}"
            )
        else:
            written = make_host(args.dir, args.name, args.addresses, args.days)
            verb = "replaced" if written.replaced else "wrote"
            print(
                f"{verb} {written.cert} (for {', '.join(written.names)}; "
                f"until {written.not_after:%Y-%m-%d})"
            )
            print(f"{verb} {written.key} (its private key, mode 0600)")
            print(f"the service on {args.name} (a3c-master or a3c-worker) takes:")
            print(f"A3C_TLS_CERT={written.cert}")
            print(f"A3C_TLS_KEY={written.key}")
            print(f"A3C_TLS_CA={args.dir / 'ca.crt'}")
    except CertError as exc:
        print(f"a3c-certs: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
