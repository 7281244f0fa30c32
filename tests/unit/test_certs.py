"""`a3c-certs` (a3c_http/cli/certs.py): a CA and hosts' certificates that Python's ssl accepts as
the services use them: a server verified by a client that trusts only ca.crt, by IP address and by
DNS name, with the host name checked; a server that requires client certificates (mutual TLS)
accepting another host of the same CA and refusing a client without one. In-process, on loopback
sockets; and the command's mistakes, each one line and exit status 2."""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
import ssl
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("cryptography", reason="pip install cryptography (the tls extra)")
from cryptography import x509  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402

from a3c_http.cli import certs  # noqa: E402

TIMEOUT_S = 5.0


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and two hosts: `server` (127.0.0.1, localhost, ::1 and a DNS name) and `client`."""
    folder = tmp_path_factory.mktemp("pki") / "certs"  # made by the command
    assert certs.main(["ca", "--dir", str(folder)]) == 0
    assert certs.main(
        ["host", "server", "127.0.0.1", "localhost", "::1", "a3c.example", "--dir", str(folder)]
    ) == 0  # fmt: skip
    assert certs.main(["host", "client", "--dir", str(folder), "--days", "30"]) == 0
    return folder


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_the_files_and_their_modes(made: Path) -> None:
    assert sorted(p.name for p in made.iterdir()) == [
        "ca.crt", "ca.key", "client.crt", "client.key", "server.crt", "server.key",
    ]  # fmt: skip
    for key in ("ca.key", "server.key", "client.key"):
        assert stat.S_IMODE((made / key).stat().st_mode) == 0o600, key
    # Each host's file holds its own certificate only: the CA goes separately, as A3C_TLS_CA.
    assert (made / "server.crt").read_text().count("BEGIN CERTIFICATE") == 1


def test_the_ca_and_the_hosts_certificates(made: Path) -> None:
    ca, server, client = (load(made / f"{n}.crt") for n in ("ca", "server", "client"))
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert ca.not_valid_after_utc - ca.not_valid_before_utc > dt.timedelta(days=9 * 365)
    for host in (server, client):
        assert host.issuer == ca.subject
        assert host.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
        usage = host.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert set(usage) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
        host.verify_directly_issued_by(ca)
    assert server.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "server"
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["server", "localhost", "a3c.example"]
    assert sans.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"),
    ]  # fmt: skip
    lifetime = client.not_valid_after_utc - client.not_valid_before_utc
    assert dt.timedelta(days=30) <= lifetime <= dt.timedelta(days=30, minutes=10)


# -- the certificates in TLS, with Python's ssl -------------------------------------------------


@contextmanager
def tls_server(context: ssl.SSLContext) -> Iterator[tuple[int, list[object]]]:
    """A server on 127.0.0.1 that completes a TLS handshake with each client and sends the common
    name of the client's certificate (or `-`); `outcomes` gets that name, or the handshake's
    error."""
    outcomes: list[object] = []
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.02)  # how soon it sees `done`
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            raw.settimeout(TIMEOUT_S)
            try:
                with context.wrap_socket(raw, server_side=True) as tls:
                    peer = tls.getpeercert()
                    name = dict(x[0] for x in peer["subject"])["commonName"] if peer else "-"
                    outcomes.append(name)
                    tls.sendall(name.encode())
            except (ssl.SSLError, OSError) as exc:
                outcomes.append(exc)
                raw.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], outcomes
    finally:
        done.set()
        thread.join(TIMEOUT_S)
        listener.close()


def server_context(made: Path, mutual: bool = False) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(made / "server.crt", made / "server.key")
    if mutual:  # as the services under A3C_TLS_MUTUAL=true
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(made / "ca.crt")
    return context


def client_context(made: Path, cert: str | None = None) -> ssl.SSLContext:
    # Only our CA: the system's are not asked. check_hostname and CERT_REQUIRED are the defaults.
    context = ssl.create_default_context(cafile=str(made / "ca.crt"))
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    if cert:
        context.load_cert_chain(made / f"{cert}.crt", made / f"{cert}.key")
    return context


def talk(port: int, context: ssl.SSLContext, server_hostname: str) -> bytes:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as raw,
        context.wrap_socket(raw, server_hostname=server_hostname) as tls,
    ):
        return tls.recv(64)


def refused(port: int, context: ssl.SSLContext) -> None:
    """The server refuses the client's certificate (or its lack of one). In TLS 1.3 the client's
    side of the handshake ends first: the refusal is what it reads next, an alert or the end."""
    try:
        answer = talk(port, context, "localhost")
    except (ssl.SSLError, ConnectionError):
        return
    assert answer == b"", f"the server answered {answer!r}"


def test_a_client_verifies_the_server_by_ip_address_and_by_dns_name(made: Path) -> None:
    with tls_server(server_context(made)) as (port, outcomes):
        assert talk(port, client_context(made), "127.0.0.1") == b"-"
        assert talk(port, client_context(made), "localhost") == b"-"
        assert talk(port, client_context(made), "a3c.example") == b"-"
    assert outcomes == ["-", "-", "-"]


def test_a_name_the_certificate_does_not_hold_fails_verification(made: Path) -> None:
    with tls_server(server_context(made)) as (port, _):
        for name in ("other.example", "10.0.0.1"):
            with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
                talk(port, client_context(made), name)
        # Nor does a client that trusts the system's CAs only accept the server.
        with pytest.raises(ssl.SSLCertVerificationError):
            talk(port, ssl.create_default_context(), "localhost")


def test_mutual_tls_takes_a_host_of_the_same_ca_and_refuses_a_client_without_one(
    made: Path,
) -> None:
    with tls_server(server_context(made, mutual=True)) as (port, outcomes):
        assert talk(port, client_context(made, cert="client"), "localhost") == b"client"
        refused(port, client_context(made))
    assert outcomes[0] == "client"
    (refusal,) = outcomes[1:]
    assert isinstance(refusal, ssl.SSLError) and "CERTIFICATE" in str(refusal).upper()


def test_mutual_tls_refuses_a_certificate_of_another_ca(made: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    assert certs.main(["ca", "--dir", str(other)]) == 0
    assert certs.main(["host", "client", "--dir", str(other)]) == 0
    stranger = client_context(made)
    stranger.load_cert_chain(other / "client.crt", other / "client.key")
    with tls_server(server_context(made, mutual=True)) as (port, outcomes):
        refused(port, stranger)
    (refusal,) = outcomes
    assert isinstance(refusal, ssl.SSLCertVerificationError)


# -- the command's answers ------------------------------------------------------------------------


def test_it_prints_the_files_and_the_variables_to_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "certs"
    assert certs.main(["ca", "--dir", str(folder)]) == 0
    assert f"A3C_TLS_CA={folder / 'ca.crt'}" in capsys.readouterr().out.splitlines()
    assert certs.main(["host", "master", "10.0.0.10", "--dir", str(folder)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"A3C_TLS_CERT={folder / 'master.crt'}" in out
    assert f"A3C_TLS_KEY={folder / 'master.key'}" in out
    assert f"A3C_TLS_CA={folder / 'ca.crt'}" in out
    assert any(line.startswith(f"wrote {folder / 'master.crt'}") for line in out)
    # Again for the same host: a renewal, which replaces its files and says so.
    before = (folder / "master.key").read_bytes()
    assert certs.main(["host", "master", "10.0.0.10", "--dir", str(folder)]) == 0
    assert capsys.readouterr().out.startswith(f"replaced {folder / 'master.crt'}")
    assert (folder / "master.key").read_bytes() != before


def error_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert certs.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()  # one line, no stack trace
    assert line.startswith("a3c-certs: error: ")
    return line


def test_an_existing_ca_is_never_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert certs.main(["ca", "--dir", str(tmp_path)]) == 0
    capsys.readouterr()
    before = {p: p.read_bytes() for p in (tmp_path / "ca.crt", tmp_path / "ca.key")}
    assert "a CA is never replaced" in error_of(["ca", "--dir", str(tmp_path)], capsys)
    assert {p: p.read_bytes() for p in before} == before
    # Nor by a host of that name.
    assert "the CA's own name" in error_of(["host", "ca", "--dir", str(tmp_path)], capsys)
    assert {p: p.read_bytes() for p in before} == before


def test_a_host_without_a_ca_says_how_to_make_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = error_of(["host", "w1", "--dir", str(tmp_path)], capsys)
    assert "no CA in" in line and f"a3c-certs ca --dir {tmp_path}" in line
    assert list(tmp_path.iterdir()) == []


def test_a_host_certificate_is_no_ca(
    made: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for suffix in ("crt", "key"):
        (tmp_path / f"ca.{suffix}").write_bytes((made / f"server.{suffix}").read_bytes())
    assert "is not a CA's certificate" in error_of(["host", "w1", "--dir", str(tmp_path)], capsys)
    (tmp_path / "ca.key").write_bytes((made / "client.key").read_bytes())
    assert "is not the key of" in error_of(["host", "w1", "--dir", str(tmp_path)], capsys)


@pytest.mark.parametrize(
    "bad", ["bad name", "under_score.example", "trail-.example", "10.0.0", "a..b", "x" * 64]
)
def test_a_bad_address_is_refused(
    bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert certs.main(["ca", "--dir", str(tmp_path)]) == 0
    capsys.readouterr()
    assert "not an IP address or a DNS name" in error_of(
        ["host", "w1", bad, "--dir", str(tmp_path)], capsys
    )
    assert not (tmp_path / "w1.key").exists()


def test_an_unwritable_folder_and_bad_days_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "a-file"
    afile.write_text("")
    assert "cannot make the folder" in error_of(["ca", "--dir", str(afile / "certs")], capsys)
    assert "--days" in error_of(["ca", "--dir", str(tmp_path), "--days", "0"], capsys)
    assert "--days" in error_of(["ca", "--dir", str(tmp_path), "--days", "99999999"], capsys)
    for name in ("../escape", ".."):
        assert "cannot name" in error_of(["host", name, "--dir", str(tmp_path)], capsys)


def test_without_cryptography_it_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "cryptography", None)  # an import of it fails
    line = error_of(["ca", "--dir", str(tmp_path)], capsys)
    assert "pip install 'a3c-http[tls]'" in line and "openssl" in line
    assert list(tmp_path.iterdir()) == []
