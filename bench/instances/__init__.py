"""``llm-gateway bench instances``: several gateway instances in front of one fleet.

One simulated fleet (4 replicas by default) and the bench workloads of ``bench compare``
(sized for 4 replicas), sent through 1 gateway instance, through N instances sharing state in
Redis, through N instances on their own (local backend: the control), each request to one
instance at random, as a load balancer spreads them, and through one instance of N worker
processes (``serve --workers N``, sharing through Redis; the kernel spreads connections).
Hit rates and requests per replica come from the replicas' own counters; every figure is set
against the single instance's, measured in the same run. Also prints the measured staleness
of the shared prefix index.
"""

from __future__ import annotations

from bench.instances.cli import add_arguments, run

__all__ = ["add_arguments", "run"]
