"""Building the backend gateway/state_backend.py chose: Redis; or, without it, the worker mesh
for a worker of `serve --workers N`, else local."""

from __future__ import annotations

from gateway.settings import Settings
from gateway.shared_state.base import SharedState
from gateway.shared_state.local import LocalState
from gateway.shared_state.outbox import Outbox
from gateway.shared_state.worker_mesh import MeshPlace, MeshSettings, WorkerMesh
from gateway.state_backend import BackendChoice
from gateway.telemetry.metrics import GatewayMetrics


def make_shared_state(
    settings: Settings, choice: BackendChoice, metrics: GatewayMetrics, mesh: MeshPlace | None
) -> SharedState:
    if choice.redis_url is None and mesh is not None:
        shares = MeshSettings(
            settings.state_publish_interval_s, settings.state_sync_interval_s, settings.state_ttl_s
        )
        up = metrics.state_backend_up.labels(WorkerMesh.backend)
        up.set(0)
        return WorkerMesh(mesh, shares, Outbox(), up, metrics.state_apply_lag)
    if choice.redis_url is None:
        metrics.state_backend_up.labels(LocalState.backend).set(1)
        return LocalState()
    # Imported here: a gateway without Redis configured never loads the client.
    from gateway.shared_state.redis_state import RedisSettings, RedisState

    redis = RedisSettings(
        choice.redis_url.get_secret_value(),
        key_prefix=choice.key_prefix,
        publish_interval_s=settings.state_publish_interval_s,
        sync_interval_s=settings.state_sync_interval_s,
        ttl_s=settings.state_ttl_s,
        timeout_s=settings.state_timeout_s,
    )
    up = metrics.state_backend_up.labels(RedisState.backend)
    up.set(0)
    return RedisState(redis, Outbox(), up, metrics.state_apply_lag)
