"""Choosing where a request goes, around the pool's policy: from the model a client names to a
pool, sessions and tier memory (affinity), a request's token blocks, the client's hints, the
routed record a request carries to the relay, and the decision as operators read it."""
