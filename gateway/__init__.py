"""The gateway process: CLI and settings; client connections (gateway/front.py takes the
completion requests at the protocol level, aiohttp the rest: gateway/app.py); the fleet's
state, probes, shared state and limits; the forwarding (gateway/proxy.py) and the requests to
the replicas (gateway/upstream.py); metrics and logs. Routing decisions themselves live in
router_policies/."""
