"""How `a3c-hosts` reaches a host: the system `ssh` (`Ssh`) and the `sh` scripts it runs there
(`up`'s gets the files of a3c_http/cli/hostscarry.py as a gzipped tar on its stdin).

On each host everything lives in one folder of its own, `<remote dir>/<host>` (mode 0700):

    env/          the environment packages (put first on the workers' PYTHONPATH)
    tls/          ca.crt, host.crt, host.key (mode 0600): A3C_TLS_CA, A3C_TLS_CERT, A3C_TLS_KEY
    token         the token (mode 0600): A3C_TOKEN_FILE, never on a command line
    worker.env    the other variables (A3C_ENV_MODULES, A3C_MASTER_URL, ...; mode 0600)
    PORT.pid      the pid of the worker on PORT, written by the process that becomes it
    PORT.log      its output

A worker is `a3c-worker` started under `setsid` with its output in PORT.log, so it outlives the
ssh session. It is known by its pid file and checked to still be that worker (its command line
holds `a3c-worker` and `--port PORT`) before anything is said of it or sent to it: a pid the
system gave to another process since is never signalled. The hosts need `sh`, `tar` with gzip,
`setsid` and Linux's /proc.
"""

from __future__ import annotations

import math
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from a3c_http.cli.hostsfile import Host

REMOTE_DIR = ".a3c-hosts"  # relative: under the ssh user's home

# Every script gets the host's folder as $1; `alive PID PORT` is true while PID is that worker.
_PRELUDE = r"""
set -u
d=$1; shift
case $d in "~/"*) d=$HOME/${d#"~/"} ;; esac
alive() {
    [ -n "$1" ] && [ -r "/proc/$1/cmdline" ] &&
        tr '\000' ' ' < "/proc/$1/cmdline" | grep -q -- "a3c-worker .*--port $2 "
}
ended() {  # no such process, or a zombie: its ports and files released
    [ ! -r "/proc/$1/stat" ] || [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -c1)" = Z ]
}
"""

# $1 the folder, then the address to bind, the folder of a3c-worker (empty: PATH), the ports.
# stdin: the bundle. Prints `running PORT PID` (already running: left as it is), `started PORT
# PID`, or `error WHAT` and exits 3 (4: no a3c-worker there).
UP = (
    _PRELUDE
    + r"""
bind=$1; bin=$2; shift 2
case $bin in "~/"*) bin=$HOME/${bin#"~/"} ;; ""|/*) ;; *) bin=$PWD/$bin ;; esac
mkdir -p "$d" && chmod 700 "$d" && cd "$d" || { echo "error cannot make the folder $d"; exit 3; }
rm -rf env tls token worker.env
tar -xzf - || { echo "error tar could not unpack the files into $d"; exit 3; }
worker=a3c-worker; [ -n "$bin" ] && worker=$bin/a3c-worker
command -v "$worker" > /dev/null 2>&1 || { echo "error no-worker $worker"; exit 4; }
command -v setsid > /dev/null 2>&1 || { echo "error no setsid there (util-linux)"; exit 3; }
unset A3C_TOKEN; export A3C_TOKEN_FILE="$PWD/token"
[ -d env ] && export PYTHONPATH="$PWD/env${PYTHONPATH:+:$PYTHONPATH}"
[ -f tls/host.crt ] && export A3C_TLS_CERT="$PWD/tls/host.crt" A3C_TLS_KEY="$PWD/tls/host.key"
[ -f tls/ca.crt ] && export A3C_TLS_CA="$PWD/tls/ca.crt"
set -a; . ./worker.env; set +a
started=""
for port; do
    if [ -f "$port.pid" ] && alive "$(cat "$port.pid")" "$port"; then
        echo "running $port $(cat "$port.pid")"; continue
    fi
    rm -f "$port.pid"
    setsid sh -c 'echo $$ > "$0.pid"; exec "$@"' "$port" "$worker" --host "$bind" --port "$port" \
        > "$port.log" 2>&1 < /dev/null &
    started="$started $port"
done
for port in $started; do
    i=0; while [ ! -s "$port.pid" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
    echo "started $port $(cat "$port.pid" 2> /dev/null)"
done
"""
)

# $1 the folder, then the ports. Prints `none PORT` (no pid file), `running PORT PID`, or
# `dead PORT PID LAST-LOG-LINE`.
STATUS = (
    _PRELUDE
    + r"""
cd "$d" 2> /dev/null || { for port; do echo "none $port"; done; exit 0; }
for port; do
    [ -f "$port.pid" ] || { echo "none $port"; continue; }
    pid=$(cat "$port.pid")
    if alive "$pid" "$port"; then echo "running $port $pid"
    else echo "dead $port ${pid:-?} $(tail -n 1 "$port.log" 2> /dev/null | tr -d '\r')"; fi
done
"""
)

# $1 the folder, then the seconds a worker has to end after SIGTERM, then the ports. Prints
# `none PORT`, `gone PORT PID` (its pid file named a process that had ended), `stopped PORT PID`,
# or `killed PORT PID` (SIGKILL to its process group after the grace); returns once each signalled
# one has ended (at most 5 s more).
DOWN = (
    _PRELUDE
    + r"""
grace=$1; shift
cd "$d" 2> /dev/null || { for port; do echo "none $port"; done; exit 0; }
signalled=""
for port; do
    [ -f "$port.pid" ] || { echo "none $port"; continue; }
    pid=$(cat "$port.pid")
    if alive "$pid" "$port"; then kill -TERM "$pid" 2> /dev/null; signalled="$signalled $port"
    else rm -f "$port.pid"; echo "gone $port ${pid:-?}"; fi
done
i=0
while [ -n "$signalled" ] && [ $i -lt $((grace * 20)) ]; do
    left=0
    for port in $signalled; do alive "$(cat "$port.pid")" "$port" && left=1; done
    [ $left = 0 ] && break
    sleep 0.05; i=$((i + 1))
done
pids=""
for port in $signalled; do
    pid=$(cat "$port.pid")
    if alive "$pid" "$port"; then
        kill -KILL -- "-$pid" 2> /dev/null || kill -KILL "$pid"; echo "killed $port $pid"
    else echo "stopped $port $pid"; fi
    pids="$pids $pid"
    rm -f "$port.pid"
done
# Each one's exit finished (a process leaves its command line before its ports): at most 5 s.
i=0
for pid in $pids; do
    while ! ended "$pid" && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
done
"""
)


@dataclass(frozen=True)
class Reply:
    """What one ssh call came back with; `code` None: it ran past its time and was ended."""

    code: int | None
    out: str
    err: str


@dataclass(frozen=True)
class Ssh:
    """The system `ssh`, never asking anything (BatchMode: keys or an agent, no password, no
    host key accepted unasked), giving up on a connection after `connect_timeout` seconds and on
    a silent one after 15."""

    connect_timeout: float = 10.0
    config: Path | None = None  # -F: a config file of its own
    options: tuple[str, ...] = ()  # -o KEY=VALUE, each

    def argv(self, host: Host, command: str) -> list[str]:
        timeout = math.ceil(self.connect_timeout)
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout}",
                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]  # fmt: skip
        if self.config is not None:
            argv += ["-F", str(self.config)]
        for option in self.options:
            argv += ["-o", option]
        if host.ssh_port:
            argv += ["-p", str(host.ssh_port)]
        if host.user:
            argv += ["-l", host.user]
        return [*argv, "--", host.host, command]

    def run(
        self, host: Host, script: str, args: list[str], stdin: bytes | None, timeout_s: float
    ) -> Reply:
        """`sh -c script a3c-hosts ARGS...` on `host` (whatever its login shell), `stdin` on its
        standard input; ended after `timeout_s` seconds beyond the connection's."""
        command = " ".join(["sh", "-c", shlex.quote(script), "a3c-hosts", *map(shlex.quote, args)])
        try:
            done = subprocess.run(
                self.argv(host, command),
                input=stdin if stdin is not None else b"",
                capture_output=True,
                timeout=self.connect_timeout + timeout_s,
            )
        except subprocess.TimeoutExpired:
            return Reply(None, "", "")
        return Reply(done.returncode, done.stdout.decode(errors="replace"),
                     done.stderr.decode(errors="replace"))  # fmt: skip

    def failure(self, host: Host, reply: Reply, waited_s: float) -> str | None:
        """What went wrong in reaching `host`, and what to do, in one line; None when ssh itself
        did its part (the script's own exit code is the caller's to read)."""
        if reply.code is None:
            return (f"ssh did not finish within {self.connect_timeout + waited_s:g} s: check "
                    "the host and the network, then run it again")  # fmt: skip
        if reply.code != 255:
            return None
        said = [line.strip() for line in reply.err.splitlines() if line.strip()]
        last = said[-1] if said else "ssh failed (exit 255)"
        text = " ".join(said)
        port = f"-p {host.ssh_port} " if host.ssh_port else ""
        destination = f"{port}{host.user + '@' if host.user else ''}{host.host}"
        if "Permission denied" in text:
            why = (f"it did not let us in without a password: add your key to its "
                   f"authorized_keys (ssh-copy-id {destination}) or to ssh-agent")  # fmt: skip
        elif "Host key verification failed" in text or "IDENTIFICATION HAS CHANGED" in text:
            why = (f"its host key is not in your known_hosts, or changed: run `ssh "
                   f"{destination}` once to check and accept it")  # fmt: skip
        elif "Could not resolve" in text:
            why = "check the host's name"
        else:
            why = "check its address and ssh port, and that sshd runs there"
        return f"cannot reach it over ssh ({last}): {why}"
