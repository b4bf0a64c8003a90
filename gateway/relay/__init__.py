"""Forwarding a routed request to a replica: retries before the first byte and the byte-for-byte
relay (proxy), the pooled protocol-level upstream client and how it fails, and reading a
replica's answer and its usage."""
