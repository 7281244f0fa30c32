"""`a3c-master` and `a3c-worker` before they serve (a3c_http/cli/servers.py): what they refuse with
one line instead of uvicorn's bare error."""

from __future__ import annotations

import socket

import pytest

from a3c_http.cli import servers


def test_a_port_in_use_is_named_with_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert servers.master(["--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"a3c-master: 127.0.0.1:{port} is in use (another a3c-master serving there?" in err
