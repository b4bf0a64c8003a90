"""A simulated vLLM replica: OpenAI-compatible API, a prefix cache, continuous batching and a timing model."""
