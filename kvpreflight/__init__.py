"""kvpreflight: deployment preflight and capacity verification for LLM serving engines."""

__version__ = "0.1.0"
