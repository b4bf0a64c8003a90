"""The endpoint-picker front door (`llm-gateway epp`): Envoy asks, over its external-processing
protocol (ext_proc, gRPC), which replica should serve each request, and relays the request
itself; the Gateway API Inference Extension's endpoint-picker protocol on top of it.

The decision is the proxy's (gateway/http/completions.py: tiers, limits, the pool's policy); the
picker names the replica in `x-gateway-destination-endpoint` (header and `envoy.lb` dynamic
metadata) and follows the answer Envoy streams back (first byte, usage, end) for the in-flight
counts and the rates routing learns. `llm-gateway envoy-config` prints an Envoy bootstrap that
asks it. Needs the `epp` extra (grpcio, xds-protos).
"""
