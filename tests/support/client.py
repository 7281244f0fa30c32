"""What the client's tests share: a MockTransport handler that replays answers and keeps the
requests, a client on it with short backoffs, and the tensors and replies they exchange."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import torch

from a3c_http.net.client import MasterClient
from a3c_http.wire import tensors as wire

BASE = "http://master.test:33333"
SPEC = {"w": (2, 2), "b": (2,)}
LAYOUT = wire.Layout(list(SPEC.items()), n_params=6)
TENSORS = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([0.5, -0.5])}

Handler = Callable[[httpx.Request], httpx.Response]


class Recorder:
    """A MockTransport handler that replays `responses` in order (the last one repeats) and keeps
    every request. A response may be an exception instance, which is raised instead."""

    def __init__(self, *responses: httpx.Response | Exception | Handler) -> None:
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        item = self.responses[min(len(self.requests), len(self.responses)) - 1]
        if isinstance(item, Exception):
            raise item
        if callable(item) and not isinstance(item, httpx.Response):
            return item(request)
        return item

    @property
    def calls(self) -> int:
        return len(self.requests)


def make_client(handler: Recorder, **kwargs) -> MasterClient:
    options = {"backoff_s": 0.001, "max_backoff_s": 0.002, "retry_deadline_s": 5.0} | kwargs
    return MasterClient(BASE, transport=httpx.MockTransport(handler), **options)


def ok_health() -> httpx.Response:
    return httpx.Response(200, json={"status": "ok"})


def weights_response(version: int, stop: bool = False) -> httpx.Response:
    headers = {wire.VERSION_HEADER: str(version), "Content-Type": wire.CONTENT_TYPE}
    if stop:
        headers["X-A3C-Stop"] = "1"
    return httpx.Response(200, content=wire.encode(TENSORS), headers=headers)
