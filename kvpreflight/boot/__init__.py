"""Boot mode: start what a deployment runs from a YAML spec, wait until it is ready, stop it.

Public API (everything else in this package is internal):

    from kvpreflight.boot import load_spec, boot_deployment, BootError

    spec = load_spec("examples/specs/builtin-pd.yaml")        # BootError exit 2 on a bad spec
    with boot_deployment(spec, log_dir) as deployment:        # BootError exit 3 if an engine fails
        deployment.entry_url                                  # where clients send requests
        for engine in deployment.engines:                     # BootedEngine
            engine.name, engine.role, engine.url, engine.engine, engine.log_path, engine.pid
        deployment.log_files                                  # engine URL -> log file
        deployment.spec.context_length, deployment.spec.checks.skip
"""

from kvpreflight.boot.deployment import BootedDeployment, BootedEngine
from kvpreflight.boot.errors import BootError
from kvpreflight.boot.launcher import boot_deployment
from kvpreflight.boot.logs import log_folder
from kvpreflight.boot.spec import ChecksSpec, DeploymentSpec, EngineSpec, load_spec, parse_spec

__all__ = [
    "BootError",
    "BootedDeployment",
    "BootedEngine",
    "ChecksSpec",
    "DeploymentSpec",
    "EngineSpec",
    "boot_deployment",
    "load_spec",
    "log_folder",
    "parse_spec",
]
