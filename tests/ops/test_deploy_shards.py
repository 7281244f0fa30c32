"""The Kubernetes overlay that gives the parameter-server shards a role of their own
(deploy/kubernetes/overlays/shards): what the master is told names the StatefulSet's pods, and
every side holds the same secret. The base and the other overlays are tests/ops/test_deploy.py's,
whose helpers these are."""

from __future__ import annotations

import subprocess

import yaml

from a3c_http.cli import servers
from tests.ops.test_deploy import (
    KUBERNETES,
    SECRET,
    container,
    documents,
    env,
    kustomization,
    kustomize_command,
    pod,
    validate,
)

SHARDS = KUBERNETES / "overlays" / "shards"


def rendered() -> dict[tuple[str, str], dict]:
    run = subprocess.run(
        [*kustomize_command(), str(SHARDS)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(run.stdout) if d}


def test_the_master_is_told_each_shard_pod_and_both_hold_the_secret() -> None:
    assert kustomization(SHARDS)["resources"][0] == "../../base"
    resources = rendered()
    assert not [p for d in resources.values() if (p := validate(d))]
    sts, service = resources["StatefulSet", "a3c-shard"], resources["Service", "a3c-shard"]
    assert service["spec"]["clusterIP"] == "None"  # a name for each pod
    assert sts["spec"]["serviceName"] == service["metadata"]["name"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    shard = container(sts)
    assert shard["command"][:2] == ["uvicorn", "master.shards.app:app"]
    port = int(shard["command"][shard["command"].index("--port") + 1])
    assert port == service["spec"]["ports"][0]["port"] == servers.SHARD_PORT
    master = container(resources["Deployment", "a3c-master"])
    urls = env(master)["A3C_SHARDS_URLS"]["value"].split(",")
    name = service["metadata"]["name"]
    assert urls == [f"http://{name}-{i}.{name}:{port}" for i in range(sts["spec"]["replicas"])]
    for c in (master, shard):
        ref = env(c)["A3C_SHARDS_SECRET"]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == (SECRET, "A3C_SHARDS_SECRET")
        assert env(c)["A3C_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == SECRET
    # Confined as the base's pods are; the image's own user, a read-only root.
    assert pod(sts)["securityContext"]["runAsNonRoot"] is True
    assert shard["securityContext"]["readOnlyRootFilesystem"] is True
    assert all(documents(SHARDS / f) for f in kustomization(SHARDS)["resources"][1:])

