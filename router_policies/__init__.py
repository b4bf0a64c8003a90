"""Pure routing decisions: plain values in, plain values out, no I/O.

The policy schema (every routing default, with its reason), fingerprints and prefix indexes
(the estimate, and the engines' own blocks from their KV-cache events), the cost model
(`cost/`), one small module per selection policy (`policies/`), tiers and their classifiers,
sessions, rate-limit arithmetic and the autoscaling formula; example policy files
(`examples/`) and the tier model's weights (`models/`). Depends on nothing else in the project:
the gateway process (gateway/) feeds it snapshots and acts on its decisions.
"""
