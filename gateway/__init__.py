"""The gateway process, one sub-package per concern: `http/` (the application, the front that
takes completion requests, connections, errors), `routing/` (model to pool, affinity, the routed
record), `relay/` (the proxy and the upstream client), `fleet/` (pools, replicas, probes, KV
events, autoscaling), `shared_state/` and `rate_limit/` (what instances share), `telemetry/`
(metrics, logs, traces), `policy/` (the live policy file) and `picker/` (Envoy's endpoint
picker). Here: the CLI, settings, the process runner and its worker watchdog. Routing decisions
themselves live in router_policies/."""
