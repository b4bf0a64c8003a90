"""A simulated vLLM replica: OpenAI API, prefix cache, continuous batching and a timing model."""
