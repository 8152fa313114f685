"""kvpreflight: deployment preflight and capacity verification for LLM serving engines.

The public API, for programs that run checks without the CLI (the CLI, the demo, the fleet and
`watch` call the same functions): the modules at the top of the package, named in
`PUBLIC_MODULES` below. Each lists its public names in `__all__`. Everything else lives under
`kvpreflight._internal` (the CLI, the engine adapters, probes, checks, the builtin engine, review,
watch): internal and unstable, with no stability guarantee in any release; so is every name a
public module does not list (tests/unit/test_layering.py checks the package's top).

    kvpreflight.preflight       run, run_booted, preview, publish, validate, prepare_record
    kvpreflight.check_options   CheckOptions (every option as a user gives it) and build_plan
    kvpreflight.check_plan      CheckPlan, OutputPlan, RecordPlan: the validated plans
    kvpreflight.targets         parse_endpoints, parse_url, Auth, Target, secret_from_env, ...
    kvpreflight.model           Report, CheckResult, Status, EngineSnapshot, ... (results)
    kvpreflight.schema          report_to_dict, report_from_dict (the report's JSON form)
    kvpreflight.errors          KvpreflightError and its exit-code classes
    kvpreflight.boot            load_spec, boot_deployment (boot mode)
    kvpreflight.record          emit_record, read_record, verify_envelope, generate (signed records)
    kvpreflight.formats         FORMATS, get_format, write_report (report formats)
    kvpreflight.fleet           load_inventory, parse_inventory, execute (many deployments)

    from kvpreflight import preflight
    from kvpreflight.check_options import CheckOptions, build_plan

    plan = build_plan(CheckOptions(endpoints=("http://engine:30000",)))
    report = preflight.run(plan)
    raise SystemExit(report.exit_code)
"""

__version__ = "0.1.0"

# The modules whose `__all__` is kvpreflight's public API (tests/unit/test_layering.py checks it).
PUBLIC_MODULES = ("preflight", "check_options", "check_plan", "targets", "model", "schema", "errors", "boot", "record",
                  "formats", "fleet")
