"""`kvpreflight watch`: keep proving a deployment after its release, at a cost production can carry.

One round (`loop.Watcher.round`) reads every engine as `check --capacity-only` does, compares
what it read with what a signed record verified (`drift`), takes the engines' danger counters'
deltas and the danger lines their logs gained since the last round (`hazards`), and sends two
synthetic tenants' short canary requests (`canaries`), within a stated budget (`budget`). The
round is a frozen `findings.Round`; `metrics` turns rounds into Prometheus series. The CLI
(`kvpreflight/_internal/commands/watch.py`) only parses, wires and maps errors to exit codes.
"""
