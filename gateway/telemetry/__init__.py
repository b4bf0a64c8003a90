"""What the gateway tells its operators: Prometheus metrics (every name in one place), log lines
that name their request, and OpenTelemetry traces when turned on."""
