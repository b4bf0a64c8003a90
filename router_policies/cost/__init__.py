"""The routing cost model: each replica's predicted time to first token for one request.

    predicted TTFT = wait (prefill queued ahead there) + prefill (this prompt's uncached tokens)
                     + one engine step with the running batch

Each term is a small pure module; the rates they use are learned per replica
(router_policies/cost/rates.py) from the TTFTs the gateway observes.
"""
