"""A new engine is one adapter file plus one registration line (kvpreflight/_internal/engine_kinds.py): with
only those, `check` detects it, accepts it as `--engine`, writes its kind into the report and the
record, a boot spec takes it and guesses it from its launch command, and `review` finds its
estimator. tests/support/toy_adapter.py is the adapter; the line is added here."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from misbehaving_http import Vllm, _json, _models, fake_engine
from support.cli import invoke

from kvpreflight._internal import engine_kinds
from kvpreflight._internal.engine_kinds import EngineRegistration
from kvpreflight._internal.review import find_all_launches
from kvpreflight._internal.review.engines import estimator
from kvpreflight.boot.spec import guess_engine, parse_spec

TOY = EngineRegistration("toy", "support.toy_adapter:ToyAdapter", "toy /v1/models", (("toyllm",),),
                         "kvpreflight._internal.review.engines.vllm", (("toyllm", "serve"),))


class Toy(Vllm):
    """The fake vLLM, owned by `toy`: the vLLM adapter does not take it, the toy one does."""

    name = "toy"

    def routes(self):
        return {**super().routes(), ("GET", "/v1/models"): _json(_models("toy"))}


@pytest.fixture
def toy_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setitem(engine_kinds.ENGINES, TOY.kind, TOY)  # the one registration line
    with fake_engine(Toy()) as url:
        yield url


def test_check_detects_the_new_engine_and_writes_its_kind_into_the_report_and_the_record(toy_url: str, tmp_path: Path):
    record = tmp_path / "record.json"
    result = invoke("check", "--endpoint", toy_url, "--capacity-only", "--format", "json",
                    "--record", str(record), "--unsigned", "--subject", "app=sha256:" + "ab" * 32)
    assert result.returncode in (0, 3), result.stderr  # read-only: the probe checks are inconclusive, never a fail
    report = json.loads(result.stdout)
    assert [e["engine"] for e in report["engines"]] == ["toy"]
    envelope = json.loads(record.read_text())  # unsigned: a DSSE envelope without signatures
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert [e["engine"] for e in statement["predicate"]["engines"]] == ["toy"]


def test_the_new_engine_is_an_engine_choice_and_its_name_is_in_the_refusal_of_an_unknown_one(toy_url: str):
    named = invoke("check", "--endpoint", toy_url, "--engine", "toy", "--capacity-only", "--format", "json")
    assert named.returncode in (0, 3), named.stderr
    assert [e["engine"] for e in json.loads(named.stdout)["engines"]] == ["toy"]
    unknown = invoke("check", "--endpoint", toy_url, "--engine", "toi", "--capacity-only")
    assert unknown.returncode == 2 and "toy" in unknown.stderr


def test_a_boot_spec_takes_the_new_engine_and_guesses_it_from_its_launch_command(monkeypatch: pytest.MonkeyPatch):
    assert guess_engine(("toyllm", "serve", "m")) == "auto"  # before its registration: unknown
    monkeypatch.setitem(engine_kinds.ENGINES, TOY.kind, TOY)
    assert guess_engine(("toyllm", "serve", "m")) == "toy"
    spec = parse_spec({"deployment": "t", "entry": "a", "engines": [
        {"name": "a", "role": "unified", "port": 8000, "command": "toyllm serve m"},
        {"name": "b", "role": "unified", "port": 8001, "command": "toyllm serve m", "engine": "toy"}]})
    assert [e.kind for e in spec.engines] == ["toy", "toy"]


def test_review_finds_the_new_engines_launch_and_estimates_it_with_the_module_its_registration_names(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    script = tmp_path / "serve.sh"
    script.write_text("exec toyllm serve m --max-model-len 4096\n")
    assert find_all_launches([script]) == [[]]
    with pytest.raises(KeyError):
        estimator("toy")
    monkeypatch.setitem(engine_kinds.ENGINES, TOY.kind, TOY)
    ((launch,),) = find_all_launches([script])
    assert launch.engine == "toy"
    assert estimator("toy").__name__ == "kvpreflight._internal.review.engines.vllm"
