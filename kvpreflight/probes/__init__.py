"""Probes send real requests through the entry and record what came back. They never judge.

  results.py       what the checks read (the only probe module a check may import)
  capacity.py      requests at and beyond the limits the engines state
  isolation.py     two synthetic tenants in interleaved scenarios
  prefix_cache.py  the cold / same-tenant warm / cross-tenant cache controls, and the timing audit where counters are silent
  disconnect.py    a client that leaves mid-request
  engine_state.py  counters and their deltas, the wait for idle pools
  budget.py        calibration on the engine's measured speed, request budgets, --deadline, stopping
"""
