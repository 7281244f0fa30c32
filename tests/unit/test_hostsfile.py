"""`a3c-hosts` without any host: the hosts file's lines and its refusals, what `up` carries and
sets, and what a failed ssh says (a3c_http/cli/hostsfile.py, hostscarry.py, hostsremote.py; the
command against real sshd daemons: tests/ops/test_hosts.py)."""

from __future__ import annotations

import io
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from a3c_http.cli import hosts
from a3c_http.cli.hostscarry import CarryError, plan
from a3c_http.cli.hostsfile import Host, HostsFileError, parse_hosts
from a3c_http.cli.hostsremote import Reply, Ssh
from a3c_http.net import tls


def test_a_hosts_file_reads_every_form(tmp_path: Path) -> None:
    (tmp_path / "w3.crt").write_text("x")
    (tmp_path / "w3.key").write_text("x")
    lines = [
        "# the cluster",
        "10.0.0.11                        # one worker, on 8001",
        "",
        "ubuntu@[fd00::12]:2222  8001,8003-8004",
        "gpu3  workers=2  address=10.0.0.13  cert=w3.crt key=w3.key  bin=~/a3c/.venv/bin",
        "gpu4.lan:22  8005  bind=0.0.0.0",
    ]
    one, two, three, four = parse_hosts(lines, "hosts.txt", tmp_path)
    assert (one.line, one.name, one.ports, one.address, one.bind) == (
        2, "10.0.0.11", (8001,), "10.0.0.11", "10.0.0.11",
    )  # fmt: skip
    assert (two.user, two.host, two.ssh_port, two.ports, two.bind) == (
        "ubuntu", "fd00::12", 2222, (8001, 8003, 8004), "fd00::12",
    )  # fmt: skip
    assert two.name == "ubuntu@[fd00::12]:2222" and two.url(8003, "https") == "https://[fd00::12]:8003"
    assert (three.ports, three.address, three.bind, three.bin) == (
        (8001, 8002), "10.0.0.13", "10.0.0.13", "~/a3c/.venv/bin",
    )  # fmt: skip
    assert three.cert == tmp_path / "w3.crt" and three.key == tmp_path / "w3.key"
    # A name is bound as 0.0.0.0 unless told: the host resolves its own name as it likes.
    assert (four.bind, four.folder) == ("0.0.0.0", "gpu4.lan_22")


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("-oProxyCommand=touch", "expected [user@]host[:sshport]"),
        ("h 8001 8002", "expected option=value"),
        ("h 70000", "not a number from 1 to 65535"),
        ("h 8004-8001", "not a number from 8004 to 65535"),
        ("h 8001,8001", "port 8001 is listed twice"),
        ("h colour=red", "unknown option 'colour'"),
        ("h cert=a.crt", "cert= and key= go together"),
        ("h 8001 workers=2", "the ports or workers=N, not both"),
        ("h bind=gpu3", "not an IP address"),
        ("fd00::1", "write an IPv6 address in brackets"),
        ("10.0.0.11 8001\nh2 address=10.0.0.11", "a worker at 10.0.0.11:8001 is already on line 2"),
        ("10.0.0.11\nroot@10.0.0.11 8002", "10.0.0.11 is already on line 2"),
    ],
)
def test_a_bad_line_is_refused_naming_its_line(tmp_path: Path, line: str, said: str) -> None:
    lines = ["# first", *line.splitlines()]
    with pytest.raises(HostsFileError) as caught:
        parse_hosts(lines, "hosts.txt", tmp_path)
    message = str(caught.value)
    assert message.startswith(f"hosts.txt line {len(lines)}: ") and said in message, message


def test_a_bad_file_or_a_missing_token_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "hosts.txt"
    bad.write_text("10.0.0.11 8001\n10.0.0.12 80o1\n")
    assert hosts.main(["status", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == f"a3c-hosts: {bad} line 2: port '80o1': '80o1' is not a number from 1 to 65535\n"

    for name in ("A3C_TOKEN", "A3C_TOKEN_FILE", *tls.VARIABLES):
        monkeypatch.delenv(name, raising=False)
    bad.write_text("10.0.0.11\n")
    assert hosts.main(["up", str(bad)]) == 2  # before any ssh: nothing to reach there
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("a3c-hosts: up needs the master's token: set A3C_TOKEN")


def _members(tar_bytes: bytes) -> dict[str, tuple[int, bytes | None]]:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:gz") as tar:
        return {
            m.name: (m.mode, tar.extractfile(m).read() if m.isfile() else None)
            for m in tar.getmembers()
        }


def test_up_carries_packages_wheels_modules_the_token_and_the_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "crawl"
    (package / "__pycache__").mkdir(parents=True)
    (package / "__init__.py").write_text("REGISTERED = True\n")
    (package / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"stale")
    module = tmp_path / "maze.py"
    module.write_text("")
    wheel = tmp_path / "cave-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as whl:
        whl.writestr("cave/__init__.py", "")
        whl.writestr("cave-1.0.dist-info/METADATA", "Name: cave\n")
        whl.writestr("cave-1.0.data/purelib/cave_extra.py", "")
        whl.writestr("cave-1.0.data/scripts/run-cave", "")
    monkeypatch.setenv("A3C_TOKEN", "s3cret-token")
    monkeypatch.setenv("A3C_ENV_MODULES", "mine")
    host = Host(line=1, host="h", user=None, ssh_port=None, ports=(8001,), address="h",
                bind="0.0.0.0")  # fmt: skip

    env = ["A3C_LOG_LEVEL=debug", "ODD=it's $HOME"]
    carry, said = plan([host], tls.TLS(), [package, module, wheel], "more,mine",
                       "http://10.0.0.10:33333", env)  # fmt: skip
    files = _members(carry.for_host(host))
    assert files["token"] == (0o600, b"s3cret-token")
    assert files["env/crawl/__init__.py"][1] == b"REGISTERED = True\n"
    assert {"env/maze.py", "env/cave/__init__.py", "env/cave_extra.py",
            "env/cave-1.0.dist-info/METADATA"} <= set(files)  # fmt: skip
    assert not [n for n in files if "__pycache__" in n or "run-cave" in n or n.startswith("tls")]
    assert files["worker.env"][0] == 0o600
    # The variables, as the worker's sh reads them.
    (tmp_path / "worker.env").write_bytes(files["worker.env"][1])
    shown = subprocess.run(
        ["sh", "-c", '. ./worker.env; printf "%s|%s|%s|%s" "$A3C_ENV_MODULES" "$A3C_MASTER_URL" '
         '"$A3C_LOG_LEVEL" "$ODD"'],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert shown == "mine,more,crawl,maze,cave,cave_extra|http://10.0.0.10:33333|debug|it's $HOME"
    assert said.startswith("a3c-hosts up: 1 worker on 1 host; carrying the token, ")
    assert said.endswith(
        "; setting A3C_TOKEN_FILE, A3C_ENV_MODULES=mine,more,crawl,maze,cave,cave_extra, "
        "A3C_MASTER_URL=http://10.0.0.10:33333, A3C_LOG_LEVEL=debug, ODD"  # a name, not its value
    )
    assert "s3cret" not in said

    inside = r"not a package folder \(no __init__.py\) \(the package in it: .*crawl\?\)"
    with pytest.raises(CarryError, match=inside):
        plan([host], tls.TLS(), [tmp_path])  # the folder that holds the package
    with pytest.raises(tls.TLSError, match="--master-url: http://10.0.0.10:33333 is plain"):
        plan([host], tls.TLS(ca=wheel), [], master_url="http://10.0.0.10:33333")


def test_ssh_never_asks_and_a_failure_says_what_to_do() -> None:
    host = Host(line=1, host="10.0.0.11", user="ubuntu", ssh_port=2222, ports=(8001,),
                address="10.0.0.11", bind="10.0.0.11")  # fmt: skip
    ssh = Ssh(connect_timeout=2.5, options=("IdentityFile=k",))
    argv = ssh.argv(host, "true")
    assert argv[:5] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3"]
    assert argv[-9:] == ["-o", "IdentityFile=k", "-p", "2222", "-l", "ubuntu", "--", "10.0.0.11",
                         "true"]  # fmt: skip

    def said(err: str, code: int | None = 255) -> str | None:
        return ssh.failure(host, Reply(code, "", err), 30)

    denied = said("ubuntu@10.0.0.11: Permission denied (publickey).")
    assert "(ssh-copy-id -p 2222 ubuntu@10.0.0.11)" in denied
    assert "run `ssh -p 2222 ubuntu@10.0.0.11` once" in said("Host key verification failed.")
    refused = said("ssh: connect to host 10.0.0.11 port 2222: Connection refused")
    assert refused == (
        "cannot reach it over ssh (ssh: connect to host 10.0.0.11 port 2222: Connection refused): "
        "check its address and ssh port, and that sshd runs there"
    )
    assert said("", None).startswith("ssh did not finish within 32.5 s")
    assert said("whatever the script said", 3) is None  # ssh did its part
