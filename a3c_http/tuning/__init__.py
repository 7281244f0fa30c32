"""Every use of a library's private internals, behind one switch: the performance tricks, and the
bounds on a request's head that uvicorn does not offer.

The rest of the project calls only the functions of this package (the request-head bounds are in
heads.py); none of its other modules touches a private attribute of uvicorn, httpx, httpcore or
torch, nor the C library. Each function states what it changes and the figure that justifies it,
and each falls back to the plain path (with one
warning in the log, once per process) when what it relies on is not there as it expects.

`A3C_TUNING` (read once per process, at the first call here; `on` by default, `off`, or any
spelling of a boolean pydantic accepts) turns them all off: the services then run on plain
FastAPI/uvicorn, httpx and torch: each function is then a no-op or the library's own path, as its
docstring says (the request heads are then bounded by uvicorn's own limits only).

Written against uvicorn 0.54, h11 0.16, httpcore 1.0 (httpx 0.28) and torch 2.13; pyproject.toml
bounds them, and tests/unit/test_tuning.py names what changed here when a newer one differs.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import gc
import importlib
import logging
import math
import os
from typing import TYPE_CHECKING, Any

from a3c_http.server.coalesce import HeldTransport

if TYPE_CHECKING:
    import torch

ENV = "A3C_TUNING"
_LOG = logging.getLogger("a3c.tuning")

_enabled: bool | None = None
_warned: set[str] = set()
# What this process installed, by name (tests/unit/test_tuning.py: nothing with the switch off).
installed: set[str] = set()


def enabled() -> bool:
    """The switch, read from `A3C_TUNING` at the first call (a value that is not a boolean raises
    ValueError naming the variable)."""
    global _enabled
    if _enabled is None:
        raw = os.environ.get(ENV, "").strip()
        if not raw:
            _enabled = True
        else:
            from pydantic import TypeAdapter, ValidationError

            try:
                _enabled = TypeAdapter(bool).validate_python(raw)
            except ValidationError:
                raise ValueError(f"{ENV}={raw!r}: must be on or off") from None
    return _enabled


def _fall_back(what: str, why: str) -> None:
    """One warning per trick and process: it is off, the plain path runs."""
    if what not in _warned:
        _warned.add(what)
        _LOG.warning("a3c_http/tuning/: %s is off (%s); the plain path runs", what, why)


def _uvicorn_classes(tried: set[str], names: dict[str, str]) -> list[tuple[str, type]]:
    """The classes of `names` (module -> class) not tried before in this process, importable
    (httptools is optional), as ("module.Class", class); each is marked tried."""
    found = []
    for module_name, class_name in names.items():
        if module_name in tried:
            continue
        tried.add(module_name)
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            continue
        found.append((f"{module_name}.{class_name}", cls))
    return found


# --- uvicorn: one send for a response's head and body -----------------------------------------

# The protocol classes uvicorn makes a connection's protocol from (h11 always, httptools when
# installed), and the method whose transport argument is replaced.
UVICORN_PROTOCOLS = {
    "uvicorn.protocols.http.httptools_impl": "HttpToolsProtocol",
    "uvicorn.protocols.http.h11_impl": "H11Protocol",
}
_held_tried: set[str] = set()


def install_server_hooks() -> None:
    """Give every connection this process's uvicorn accepts from now on a `HeldTransport`
    (a3c_http/server/coalesce.py): what uvicorn writes in one turn of the event loop leaves in one
    send, where uvicorn writes a response's head and body apart and wakes the peer twice (about
    12 % of the master's CPU a push, docs/performance.md "The parameter server").

    Wraps `connection_made` of uvicorn's protocol classes (not public API), once per class and
    process. A class that is absent (httptools is optional) is skipped; one whose
    `connection_made` no longer takes `(self, transport)` is left as it is, with a warning."""
    if not enabled():
        return
    for name, cls in _uvicorn_classes(_held_tried, UVICORN_PROTOCOLS):
        problem = uvicorn_protocol_problem(cls)
        if problem:
            _fall_back(f"one send per response ({name})", problem)
            continue
        made = cls.connection_made

        @functools.wraps(made)
        def connection_made(self: Any, transport: asyncio.Transport, made: Any = made) -> None:
            made(self, HeldTransport(transport))

        cls.connection_made = connection_made
        installed.add(f"{name}.connection_made")


def uvicorn_protocol_problem(cls: type) -> str | None:
    """What `install_server_hooks` cannot rely on in `cls` (None: all there): a
    `connection_made(self, transport)` that keeps the transport it is given to write to."""
    import inspect

    made = getattr(cls, "connection_made", None)
    if not callable(made):
        return "connection_made is gone"
    try:
        params = list(inspect.signature(made).parameters)
    except (TypeError, ValueError):
        return "connection_made has no signature"
    if params[:2] != ["self", "transport"] or len(params) > 2:
        return f"connection_made takes ({', '.join(params)}), not (self, transport)"
    return None


# --- httpx/httpcore: the network backend of an outbound transport ------------------------------


def install_network_backend(transport: Any, backend: Any) -> bool:
    """Make `backend` (an httpcore.SyncBackend) open every connection `transport` (an
    httpx.HTTPTransport) opens from now on. httpx names no network backend, but the httpcore
    pool it keeps in `_pool` takes one in `_network_backend` (neither is public API). True when
    installed; False with the switch off, or with a warning when the pool is not as expected:
    the transport then stays httpx's own.

    a3c_http/net/outbound.py's backend bounds a whole attempt (deadline, stop event) where httpx
    bounds each read, and sends a request's head and body in one write."""
    if not enabled():
        return False
    problem = httpx_transport_problem(transport)
    if problem:
        _fall_back("outbound network backend (httpx.HTTPTransport._pool)", problem)
        return False
    transport._pool._network_backend = backend
    installed.add("httpx.HTTPTransport._pool._network_backend")
    return True


def httpx_transport_problem(transport: Any) -> str | None:
    """What `install_network_backend` cannot rely on in `transport` (None: all there)."""
    import httpcore

    pool = getattr(transport, "_pool", None)
    if pool is None:
        return "httpx.HTTPTransport has no _pool"
    if not isinstance(getattr(pool, "_network_backend", None), httpcore.SyncBackend):
        return f"{type(pool).__name__} has no _network_backend that is an httpcore.SyncBackend"
    return None


# --- glibc: keep freed buffers for the next push ----------------------------------------------

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc refuses a larger mmap threshold on 64-bit systems (half its heaps' maximum size).
_MAX_MMAP_THRESHOLD = 32 * 1024 * 1024


def keep_freed_memory(largest: int) -> bool:
    """Ask glibc's malloc (`mallopt`, through ctypes) to serve allocations of up to `largest`
    bytes (at most 32 MiB) from its heap and to keep up to four times that freed at the heap's
    top instead of returning it to the system. True when glibc took both settings; False with
    the switch off, or on another C library (musl, macOS: no mallopt), where nothing changes.

    Why: above glibc's mmap threshold each push's model-sized buffers were fresh pages, faulted
    in again at every push (1.5 to 2.5 ms of CPU a push of the 1M model, docs/performance.md
    "The parameter server"). What stays mapped is bounded by `largest` (the services pass
    A3C_MAX_BODY_BYTES) times the few buffers a push holds at once."""
    if not enabled():
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    threshold = min(max(largest, 128 * 1024), _MAX_MMAP_THRESHOLD)
    done = bool(mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, 4 * threshold)
    )
    if done:
        installed.add("mallopt")
    return done


# --- the garbage collector: start-up's objects out of its sight -------------------------------


def freeze_startup_objects() -> None:
    """`gc.freeze()`: what start-up built (torch, gymnasium, FastAPI, the app) lives as long as
    the process, so the collector stops scanning it (a full collection took about 0.1 s,
    docs/performance.md "Tuning behind one fence"). Nothing with the switch off."""
    if not enabled():
        return
    gc.freeze()
    installed.add("gc.freeze")


# --- torch: RMSprop's step through Adagrad's fused kernel -------------------------------------

# Adagrad's sum is alpha / (1 - alpha) times square_avg, 99 times at alpha 0.99 (make_optimizer's):
# a checked gradient's then stays finite (a3c_http/optim/flatnet.py GRADIENT_LIMIT: 99e36 + 1e36 is
# below float32's 3.4e38). A larger alpha takes torch's operations.
FUSED_ALPHA_MAX = 0.99
_fused: bool | None = None  # the kernel is there and computes what rmsprop_step counts on
_torch: Any = None  # torch, once probed (this module does not import it for those that don't)


def fused_adagrad_problem() -> str | None:
    """What `rmsprop_step` cannot rely on in this torch (None: all there): its private
    `torch._fused_adagrad_` kernel for the CPU (2.4 and later), taking the arguments it is given
    here and computing what it counts on (a sum of 1 and eps 1 move a weight by -lr 1 / 2)."""
    import torch

    weight = torch.zeros(1)
    try:
        torch._fused_adagrad_(
            [weight], [torch.ones(1)], [torch.zeros(1)], [torch.ones(())], lr=1.0, lr_decay=0.0,
            weight_decay=0.0, eps=1.0, maximize=False,
        )  # fmt: skip
    except AttributeError:
        return "torch._fused_adagrad_ is gone"
    except (TypeError, RuntimeError, NotImplementedError) as exc:
        return f"torch._fused_adagrad_ refused its arguments ({type(exc).__name__}: {exc})"
    if weight.item() != -0.5:
        return f"torch._fused_adagrad_ moved a weight to {weight.item()}, not -0.5"
    return None


def fused_rmsprop() -> bool:
    """Whether `rmsprop_step` may take the fused kernel in this process: the switch is on and
    the kernel passed `fused_adagrad_problem` (probed once, at the first call)."""
    global _fused, _torch
    if _fused is not None:
        return _fused
    import torch

    _torch = torch
    if not enabled():
        _fused = False
        return False
    problem = fused_adagrad_problem()
    if problem:
        _fall_back("PlainRMSprop's fused step", problem)
    _fused = problem is None
    if _fused:
        installed.add("torch._fused_adagrad_")
    return _fused


def rmsprop_step(
    p: torch.Tensor, square_avg: torch.Tensor, step: torch.Tensor, alpha: float, eps: float,
    lr: float,
) -> bool:  # fmt: skip
    """RMSprop's plain step of `p` (its `grad`, `square_avg` and the already counted `step`)
    through torch's fused Adagrad kernel, what `Adagrad(fused=True)` runs: True when taken, False
    when the caller must take torch's operations (switch off, kernel absent or changed, alpha
    over FUSED_ALPHA_MAX, or tensors the kernel cannot read as one run of float32 values on the
    CPU: it would read a strided gradient wrongly).

    Adagrad adds g^2 to its sum and moves a weight by -clr g / (sqrt(sum) + eps'). Given the sum
    alpha square_avg / (1 - alpha), clr = lr / sqrt(1 - alpha) and eps' = eps / sqrt(1 - alpha),
    its sum is RMSprop's new square_avg over (1 - alpha) and its move RMSprop's step: the same
    maths, equal up to float32 rounding (tests/unit/test_a3c_loss.py). About 2x faster than torch's
    RMSprop on a million parameters (docs/performance.md "The parameter server")."""
    g = p.grad
    if not (
        (_fused if _fused is not None else fused_rmsprop())
        and alpha <= FUSED_ALPHA_MAX
        and p.is_cpu and g.is_cpu and square_avg.is_cpu
        and p.dtype == g.dtype == square_avg.dtype == _torch.float32
        and p.is_contiguous() and g.is_contiguous() and square_avg.is_contiguous()
    ):  # fmt: skip
        return False
    root = math.sqrt(1 - alpha)
    square_avg.mul_(alpha / (1 - alpha))  # the sum: alpha square_avg / (1 - alpha)
    _torch._fused_adagrad_(
        [p], [g], [square_avg], [step], lr=lr / root, lr_decay=0.0, weight_decay=0.0,
        eps=eps / root, maximize=False,
    )  # fmt: skip
    square_avg.mul_(1 - alpha)  # the new square_avg again
    return True


# The bounds on request heads: uvicorn's protocol classes wrapped, in a module of their own.
from a3c_http.tuning.heads import (  # noqa: E402, F401  (this package's interface)
    CONNECTION_METHODS,
    HEAD_PROTOCOLS,
    bound_request_heads,
)
