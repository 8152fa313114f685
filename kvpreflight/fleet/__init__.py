"""Fleet preflight: check many deployments at once and give one release one answer.

    inventory = load_inventory("fleet.yaml")            # FleetError (exit 2) naming the field
    code = execute(FleetRequest(inventory_path, parallel=4, ray=None, record=..., sign_key=...))

Parts: `inventory` (the YAML, frozen dataclasses), `job` (one deployment's check, where it runs),
`worker` (the child process that boots one deployment), `runners/` (local threads, Ray),
`report` + `render` (one row per deployment), `records` (per-deployment records + the fleet record).
"""

from kvpreflight.fleet.errors import FleetError
from kvpreflight.fleet.inventory import Deployment, Inventory, load_inventory, parse_inventory
from kvpreflight.fleet.run import FleetRequest, execute

__all__ = ["Deployment", "FleetError", "FleetRequest", "Inventory", "execute", "load_inventory", "parse_inventory"]
