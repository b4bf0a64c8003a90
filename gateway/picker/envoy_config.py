"""An Envoy bootstrap that asks the picker (`llm-gateway envoy-config`): one listener, the
ext_proc filter, and the replicas as one cluster whose load balancer takes the host the picker
names (Envoy's override_host policy) and falls back to least-request when it names none.

The fallback is what failing open means: with `failure_mode_allow` Envoy goes on without the
picker's answer, and the request goes to the least busy replica instead of failing.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from router_policies.schema import Policy

DESTINATION = "x-gateway-destination-endpoint"
"""Where the picker names the replica: a request header and an `envoy.lb` metadata key (the
Gateway API Inference Extension's endpoint-picker protocol)."""
LB_NAMESPACE = "envoy.lb"
SERVED = "x-gateway-destination-endpoint-served"
"""The endpoint that served the request (Envoy's %UPSTREAM_HOST%), on the answer's headers as
the picker sees them: a fallback when the picked replica failed. The client never gets it (a
filter after the picker on the answer's way removes it)."""
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET = "x-gateway-destination-endpoint-subset"
"""Where the proxy may name the endpoints (ip:port) the picker must choose among: a list under
this key of the request's filter metadata, in this namespace (the endpoint-picker protocol's
subset; the printed bootstrap forwards the namespace to the picker when a filter sets it)."""
MAX_RETRIES = "x-envoy-max-retries"
"""Envoy's header that cuts a request's retries below the route's (the picker sets it: the
ext_proc filter of the printed bootstrap allows it to change `x-envoy-` headers)."""
FALLBACKS = 2
"""Replicas the picker names after its choice, and so Envoy's retries: a replica failing before
its first byte (refused, reset, a 5xx) is retried on the next, as `serve` retries it."""

_TYPES = "type.googleapis.com/envoy."
_EXT_PROC = "envoy.filters.http.ext_proc"


def replica_addresses(policy: Policy) -> list[tuple[str, int]]:
    """Every pool's replicas as (host, port), in policy order, once each."""
    seen: dict[tuple[str, int], None] = {}
    for pool in policy.pools.values():
        for url in pool.replicas:
            parts = urlsplit(str(url))
            port = parts.port or (443 if parts.scheme == "https" else 80)
            seen[(parts.hostname or "", port)] = None
    return list(seen)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _lb_policy(name: str, type_name: str, config: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "policies": [
            {
                "typed_extension_config": {
                    "name": name,
                    "typed_config": {"@type": _TYPES + type_name, **(config or {})},
                }
            }
        ]
    }


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _assignment(cluster: str, addresses: list[tuple[str, int]]) -> dict[str, Any]:
    endpoints = [{"endpoint": {"address": _address(host, port)}} for host, port in addresses]
    return {"cluster_name": cluster, "endpoints": [{"lb_endpoints": endpoints}]}


_REQUEST_ID = {
    "header": {"key": "x-request-id", "value": "%REQ(x-request-id)%"},
    # The picker's own answers carry the id it gave the request: theirs stands.
    "append_action": "ADD_IF_ABSENT",
}
"""The request's id on Envoy's own answers, as on the gateway's: Envoy's (the client's where it
kept it, else one it made), which the picker takes as the request's id where it is one."""


def _openai_shaped(
    status: int, message: str, type_: str, code: str, *, envoys_own: bool = False
) -> dict[str, Any]:
    """A local reply of Envoy's with ``status`` in `serve`'s OpenAI error shape. The picker's
    refusals are local replies too (immediate responses) and already in that shape:
    ``envoys_own`` rewrites only the answers Envoy gives for its own reasons (a replica it could
    not reach or that reset the request; each sets a response flag, the picker's never)."""
    error = {"message": message, "type": type_, "param": None, "code": code}
    matches: dict[str, Any] = {
        "status_code_filter": {
            "comparison": {
                "op": "EQ",
                "value": {"default_value": status, "runtime_key": f"llm_gateway.local_{status}"},
            }
        }
    }
    if envoys_own:
        matches = {"and_filter": {"filters": [matches, {"response_flag_filter": {}}]}}
    return {
        "filter": matches,
        "body_format_override": {"json_format": {"error": error}},
        "headers_to_add": [_REQUEST_ID],
    }


def _local_replies(max_body_bytes: int) -> list[dict[str, Any]]:
    """Envoy's own answers in `serve`'s OpenAI shape, each with the request's id: its 413 (a
    body over the buffer limit; the picker's own 413 says the same), its 502 and 503 (no
    replica answered), its 500 failing closed, its 504 (the picker never answers 504 itself).
    A replica's answer is never a local reply, whatever its status. Every other local reply
    (the picker's refusals among them) only gets the request's id where it has none."""
    return [
        _openai_shaped(
            413, f"The request body is larger than the limit of {max_body_bytes} bytes.",
            "invalid_request_error", "request_too_large",
        ),
        # Every replica named refused, reset or was unreachable (after Envoy's retries).
        _openai_shaped(
            503, "No replica could serve the request: %LOCAL_REPLY_BODY%.",
            "service_unavailable_error", "upstream_unavailable", envoys_own=True,
        ),
        _openai_shaped(
            502, "A replica's answer could not be relayed: %LOCAL_REPLY_BODY%.",
            "server_error", "upstream_error", envoys_own=True,
        ),
        # Failing closed, the picker unreachable: Envoy's ext_proc error, which sets no
        # response flag to tell it from the picker's own 500 (an internal error, as rare as
        # serve's): both say the picker could not route the request, and why.
        _openai_shaped(
            500, "The gateway's endpoint picker could not route the request "
            "(%RESPONSE_CODE_DETAILS%).", "server_error", "picker_unavailable",
        ),
        # A replica's timeout, or the picker's (fail closed: its message timeout).
        _openai_shaped(
            504, "The request timed out in the proxy (%RESPONSE_CODE_DETAILS%).",
            "server_error", "gateway_timeout",
        ),
        {
            "filter": {
                "status_code_filter": {
                    "comparison": {
                        "op": "GE",
                        "value": {"default_value": 0, "runtime_key": "llm_gateway.local_any"},
                    }
                }
            },
            "headers_to_add": [_REQUEST_ID],
        },
    ]  # fmt: skip


def _served_removed() -> dict[str, Any]:
    """A filter ahead of the picker's that takes SERVED off every answer. Answers pass the
    filters in reverse order, so it acts after the picker: on the answers the picker lets
    through untouched (every path but the completions, the picker down under fail open) as
    on those it follows. The route adds the header for the picker, and its own
    `response_headers_to_remove` would act before the add, so the removal is here."""
    return {
        "name": "envoy.filters.http.header_mutation",
        "typed_config": {
            "@type": _TYPES + "extensions.filters.http.header_mutation.v3.HeaderMutation",
            "mutations": {"response_mutations": [{"remove": SERVED}]},
        },
    }


def bootstrap(
    policy: Policy,
    *,
    listen_port: int,
    picker_port: int,
    listen_host: str = "127.0.0.1",
    picker_host: str = "127.0.0.1",
    admin_port: int | None = None,
    fail_open: bool = True,
    message_timeout_s: float = 35.0,
    max_body_bytes: int = 4 * 1024 * 1024,
) -> dict[str, Any]:
    """The bootstrap as a plain structure (dump it as YAML or JSON).

    ``message_timeout_s`` bounds each answer of the picker: it must outlast the pool's
    admission queue (``queue_timeout_s``), where a request waits while every replica is full.
    """
    addresses = replica_addresses(policy)
    by_name = not all(_is_ip(host) for host, _ in addresses)
    override = _lb_policy(
        "envoy.load_balancing_policies.override_host",
        "extensions.load_balancing_policies.override_host.v3.OverrideHost",
        {
            # The metadata only: a header of the same name could come from the client (were
            # the picker away), and the client must not choose the replica.
            "override_host_sources": [
                {"metadata": {"key": LB_NAMESPACE, "path": [{"key": DESTINATION}]}},
            ],
            "fallback_policy": _lb_policy(
                "envoy.load_balancing_policies.least_request",
                "extensions.load_balancing_policies.least_request.v3.LeastRequest",
            ),
        },
    )
    timeout = f"{message_timeout_s:g}s"
    ext_proc = {
        "@type": _TYPES + "extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}, "timeout": timeout},
        "failure_mode_allow": fail_open,
        # The picker's MAX_RETRIES: Envoy lets no filter change an `x-envoy-` header unless
        # told (it would drop the change and count it in `rejected_header_mutations`).
        "mutation_rules": {"allow_envoy": True},
        "message_timeout": timeout,
        "max_message_timeout": timeout,
        # The picker reads the whole body (model, prompt) before it can name a replica, and
        # follows the answer as it streams (first byte, usage, end).
        "processing_mode": {
            "request_header_mode": "SEND",
            "request_body_mode": "BUFFERED",
            "request_trailer_mode": "SKIP",
            "response_header_mode": "SEND",
            "response_body_mode": "STREAMED",
            "response_trailer_mode": "SKIP",
        },
        "metadata_options": {
            "forwarding_namespaces": {"untyped": [SUBSET_NAMESPACE]},
            "receiving_namespaces": {"untyped": [LB_NAMESPACE]},
        },
    }
    manager = {
        "@type": _TYPES
        + "extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "llm_gateway",
        "codec_type": "AUTO",
        # A long stream of tokens must not be cut by Envoy's 15 s default.
        "stream_idle_timeout": "600s",
        "route_config": {
            "name": "replicas",
            "virtual_hosts": [
                {
                    "name": "replicas",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "route": {
                                "cluster": "replicas",
                                "timeout": "0s",
                                # Override_host takes the picker's fallbacks in turn.
                                "retry_policy": {
                                    "retry_on": "5xx,reset",
                                    "num_retries": FALLBACKS,
                                },
                            },
                            "response_headers_to_add": [
                                {
                                    "header": {"key": SERVED, "value": "%UPSTREAM_HOST%"},
                                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                                }
                            ],
                        }
                    ],
                }
            ],
        },
        "local_reply_config": {"mappers": _local_replies(max_body_bytes)},
        "http_filters": [
            _served_removed(),
            {"name": _EXT_PROC, "typed_config": ext_proc},
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": _TYPES + "extensions.filters.http.router.v3.Router"},
            },
        ],
    }
    http2 = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": _TYPES + "extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    }
    config: dict[str, Any] = {
        "static_resources": {
            "listeners": [
                {
                    "name": "llm_gateway",
                    "address": _address(listen_host, listen_port),
                    # Envoy buffers the request body for the picker: as much as `serve` takes.
                    "per_connection_buffer_limit_bytes": max_body_bytes,
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": manager,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "replicas",
                    "type": "STRICT_DNS" if by_name else "STATIC",
                    "connect_timeout": "1s",
                    "per_connection_buffer_limit_bytes": max_body_bytes,
                    "load_balancing_policy": override,
                    "load_assignment": _assignment("replicas", addresses),
                },
                {
                    "name": "picker",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "typed_extension_protocol_options": http2,
                    "load_assignment": _assignment("picker", [(picker_host, picker_port)]),
                },
            ],
        }
    }
    if admin_port is not None:
        config["admin"] = {"address": _address("127.0.0.1", admin_port)}
    return config
