"""The HTTP face of the gateway: the aiohttp application and its routes, the protocol-level
front that takes completion requests, client connections and their limits, reading a request
body once, the OpenAI-style errors, and the endpoints that list models or look up responses."""
