"""Finding launch commands in deployment files and reading their flags as the engines do,
with the line each flag stands on (what SARIF and GitHub annotations point at)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpreflight._internal.review.commandline import find_launches, tokenize
from kvpreflight._internal.review.engines import sglang, vllm
from kvpreflight._internal.review.flags import parse_args
from kvpreflight._internal.review.interface import ReviewError
from kvpreflight._internal.review.sources import read_sites


def launches(path: Path):
    return [l for s in read_sites(path) for l in find_launches(s)]


def flags(launch, module):
    a = parse_args(launch, module.ALIASES, module.SWITCHES)
    return {k: (f.value, f.line) for k, f in a.flags.items()}


def test_shell_continuations_keep_each_flags_line(tmp_path):
    f = tmp_path / "serve.sh"
    f.write_text(
        "#!/bin/sh\n"
        "# comment --tp 99\n"
        "python -m sglang.launch_server \\\n"
        "  --model-path /m \\\n"
        "  --tp=4 \\\n"
        "  --mem-fraction-static 0.8 && echo done\n"
    )
    (l,) = launches(f)
    assert l.engine == "sglang" and l.line == 3
    assert flags(l, sglang)["tp"] == ("4", 5)
    assert flags(l, sglang)["mfs"] == ("0.8", 6)


def test_last_flag_wins_like_argparse(tmp_path):
    f = tmp_path / "s.sh"
    f.write_text("sglang serve --model-path /m --tp 2 --tp-size 8\n")
    (l,) = launches(f)
    assert flags(l, sglang)["tp"] == ("8", 1)


def test_sh_c_inside_a_kubernetes_block_scalar_points_at_the_real_line(tmp_path):
    f = tmp_path / "d.yaml"
    f.write_text(
        "kind: StatefulSet\n"                      # 1
        "metadata: {name: s}\n"                    # 2
        "spec:\n"                                  # 3
        "  template:\n"                            # 4
        "    spec:\n"                              # 5
        "      containers:\n"                      # 6
        "        - name: engine\n"                 # 7
        "          command: [bash, -c]\n"          # 8
        "          args:\n"                        # 9
        "            - >\n"                        # 10
        "              python3 -m sglang.launch_server\n"  # 11
        "              --model-path /m\n"          # 12
        "              --context-length 65536\n"   # 13
    )
    (l,) = launches(f)
    assert l.site.where == "StatefulSet/s container engine"
    assert flags(l, sglang)["context"] == ("65536", 13)


def test_sh_c_as_one_quoted_string(tmp_path):
    f = tmp_path / "d.yaml"
    f.write_text(
        "kind: Deployment\nmetadata: {name: d}\nspec:\n  template:\n    spec:\n      containers:\n"
        "        - name: e\n"
        "          command: [\"/bin/sh\", \"-c\", "
        "\"pip list; exec python -m vllm.entrypoints.openai.api_server --model /m --max_model_len 8192\"]\n"
    )
    (l,) = launches(f)
    a = parse_args(l, vllm.ALIASES, vllm.SWITCHES, vllm._normalise)
    assert l.engine == "vllm" and a.value("context") == "8192" and a.line("context") == 8


def test_leaderworkerset_reads_leader_and_worker_templates(tmp_path):
    f = tmp_path / "lws.yaml"
    f.write_text(
        "kind: LeaderWorkerSet\nmetadata: {name: pd}\nspec:\n  leaderWorkerTemplate:\n"
        "    leaderTemplate:\n      spec:\n        containers:\n"
        "          - {name: leader, command: [sglang, serve, --model-path, /m, --tp, '8']}\n"
        "    workerTemplate:\n      spec:\n        containers:\n"
        "          - {name: worker, command: [sglang, serve, --model-path, /m, --tp, '8']}\n"
    )
    found = launches(f)
    assert [l.site.where for l in found] == [
        "LeaderWorkerSet/pd leaderTemplate container leader",
        "LeaderWorkerSet/pd workerTemplate container worker",
    ]


def test_gpu_product_from_node_selector_and_from_node_affinity():
    prefill, decode = launches(Path(__file__).parents[2] / "examples" / "review" / "incident-pd-lws.yaml")
    assert (prefill.site.gpu_product, prefill.site.gpu_product_line) == ("NVIDIA-H200", 15)  # nodeSelector
    assert decode.site.gpu_product == "NVIDIA-H200"  # requiredDuringScheduling... matchExpressions


def test_kubernetes_env_fills_in_dollar_parens(tmp_path):
    f = tmp_path / "d.yaml"
    f.write_text(
        "kind: Deployment\nmetadata: {name: d}\nspec:\n  template:\n    spec:\n      containers:\n"
        "        - name: e\n"
        "          env: [{name: TP, value: '4'}]\n"
        "          command: [vllm, serve, /m, --tensor-parallel-size, $(TP)]\n"
    )
    (l,) = launches(f)
    assert flags(l, vllm)["tp"] == ("4", 9)


def test_boot_spec_skips_the_router_and_keeps_roles():
    found = launches(Path(__file__).parents[1] / "fixtures" / "review" / "bootspec-pd.yaml")
    assert [(l.site.where, l.site.role, l.site.context_length) for l in found] == [
        ("engine prefill", "prefill", 131072),
        ("engine decode", "decode", 131072),
    ]


def test_files_without_engines_give_no_launches(tmp_path):
    f = tmp_path / "svc.yaml"
    f.write_text("kind: Service\nmetadata: {name: x}\n---\n"
                 "kind: Deployment\nspec: {template: {spec: {containers: [{name: n, image: nginx}]}}}\n")
    assert launches(f) == []


def test_unclosed_quote_is_a_review_error():
    with pytest.raises(ReviewError, match="unclosed double quote"):
        tokenize('vllm serve "/m\n')


def test_invalid_yaml_names_file_and_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("kind: Deployment\nspec: [unclosed\n")
    with pytest.raises(ReviewError, match=r"bad.yaml:\d+: not valid YAML"):
        read_sites(f)
