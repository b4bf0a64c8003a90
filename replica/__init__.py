"""What runs as a replica: the simulated vLLM replica (`sim/`: vLLM's endpoints, metric names,
error shapes and KV-event wire format, for scale and speed), vLLM's own names
(`vllm_metrics`, `openai_api`), the launch recipes for real vLLM on GPUs (`vllm_launch`) and
on the CPU (`vllm_cpu/`), and the helpers that start and stop replica processes. Imports only
router_policies/.
"""
