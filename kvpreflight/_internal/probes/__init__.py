"""Probes send real requests through the entry and record what came back. They never judge.

  results.py         what the checks read (the only probe module a check may import): results, ProbeName, ScenarioName
  session.py         what every prober of one probe run shares (ProbeSession) and how it connects (Connection)
  capacity.py        requests at and beyond the limits the engines state (capacity_plan drives CapacityProber)
  scenarios.py       the isolation scenarios, each declared once as data: what --plan counts and the prober sends
  isolation_sizes.py  how large each isolation request is (IsolationSizes)
  isolation.py       the prober: two synthetic tenants through the declared scenarios
  late_decode.py     where late-decode sends its two legs (HeldLegs) and the lease it outwaits
  occurrence.py      how each scenario is shown to have happened as intended (its Evidence), from what was recorded
  tenants.py         one synthetic tenant's connection, cache_salt and canary prompt
  prefix_cache.py    the cold / same-tenant warm / cross-tenant cache controls, and the timing audit where counters are silent
  disconnect.py      a client that leaves mid-request
  engine_state.py    counters and their deltas, the wait for idle pools
  budget.py          calibration on the engine's measured speed, request budgets, --deadline, stopping
  cost.py            what the probes sent (the report's cost block)
  logs.py            the engines' and router's logs followed while probing (danger lines)
  markers.py         synthetic markers and canaries, and finding them in an answer
  tokens.py          valid token ids of a given length for any engine
"""
