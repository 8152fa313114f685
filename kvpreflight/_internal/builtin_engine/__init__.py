"""kvpreflight's own small serving engine: the embedded default of `kvpreflight demo` and the
fault-injection testbed that proves each check catches its bug class.

It is a separate program (`kvpreflight engine serve ...`); the rest of kvpreflight reaches it only
over HTTP, exactly like SGLang, whose wire format it speaks. torch is imported only inside the
engine process (pool.py, model.py, core.py), never by importing this package.

Layout: config (settings, faults, sizing) -> startup (serve one role) -> server (HTTP routing)
-> api_sglang / api_openai (the endpoints) -> protocol (request types, torch-free) -> core (the
engine: admission, prefill, decode) with prefix_cache and pool; pd (the whole prefill/decode
handoff, wire included) and router (the PD front door) for disaggregated roles.
"""
