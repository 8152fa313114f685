"""Installed by scripts/setup_engines.sh into the Mooncake venv only, loaded at every interpreter
start by a .pth file there, and inert unless KVPF_MOONCAKE_CPU_SHIM=1.

vLLM 0.32.0's MooncakeConnectorWorker.__init__ (kv_connector/v1/mooncake/mooncake_connector.py)
begins with ``self.device_id = torch.accelerator.current_device_index()``; on a CPU-only torch that
raises ``RuntimeError: Cannot access accelerator device when none is available.`` and the engine
dies at start-up. Where torch has no accelerator, this makes the call answer 0; vLLM's CPU
platform then calls ``torch.cpu.set_device(0)``, which does nothing. Nothing else is changed.
"""

import os

if os.environ.get("KVPF_MOONCAKE_CPU_SHIM") == "1":
    import torch

    if not torch.accelerator.is_available():
        torch.accelerator.current_device_index = lambda: 0
