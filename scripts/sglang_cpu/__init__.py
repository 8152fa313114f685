"""kvpreflight's CPU stand-ins for SGLang 0.5.23 (the incident's engine) on a CPU-only machine.

scripts/setup_engines.sh (setup_sglang) copies this folder into the SGLang venv's site-packages as
the package ``kvpf_sglang_cpu`` and adds a .pth file that imports ``kvpf_sglang_cpu.hook`` at every
interpreter start. The hook does nothing unless ``KVPF_SGLANG_CPU=1`` is in the environment (the
examples/specs/sglang-*-cpu.yaml specs set it): see hook.py for what it changes and why, each
change named with the SGLang call that needs it; standins/sgl_kernel is the pure-torch stand-in for
the two ``sgl_kernel`` functions SGLang's CPU path imports.

Nothing here is imported by kvpreflight itself (kvpreflight never imports torch or sglang).
"""
