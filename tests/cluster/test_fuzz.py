"""Bounded fuzzing of the master's OpenAPI schema with schemathesis.

A real `uvicorn master.app:app` process on a free loopback port, with a token, is fuzzed over HTTP
from its own `/openapi.json`, with valid and invalid parameters and bodies, arbitrary bytes for
the safetensors bodies of `POST /gradients` and `POST /local_model_weights`, and the methods a path
does not take. No answer may be a 5xx (but the 503 of a `POST /train` whose workers are all
down), and every answer must be one the schema documents (status code, content type, headers,
body), with every built-in check of schemathesis but one (see `load_schema`).

Two passes over the same master:

- idle: the master as it starts, with no run. Every phase (examples, coverage: boundary and wrong
  values of every field, fuzzing). The fuzzed `POST /train` moves it on; its default worker (the
  workers file) is unreachable, so such runs finish at once.
- running: a run is running before every case (`POST /train` to a stand-in worker in this
  process, which accepts every start and never reports back), so gradients and weights reach the
  model. Examples and fuzzing, more of them for the two tensor bodies.

Then bodies a fuzzer would not make but a broken peer could
(`tests.support.common.bad_tensor_bodies`: safetensors files that almost fit the model, truncated,
another dtype or shape, NaN, a header that lies), each a 422 that the schema documents. (That each
names its problem is checked in-process, in test_http_bad_input.py.)

Bounded and deterministic: a fixed number of examples, derandomized with a fixed seed, no example
database. The master reaches nothing but loopback: its proxy variables send every request to a
fuzzed worker URL to a loopback port where nobody listens.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Iterator

import httpx
import pytest
import requests
import schemathesis
import torch
from safetensors.torch import load, save
from schemathesis import Case

from a3c_http.local.cluster import ServiceProcess, free_port
from a3c_http.testing.standin import StandInWorker
from tests.support.common import AUTH, TOKEN, bad_tensor_bodies

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"
SEED = 20240601
MAX_EXAMPLES = 10  # per operation in the fuzzing phase; the whole file stays under ~90 s
TENSOR_PATHS = ("/gradients", "/local_model_weights")
MAX_TENSOR_EXAMPLES = 40  # the running pass's arbitrary bytes for each of them
# The one 5xx the master means: POST /train when no worker could be started (the workers file's
# worker is unreachable), a 503 the schema documents, which the other checks still judge. Its body
# is one of every algorithm's config sections: the coverage phase made about 2,500 cases of them
# (half the file's time); the bounds of their fields are tests/unit/test_config.py's,
# and here the fuzzing phase sends it MAX_EXAMPLES valid and invalid bodies as it does the rest.
TRAIN_WITHOUT_WORKERS = {
    "include-path": "/train",
    "include-method": "POST",
    "checks": {"not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", "503"]}},
    "phases": {"coverage": {"enabled": False}},
}

# What ran: pass -> "METHOD /path" -> number of cases; pass -> path -> distinct tensor bodies.
CASES: dict[str, Counter[str]] = defaultdict(Counter)
TENSOR_BODIES: dict[str, dict[str, set[bytes]]] = defaultdict(lambda: defaultdict(set))


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    tmp = tmp_path_factory.mktemp("fuzz")
    workers_file = tmp / "workers.txt"
    workers_file.write_text(f"{HOST}:{free_port()}\n")  # nobody listens there
    nowhere = f"http://{HOST}:{free_port()}"  # nor there: the proxy of every non-loopback host
    proxies = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
    env = {
        "A3C_RUN_DIR": str(tmp / "run"),
        "A3C_WORKERS_FILE": str(workers_file),
        **{name: nowhere for name in proxies},
        **{name.lower(): nowhere for name in proxies},
        "NO_PROXY": f"{HOST},localhost",
        "no_proxy": f"{HOST},localhost",
    }
    with pytest.MonkeyPatch.context() as mp:
        for key in list(os.environ):
            if key.startswith("A3C_"):
                mp.delenv(key)
        proc = ServiceProcess(
            "master.app:app", free_port(), tmp / "master.log", host=HOST, env=env, token=TOKEN
        )
    try:
        proc.start()
        proc.wait_healthy(120)
        yield proc
    finally:
        proc.stop()
        assert not proc.running(), "the master is still running"


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(headers=AUTH, timeout=60, trust_env=False) as c:
        yield c


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    """schemathesis's requests go straight to loopback, whatever proxies this host sets."""
    with requests.Session() as s:
        s.trust_env = False
        yield s


def load_schema(
    master: ServiceProcess, coverage: bool, operations: list[dict] | None = None
) -> schemathesis.BaseSchema:
    config = schemathesis.Config.from_dict(
        {
            "seed": SEED,
            # The token on every request (also to /healthz, whose other methods need it), and
            # as the schema's bearer scheme: schemathesis's ignored_auth check then also sends
            # each request without it and with a wrong one, which must be refused.
            "headers": AUTH,
            "auth": {"openapi": {"A3C_TOKEN": {"bearer": TOKEN}}},
            "base-url": master.url,
            "request-timeout": 60,
            # A busy machine makes generation slow, which is no fault of the master.
            "suppress-health-check": ["too_slow"],
            "generation": {
                "mode": "all",  # valid and invalid data
                "max-examples": MAX_EXAMPLES,
                "deterministic": True,
                "database": "none",
            },
            "phases": {"coverage": {"enabled": coverage}, "stateful": {"enabled": False}},
            # Every built-in check but one: positive_data_acceptance wants every request that
            # fits the schema answered 2xx, which this API rightly does not do: bytes that are not
            # a safetensors file are a 422, gradients without a running run a 409
            # (docs/http-api.md).
            "checks": {"positive_data_acceptance": {"enabled": False}},
            "operations": [TRAIN_WITHOUT_WORKERS, *(operations or [])],
        }
    )
    # /openapi.json needs the token too.
    return schemathesis.openapi.from_url(
        f"{master.url}/openapi.json", config=config, headers=AUTH, timeout=60
    )


def run_state(client: httpx.Client, master: ServiceProcess) -> str:
    reply = client.get(f"{master.url}/status")
    assert reply.status_code == 200, reply.text
    return reply.json()["state"]


def ensure_running(client: httpx.Client, master: ServiceProcess, standin: StandInWorker) -> None:
    """A run is running: the last one, or a fresh one whose only worker is the stand-in."""
    if run_state(client, master) != "running":
        body = {"workers": [standin.url], "heartbeat_timeout_s": 3600, "seed": 1}
        reply = client.post(f"{master.url}/train", json=body)
        assert reply.status_code == 202, reply.text
    assert run_state(client, master) == "running"


@pytest.fixture(scope="module")
def idle_schema(master: ServiceProcess, client: httpx.Client) -> schemathesis.BaseSchema:
    assert run_state(client, master) == "idle"
    return load_schema(master, coverage=True)


@pytest.fixture(scope="module")
def running_schema(master: ServiceProcess) -> schemathesis.BaseSchema:
    more_bytes = {
        "include-path": list(TENSOR_PATHS),
        "generation": {"max-examples": MAX_TENSOR_EXAMPLES},
    }
    return load_schema(master, coverage=False, operations=[more_bytes])


@pytest.fixture(autouse=True)
def _nodeid_for_schemathesis(request: pytest.FixtureRequest) -> None:
    # schemathesis 4.32's lazy schemas read and rename `request.node._nodeid`, which pytest 9.2
    # no longer has (it keeps `_id`); give it one. Only report names depend on it.
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


def fuzz_one(case: Case, session: requests.Session, name: str) -> None:
    CASES[name][f"{case.method.upper()} {case.path}"] += 1
    if case.method.upper() == "POST" and case.path in TENSOR_PATHS:
        data = getattr(case.body, "data", case.body)  # schemathesis wraps bytes in `Binary`
        if isinstance(data, bytes):
            TENSOR_BODIES[name][case.path].add(data)
    case.call_and_validate(session=session, timeout=60)


idle = schemathesis.pytest.from_fixture("idle_schema")
running = schemathesis.pytest.from_fixture("running_schema")


@idle.parametrize()
def test_fuzz_idle_master(case: Case, session: requests.Session) -> None:
    fuzz_one(case, session, "idle")


@running.parametrize()
def test_fuzz_running_master(
    case: Case,
    session: requests.Session,
    client: httpx.Client,
    master: ServiceProcess,
    standin: StandInWorker,
) -> None:
    ensure_running(client, master, standin)
    fuzz_one(case, session, "running")


def test_tensor_bodies_that_almost_fit(
    running_schema: schemathesis.BaseSchema,
    session: requests.Session,
    client: httpx.Client,
    master: ServiceProcess,
    standin: StandInWorker,
) -> None:
    """Every almost-fitting body is a documented 422 on both tensor endpoints; the fitting one is
    taken (so the 422s are not the only answer these endpoints can give)."""
    ensure_running(client, master, standin)
    reply = client.get(f"{master.url}/global_model_weights")
    assert reply.status_code == 200, reply.text
    weights = reply.content
    # Only a registered worker takes part, and a worker's gradients are clipped to max_grad_norm.
    registered = client.post(f"{master.url}/worker_started", json={"worker_id": "fuzz"})
    assert registered.status_code == 200, registered.text
    small = save({name: torch.full_like(t, 1e-3) for name, t in load(weights).items()})
    gradients = running_schema["/gradients"]["POST"]
    local = running_schema["/local_model_weights"]["POST"]
    bodies = {"fitting": weights}
    bodies.update((label, body) for label, (body, _) in bad_tensor_bodies(load(weights)).items())
    wrong = []
    for what, body in bodies.items():
        version = client.get(f"{master.url}/status").json()["model_version"]
        cases = [
            gradients.Case(
                headers={"X-Worker-Id": "fuzz", "X-Model-Version": str(version)},
                body=small if what == "fitting" else body,
                media_type="application/octet-stream",
            ),
            *(
                local.Case(
                    query={"worker_id": "fuzz", "temporary": temporary},
                    body=body,
                    media_type="application/octet-stream",
                )
                for temporary in ("true", "false")
            ),
        ]
        for case in cases:
            response = case.call_and_validate(session=session, headers=AUTH, timeout=60)
            expected = 200 if what == "fitting" else 422
            if response.status_code != expected:
                wrong.append((what, case.path, response.status_code, response.text[:200]))
    assert not wrong, wrong


def test_every_operation_was_fuzzed(client: httpx.Client, master: ServiceProcess) -> None:
    """Both passes sent every operation of the schema, and many bodies to the tensor ones."""
    if not CASES:
        pytest.skip("the fuzz tests did not run")
    paths = client.get(f"{master.url}/openapi.json").json()["paths"]
    operations = {f"{method.upper()} {path}" for path, ops in paths.items() for method in ops}
    for name, counts in CASES.items():
        assert operations <= set(counts), (name, operations - set(counts))
        for path in TENSOR_PATHS:
            assert len(TENSOR_BODIES[name][path]) >= 5, (name, path)
    print(
        "fuzz cases:",
        {name: sum(counts.values()) for name, counts in CASES.items()},
        "distinct tensor bodies:",
        {name: {p: len(b) for p, b in bodies.items()} for name, bodies in TENSOR_BODIES.items()},
    )
