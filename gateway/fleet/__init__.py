"""What the gateway knows of its replicas and pools, and how it learns it: pool and replica
state, health probes and metric scrapes, passive outlier ejection, KV-cache event streams, LoRA
adapter discovery, the pool queue and the autoscaling signal."""
