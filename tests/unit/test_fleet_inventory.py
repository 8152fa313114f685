"""Fleet inventories: every mistake is one line naming the file and the field, exit 2, before
anything runs; a good inventory parses into what the runners need."""

from __future__ import annotations

import pytest
from record_support import run_cli

from kvpreflight.fleet import FleetError, parse_inventory
from kvpreflight.fleet.inventory import AttachTarget, BootTarget, BuiltinTarget
from kvpreflight.fleet.runners import plan_batches

GOOD = {
    "fleet": "rel-42",
    "defaults": {"timeout_s": 120, "subjects": ["image=sha256:" + "ab" * 32]},
    "deployments": [
        {"name": "a", "attach": {"endpoints": ["prefill=http://p:1", "decode=http://d:2"], "entry": "http://r:3", "context_length": 4096}},
        {"name": "b", "node": "gpu-7", "builtin": {"pool_ratio": 0.65, "faults": ["reject-continues"]}, "timeout_s": 30},
        {"name": "c", "attach": {"endpoints": ["http://p:1"]}, "skip": [{"id": "engine-advisories", "reason": "patched"}]},
    ],
}


def parse(data):
    return parse_inventory(data, source="fleet.yaml")


def test_a_good_inventory_parses_into_targets_placements_and_deadlines():
    inv = parse(GOOD)
    a, b, c = inv.deployments
    assert inv.name == "rel-42" and inv.subjects == ("image=sha256:" + "ab" * 32,)
    assert isinstance(a.target, AttachTarget) and a.target.options.context_length == 4096 and a.timeout_s == 120
    assert isinstance(b.target, BuiltinTarget) and b.target.pool_ratio == 0.65 and b.placement.node == "gpu-7" and b.timeout_s == 30
    assert c.waivers[0].check_id == "engine-advisories"
    # a and c share http://p:1: one batch, run one after the other; b alone
    assert [[d.name for d in batch] for batch in plan_batches(inv.deployments)] == [["a", "c"], ["b"]]


def test_boot_spec_paths_are_read_relative_to_the_inventory(tmp_path):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "one.yaml").write_text(
        "deployment: one\nengines:\n  - {name: e, role: unified, command: [x, --port, '{port}'], port: 30000}\n")
    inv = parse_inventory({"deployments": [{"name": "one", "boot": "specs/one.yaml"}]}, source="f.yaml", base_dir=str(tmp_path))
    target = inv.deployments[0].target
    assert isinstance(target, BootTarget) and target.fixed_ports == (30000,) and "deployment: one" in target.spec_text


@pytest.mark.parametrize("mutate, fragment", [
    (lambda d: d["deployments"][0].pop("attach"), "fleet.yaml: deployments[0]: give exactly one of attach, boot, builtin (got none)"),
    (lambda d: d["deployments"][1].update(attach={"endpoints": ["http://x:1"]}),
     "deployments[1]: give exactly one of attach, boot, builtin (got attach, builtin)"),
    (lambda d: d["deployments"][0]["attach"].update(endpoints=["prefil=http://p:1"]),
     "deployments[0].attach.endpoints[0]: 'prefil=http://p:1': unknown role 'prefil'"),
    (lambda d: d["deployments"][0]["attach"].update(entry="router:3"), "deployments[0].attach.entry: "),
    (lambda d: d["deployments"][2].update(name="a"), "deployments[2].name: duplicate name 'a' (also deployments[0])"),
    (lambda d: d["deployments"][2].update(name="../etc"), "deployments[2].name: expected a name"),
    (lambda d: d["deployments"][1]["builtin"].update(faults=["nope"]), "deployments[1].builtin.faults[0]: unknown fault 'nope'"),
    (lambda d: d["deployments"][1].update(timeout_s=0), "deployments[1].timeout_s: expected a positive number, got a number (0)"),
    (lambda d: d["deployments"][2]["skip"][0].update(reason=""), "deployments[2].skip[0].reason: a skipped check needs a reason"),
    (lambda d: d["deployments"][2]["skip"][0].update(id="kv.capacity"), "deployments[2].skip[0].id: expected one of kv-capacity"),
    (lambda d: d["deployments"][0].update(nodes="x"), "deployments[0].nodes: unknown key"),
    (lambda d: d["defaults"].update(subjects=["image=sha1:abc"]), "defaults.subjects[0]: 'image=sha1:abc': digest must start with sha256:"),
    (lambda d: d["deployments"][0]["attach"].update(api_key_env="sk-live-123"),
     "deployments[0].attach.api_key_env: the NAME of the environment variable"),
    (lambda d: d.update(deployments=[]), "deployments: expected a non-empty list"),
])
def test_each_mistake_is_one_line_naming_the_field(mutate, fragment):
    import copy

    data = copy.deepcopy(GOOD)
    mutate(data)
    with pytest.raises(FleetError) as err:
        parse(data)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value) and err.value.exit_code == 2


def test_deployments_sharing_an_engine_on_different_nodes_are_refused():
    data = {"deployments": [
        {"name": "a", "node": "n1", "attach": {"endpoints": ["http://p:1"]}},
        {"name": "b", "node": "n2", "attach": {"endpoints": ["http://p:1"]}},
    ]}
    with pytest.raises(FleetError, match="deployments a, b share an engine but are placed on different nodes"):
        plan_batches(parse(data).deployments)


def test_cli_bad_inventory_is_exit_2_with_one_line_and_no_traceback(tmp_path):
    inv = tmp_path / "fleet.yaml"
    inv.write_text("deployments:\n  - name: a\n    attach: {endpoints: [prefill=http://p:1], entry: 7}\n")
    result = run_cli("fleet", inv)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"kvpreflight: error: {inv}: deployments[0].attach.entry: expected a non-empty string, got a number (7)"]
    missing = run_cli("fleet", tmp_path / "nope.yaml")
    assert missing.returncode == 2 and "nope.yaml: no such file" in missing.stderr and "Traceback" not in missing.stderr


def test_cli_boot_pinned_to_a_node_needs_ray(tmp_path):
    inv = tmp_path / "fleet.yaml"
    inv.write_text("deployments:\n  - {name: a, node: gpu-1, builtin: {}}\n")
    result = run_cli("fleet", inv)
    assert result.returncode == 2
    assert "deployment a boots on node gpu-1: that needs --ray" in result.stderr


@pytest.mark.parametrize("flag", ["--output", "--record"])
def test_cli_an_unwritable_fleet_report_or_record_is_exit_2_before_any_deployment_runs(tmp_path, flag):
    inv = tmp_path / "fleet.yaml"
    inv.write_text("deployments:\n  - name: a\n    attach: {endpoints: ['http://127.0.0.1:9']}\n")
    (tmp_path / "a-file").write_text("x")
    bad = tmp_path / "a-file" / "fleet.dsse.json"
    extra = ["--unsigned"] if flag == "--record" else []
    result = run_cli("fleet", inv, flag, bad, *extra)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and lines == [f"kvpreflight: error: {flag} {bad}: {tmp_path / 'a-file'} is not a folder; "
                                                "choose a writable path"], result.stderr
