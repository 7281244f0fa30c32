"""Checks of the services' OpenAPI schemas, shared by the master's and the worker's API tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

ERROR_BODY = "#/components/schemas/ErrorBody"


def operations(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            yield method.upper(), path, op


def assert_errors_declared(schema: dict[str, Any], conflicts: set[tuple[str, str]]) -> None:
    """Each error the services answer is declared where it can happen, with the body it has."""

    def ref(response: dict[str, Any]) -> str:
        return response["content"]["application/json"]["schema"]["$ref"]

    components = schema["components"]["schemas"]
    assert "HTTPValidationError" not in components and "ValidationError" not in components
    assert set(components["ErrorBody"]["properties"]) == {"detail", "errors"}
    seen_conflicts = set()
    for method, path, op in operations(schema):
        responses = op["responses"]
        where = f"{method} {path}"
        for code in ("400", "401", "403", "409", "413", "422"):
            if code in responses:
                assert ref(responses[code]) == ERROR_BODY, (where, code)
        if path == "/healthz":
            assert "401" not in responses and "403" not in responses, where
            continue
        assert {"401", "403"} <= set(responses), where
        assert "WWW-Authenticate" in responses["401"]["headers"], where
        content = op.get("requestBody", {}).get("content", {})
        if content:
            assert "413" in responses, where
        if "application/json" in content:
            assert "400" in responses, where
        if content or op.get("parameters"):
            assert "422" in responses, where
        if "409" in responses:
            seen_conflicts.add((method, path))
    assert seen_conflicts == conflicts


def assert_bearer_everywhere_but_healthz(schema: dict[str, Any]) -> None:
    schemes = schema["components"]["securitySchemes"]
    bearer = {name for name, s in schemes.items() if s == {**s, "type": "http", "scheme": "bearer"}}
    assert bearer, schemes
    for method, path, op in operations(schema):
        names = {name for requirement in op.get("security", []) for name in requirement}
        if path == "/healthz":
            assert not names, f"{method} {path} needs no token"
        else:
            assert names & bearer, f"{method} {path} does not declare the bearer token"
