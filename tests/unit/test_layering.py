"""The package's layers, read from the source with `ast` (imports inside functions included):
checks judge probe results and engine facts, never the machinery that produced them, and only
the engine adapters (plus the engines kvpreflight models itself) know an engine's metric and
setting names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "kvpreflight"
INTERNAL = PACKAGE / "_internal"  # every module not in kvpreflight.PUBLIC_MODULES

# What a check may import from kvpreflight: the shared result types, the probe results, the
# engine and check vocabularies, the thresholds and advisory data it judges against, and the
# checks' own interface.
CHECKS_MAY_IMPORT = ("kvpreflight.model", "kvpreflight._internal.probes.results", "kvpreflight._internal.checkdata",
                     "kvpreflight._internal.checks", "kvpreflight._internal.engine_kinds", "kvpreflight._internal.check_ids")

# Engine metric names and engine settings keys: engine facts that adapters turn into typed fields.
ENGINE_NAME = re.compile(r"\b(?:sglang|vllm):[a-z_]+|kv_dedicated_per_slot|enable_prefix_caching|disable_radix_cache|kv_unified")
# What models an engine itself: the adapters, the builtin engine and its command line, the config reviewer.
ENGINE_MODULES = ("_internal/engines", "_internal/builtin_engine", "_internal/review", "_internal/commands/engine.py")


def modules(under: Path = PACKAGE) -> list[Path]:
    assert under.is_dir(), f"{under} is not a folder (moved?)"  # an empty walk would pass every rule
    return sorted(under.rglob("*.py"))


def imported(path: Path, root: Path = PACKAGE.parent) -> list[tuple[int, str]]:
    """Every module `path` imports, anywhere in it, as (line, absolute dotted name)."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            # `from kvpreflight._internal.probes import results` imports the module kvpreflight._internal.probes.results
            out.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
    return out


def _allowed(name: str, allowed: tuple[str, ...]) -> bool:
    return any(name == a or name.startswith(a + ".") for a in allowed)


def test_checks_import_only_results_and_model():
    wrong = []
    for path in modules(PACKAGE / "_internal" / "checks"):
        for line, name in imported(path):
            if name.startswith("kvpreflight") and not _allowed(name, CHECKS_MAY_IMPORT):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
    assert not wrong, "checks may import only " + ", ".join(CHECKS_MAY_IMPORT) + ":\n" + "\n".join(wrong)


def test_the_import_walk_sees_function_level_and_relative_imports(tmp_path):
    # The rule above is only as good as the walk: a lazy or relative import counts too.
    sample = tmp_path / "kvpreflight" / "_internal" / "checks" / "x.py"
    sample.parent.mkdir(parents=True)
    sample.write_text("def f():\n    from ..engines import http\n    import kvpreflight._internal.pipeline\n")
    assert [name for _, name in imported(sample, tmp_path)] == ["kvpreflight._internal.engines.http", "kvpreflight._internal.pipeline"]


def test_no_engine_metric_or_setting_name_outside_the_adapters():
    hits = []
    for path in modules():
        relative = path.relative_to(PACKAGE).as_posix()
        if any(relative == m or relative.startswith(m + "/") for m in ENGINE_MODULES):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for found in ENGINE_NAME.findall(line):
                hits.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {found}")
    assert not hits, "engine facts belong in kvpreflight/_internal/engines/ (typed Counters/EngineSnapshot fields):\n" + "\n".join(hits)


# What a check must not match a probe or scenario by: its name as a string (or a prefix of it).
PROBE_NAMES = re.compile(r"^(?:over-pool|over-context|boundary-|clamp|concurrent|health|normal|over-capacity|cancel-|load)")


def probe_names_as_strings(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    """`run.get("clamp")`, `run.of("concurrent")`, `p.name.startswith("concurrent-")`, `s.name == "load"`."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        literals: list[ast.expr] = []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("get", "of", "named", "startswith", "endswith") and not (
                    node.func.attr == "get" and isinstance(node.func.value, ast.Name) and node.func.value.id in ("d", "e")):
                literals = list(node.args[:1])
        elif isinstance(node, ast.Compare) and any(isinstance(side, ast.Attribute) and side.attr == "name"
                                                   for side in (node.left, *node.comparators)):
            literals = [node.left, *node.comparators]
        for literal in literals:
            if isinstance(literal, ast.Constant) and isinstance(literal.value, str) and PROBE_NAMES.match(literal.value):
                hits.append(f"{path.relative_to(root)}:{literal.lineno}: {literal.value!r}")
    return hits


def test_checks_find_probes_and_scenarios_only_through_their_enums():
    hits = [hit for path in modules(PACKAGE / "_internal" / "checks") for hit in probe_names_as_strings(path)]
    assert not hits, "name a probe by kvpreflight._internal.probes.results.ProbeName (a scenario by ScenarioName):\n" + "\n".join(hits)


def test_the_probe_name_scan_sees_lookups_prefixes_and_comparisons(tmp_path):
    sample = tmp_path / "kvpreflight" / "_internal" / "checks" / "x.py"
    sample.parent.mkdir(parents=True)
    sample.write_text('run.get("clamp")\nrun.named("concurrent-")\np.name.startswith("over-pool")\nok = s.name == "load"\n'
                      'run.get(ProbeName.CLAMP)\nd.get("health")\n')
    assert [hit.rsplit(": ", 1)[1] for hit in probe_names_as_strings(sample, tmp_path)] == [
        "'clamp'", "'concurrent-'", "'over-pool'", "'load'"]


# The ground floor: vocabularies, errors, the report model and its schema, the bounded readers and
# parsers every layer uses. They import only each other (and no adapter, probe, check or record code).
GROUND_FLOOR = ("errors", "clock", "files", "gpus", "model", "counters", "schema", "redact", "targets", "fields",
                "checkdata", "engine_kinds", "check_ids")
# No circle is allowed: the report's JSON form is kvpreflight.schema's (report_to_dict,
# report_from_dict), and the model imports nothing of it.
ALLOWED_CIRCLES: set[frozenset[str]] = set()


def room(name: str) -> str | None:
    """The top-level module or subpackage of kvpreflight a dotted name is in."""
    parts, base = name.split("."), PACKAGE
    if parts[:2] == ["kvpreflight", "_internal"]:  # an internal module's room is its name under _internal
        parts, base = ["kvpreflight", *parts[2:]], INTERNAL
    if parts[0] != "kvpreflight" or len(parts) < 2:
        return None
    return parts[1] if (base / parts[1]).is_dir() or (base / f"{parts[1]}.py").exists() else None


def test_the_ground_floor_imports_nothing_above_it():
    wrong = []
    for name in GROUND_FLOOR:
        path = PACKAGE / f"{name}.py" if (PACKAGE / f"{name}.py").exists() else INTERNAL / f"{name}.py"
        for line, imported_name in imported(path):
            if (to := room(imported_name)) is not None and to not in GROUND_FLOOR:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported_name}")
    assert not wrong, "the ground floor (" + ", ".join(GROUND_FLOOR) + ") imports only itself:\n" + "\n".join(wrong)


def test_no_import_circle_across_packages():
    graph: dict[str, set[str]] = {}
    for path in modules():
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        parts = parts[1:] if parts[0] == "_internal" else parts
        if parts == ("__init__",):
            continue
        for _, name in imported(path):
            if (to := room(name)) is not None and to != parts[0]:
                graph.setdefault(parts[0], set()).add(to)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    circles = sorted({f"{a} <-> {b}" for a, tos in graph.items() for b in tos
                      if reaches(b, a) and frozenset({a, b}) not in ALLOWED_CIRCLES})
    assert not circles, "import circles between kvpreflight's packages:\n" + "\n".join(circles)


def test_the_public_api_is_stated_and_documented():
    """kvpreflight's public modules (kvpreflight.PUBLIC_MODULES) each list their public names in
    `__all__`; each name exists, and each public function and class says what it does."""
    import importlib
    import inspect

    import kvpreflight

    problems = []
    for short in kvpreflight.PUBLIC_MODULES:
        module = importlib.import_module(f"kvpreflight.{short}")
        names = getattr(module, "__all__", None)
        if not names:
            problems.append(f"kvpreflight.{short} has no __all__")
            continue
        for name in names:
            if not hasattr(module, name):
                problems.append(f"kvpreflight.{short}.__all__ names {name}, which it does not define")
                continue
            value = getattr(module, name)
            if (inspect.isfunction(value) or inspect.isclass(value)) and not (value.__doc__ or "").strip():
                problems.append(f"kvpreflight.{short}.{name} has no docstring")
    assert not problems, "\n".join(problems)


# One deployment session (kvpreflight/_internal/session.py) opens a deployment for check, --plan, every watch
# round and each fleet deployment: what it assembles is not for watch/ or fleet/ to rebuild.
RUN_INTERNALS = ("kvpreflight._internal.pipeline", "kvpreflight._internal.probes.session", "kvpreflight._internal.routers",
                 "kvpreflight._internal.checks",
                 "kvpreflight._internal.engines.http", "kvpreflight._internal.engines.HttpClient",
                 "kvpreflight._internal.engines.open_adapter",
                 "kvpreflight._internal.engines.adapter_class", "kvpreflight._internal.engines.openai_completions")


def test_watch_and_fleet_open_a_deployment_only_through_the_session():
    wrong = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
             for folder in (INTERNAL / "watch", PACKAGE / "fleet") for path in modules(folder)
             for line, name in imported(path) if _allowed(name, RUN_INTERNALS)]
    assert not wrong, ("watch/ and fleet/ open a deployment through kvpreflight._internal.session (or kvpreflight.preflight), "
                       "never through the run's parts:\n" + "\n".join(wrong))


def test_the_run_stage_is_private_to_the_library_entry():
    importers = sorted(str(path.relative_to(PACKAGE.parent)) for path in modules()
                       if any(_allowed(name, ("kvpreflight._internal.pipeline",)) for _, name in imported(path)))
    assert importers == ["kvpreflight/preflight.py"], importers


def http_clients_configured(path: Path) -> list[int]:
    """The lines where `path` builds an HttpClient from headers or TLS settings (not a bare one)."""
    configured = {"headers", "ca_bundle", "client_cert", "client_key"}
    return [node.lineno for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "HttpClient"
            and configured & {k.arg for k in node.keywords if k.arg}]


def test_one_place_configures_an_http_client_from_the_auth_and_tls_options(tmp_path):
    sites = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in modules()
             if not path.relative_to(PACKAGE).as_posix().startswith("_internal/builtin_engine/")
             for line in http_clients_configured(path)]
    assert [site.split(":")[0] for site in sites] == ["kvpreflight/_internal/probes/session.py"], sites
    # the scan sees a client built with TLS settings anywhere
    sample = tmp_path / "sample.py"
    sample.write_text("c = HttpClient(ca_bundle=x)\nd = engines.HttpClient(headers=h)\ne = HttpClient(timeout_s=3)\n")
    assert http_clients_configured(sample) == [1, 2]


def _runtime_imports(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    """The modules `path` imports when it runs (not those under `if TYPE_CHECKING:`, which only
    the type checker reads)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for child in node.body for n in ast.walk(child)}
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            out.extend(f"{base}.{alias.name}" for alias in node.names)
    return out


def module_circles(under: Path = PACKAGE) -> list[list[str]]:
    """Every group of kvpreflight modules that import each other around a circle when they run."""
    names = {".".join(p.relative_to(under.parent).with_suffix("").parts[:-1] if p.name == "__init__.py"
                      else p.relative_to(under.parent).with_suffix("").parts): p for p in modules(under)}

    def module_of(name: str) -> str | None:
        while name and name not in names:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: {t for n in _runtime_imports(p, under.parent) if (t := module_of(n)) and t != m and not m.startswith(t + ".")}
             for m, p in names.items()}
    circles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(start: str) -> None:  # Tarjan's strongly connected components, iteratively
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


def test_no_import_circle_between_modules_outside_the_builtin_engine():
    # The builtin engine's server and its routes import each other by design.
    circles = [c for c in module_circles() if not all(m.startswith("kvpreflight._internal.builtin_engine.") for m in c)
               and {m.rpartition(".")[2] for m in c} not in ALLOWED_CIRCLES]
    assert not circles, "import circles between modules:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_finder_sees_a_lazy_circle_and_not_a_type_only_one(tmp_path):
    package = tmp_path / "kvpreflight"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from kvpreflight import b\n")
    (package / "b.py").write_text("from kvpreflight.a import f\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kvpreflight.d import x\n")
    (package / "d.py").write_text("from kvpreflight.c import y\n")
    assert module_circles(package) == [["kvpreflight.a", "kvpreflight.b"]]


# The CLI layer (kvpreflight/_internal/commands) only parses and maps errors to exit codes (issue 47).
COMMANDS = PACKAGE / "_internal" / "commands"
# What a command module may import from the CLI layer: the shared option declarations, the runner's
# progress line and the help style. A command importing another command shares its logic, which
# belongs in the library.
COMMANDS_MAY_IMPORT = ("kvpreflight._internal.commands.options", "kvpreflight._internal.commands._run",
                       "kvpreflight._internal.commands.helpstyle")
# A command that raises an error of its own, and why it is left there.
OWN_ERRORS = {
    ("advisories.py", "ConfigError"): "--engine filters the listing by the engine names kvpreflight._internal.checks.advisory_data holds",
}


def command_parameters(tree: ast.AST) -> set[str]:
    """The parameters of the module's commands (functions decorated with `@app.command(...)`)."""
    return {a.arg for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
            and any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "command" for d in node.decorator_list)
            for a in (*node.args.args, *node.args.kwonlyargs)}


def cross_option_raises(path: Path) -> list[str]:
    """The lines that raise (anything but typer.Exit, the exit code) under `if` tests that together read
    two or more of the command's parameters: `if a and b: raise`, `if a: ... if b: raise`,
    `if a: ... elif b: raise`. A rule between options: the library's to state and to test."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    params = command_parameters(tree)
    hits: list[str] = []

    def walk(node: ast.AST, read: frozenset[str]) -> None:
        if isinstance(node, ast.If):
            inner = read | {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name) and n.id in params}
            for child in (*node.body, *node.orelse):
                walk(child, inner)
            return
        if isinstance(node, ast.Raise) and node.exc is not None and len(read) >= 2:
            call = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if not (isinstance(call, ast.Attribute) and call.attr == "Exit"):
                hits.append(f"{path.name}:{node.lineno} raises under a test of {', '.join(sorted(read))}")
        for child in ast.iter_child_nodes(node):
            walk(child, read)

    walk(tree, frozenset())
    return hits


def errors_constructed(path: Path) -> list[tuple[str, int]]:
    """(error type, line) for each kvpreflight error a module builds itself (`ConfigError(...)`, `keys.RecordError(...)`)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if name.endswith(("Error", "Refused")):
                out.append((name, node.lineno))
    return out


def test_the_cli_layer_holds_no_rule_between_options():
    """Criterion: a command module (1) imports no other command module but options, _run and helpstyle;
    (2) raises nothing but typer.Exit under a condition on two or more of its parameters (a
    cross-option rule); (3) builds no error of its own (a one-value check included), except those in
    OWN_ERRORS, each with the reason it stays. What it may do: parse, call the library (which raises
    the one-line errors) and return the exit code. Rules written as a library call are the
    library's, so this cannot see a rule hidden in a helper function of the command module that
    raises nothing: the reviewer's part."""
    wrong = [f"{path.name}:{line} imports {name}" for path in modules(COMMANDS) for line, name in imported(path)
             if name.startswith("kvpreflight._internal.commands.") and not _allowed(name, COMMANDS_MAY_IMPORT)]
    wrong += [hit for path in modules(COMMANDS) for hit in cross_option_raises(path)]
    wrong += [f"{path.name}:{line} builds a {name}" for path in modules(COMMANDS) for name, line in errors_constructed(path)
              if (path.name, name) not in OWN_ERRORS]
    assert not wrong, "the CLI layer only parses and maps errors to exit codes; move these rules into the library:\n" + "\n".join(wrong)


def test_the_rule_scan_sees_nested_and_else_branch_rules_and_lets_exit_codes_pass(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "@app.command('x')\n"
        "def x(a: bool = False, b: bool = False, c: int = 0) -> None:\n"
        "    if a and b:\n        raise ConfigError('contradict')\n"
        "    if a:\n        if c > 1:\n            raise RecordError('nested')\n"
        "    if a:\n        pass\n    elif b:\n        raise ConfigError('else branch')\n"
        "    if a or b:\n        raise typer.Exit(1)\n"
        "    if c:\n        raise ConfigError('one option')\n")
    assert [hit.split(":")[1].split(" ")[0] for hit in cross_option_raises(sample)] == ["4", "7", "11"]
    assert sorted(line for _, line in errors_constructed(sample)) == [4, 7, 11, 15]


def test_the_demo_stands_beside_the_fleet_and_watch_not_under_them():
    """A builtin trio is described in kvpreflight._internal.builtin_engine.deployment; only the one process
    that boots it (the fleet's worker) reaches for the demo. The inventory and watch once imported
    the demo module for the description alone, stacking watch over fleet over demo."""
    wrong = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
             for folder in (INTERNAL / "watch", PACKAGE / "fleet") for path in modules(folder)
             if path.name != "worker.py"
             for line, name in imported(path) if _allowed(name, ("kvpreflight._internal.demo",))]
    assert not wrong, "\n".join(wrong)


def top_level_strays(package: Path, public: tuple[str, ...]) -> list[str]:
    """The entries at the top of `package` that are neither public, `_internal`, `__init__`,
    `__main__` nor data (a folder with no Python in it, or a file that is not Python)."""
    allowed = {*public, "_internal", "__init__", "__main__"}
    strays = []
    for entry in sorted(package.iterdir()):
        if entry.name == "__pycache__" or (entry.is_dir() and not any(entry.rglob("*.py"))) or \
                (entry.is_file() and entry.suffix != ".py"):
            continue
        if (entry.stem if entry.is_file() else entry.name) not in allowed:
            strays.append(entry.name)
    return strays


def test_the_package_top_holds_only_the_public_modules():
    """A reader sees the public API as the top of kvpreflight/: each public module there (with its
    `__all__`), everything else under `_internal/`, which says it is internal and unstable."""
    import kvpreflight

    assert top_level_strays(PACKAGE, kvpreflight.PUBLIC_MODULES) == [], (
        "only the public modules (kvpreflight.PUBLIC_MODULES) live at the top of kvpreflight/; move the rest to _internal/")
    for short in kvpreflight.PUBLIC_MODULES:
        path = PACKAGE / short / "__init__.py" if (PACKAGE / short).is_dir() else PACKAGE / f"{short}.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assigned = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
        assert "__all__" in assigned, f"kvpreflight.{short} is public and defines no __all__"
    doc = ast.get_docstring(ast.parse((INTERNAL / "__init__.py").read_text(encoding="utf-8"))) or ""
    assert "internal" in doc and "no stability guarantee" in doc.lower(), doc


def test_the_top_level_scan_sees_a_stray_module_and_skips_data(tmp_path):
    for name in ("__init__.py", "__main__.py", "model.py", "cli.py"):
        (tmp_path / name).write_text("")
    for folder in ("_internal", "boot", "engines"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "report.schema.json").write_text("{}")
    (tmp_path / "py.typed").write_text("")
    assert top_level_strays(tmp_path, ("model", "boot")) == ["cli.py", "engines"]
