"""Dependencies shared by the master's routers, as Annotated aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from master.state import ClusterState


def get_state(request: Request) -> ClusterState:
    return request.app.state.cluster


State = Annotated[ClusterState, Depends(get_state)]
