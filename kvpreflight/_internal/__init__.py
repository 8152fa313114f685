"""kvpreflight's internals: the CLI and its commands, the engine adapters, the probes and checks,
the builtin engine, `review`, `watch`, the demo and the rest of the machinery behind the public API.

Everything in this package and its subpackages is internal and unstable. No stability guarantee is
made for any name here, across any release (patch releases included): modules, functions and
classes may change or disappear without notice. Programs use the public modules at the top of the
package instead (`kvpreflight.PUBLIC_MODULES`, listed in `kvpreflight/__init__.py`).
"""
