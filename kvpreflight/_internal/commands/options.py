"""The typer declarations of the options several commands share, each written once and used by every
command where it means the same thing (a flag that means something else in one command is declared
there, saying why). A parameter is named as its `CheckOptions` field (`endpoints` for --endpoint),
so that `options_from(locals())` builds the options with no field copied by hand."""

from __future__ import annotations

import copy
from typing import Any

import typer

from kvpreflight._internal.engine_kinds import engine_kinds
from kvpreflight.formats import FORMATS
from kvpreflight.model import AUTO_ENGINE

ENGINE_HELP = ", ".join([AUTO_ENGINE, *engine_kinds()])
FORMAT_HELP = ", ".join(FORMATS)

ENDPOINTS = typer.Option(None, "--endpoint", metavar="URL|ROLE=URL", rich_help_panel="Target",
    help="Engine URL, or ROLE=URL (prefill, decode, unified) to override the role it reports. Repeatable.")
ENTRY = typer.Option(None, "--entry", metavar="URL", rich_help_panel="Target",
    help="Client-facing URL (router, load balancer, gateway) where probes are sent. A router that lists its workers (builtin, smg, "
         "vllm-router) names the engines and their roles when no --endpoint is given. \\[default: each unified endpoint itself]")
ENTRY_API = typer.Option("native", "--entry-api", metavar="native|openai", rich_help_panel="Target",
    help="The routes the --entry serves: the engines' own, or only the OpenAI API (a gateway such as the LiteLLM proxy; probes go to "
         "its /v1/completions naming the model the engines serve).")
ENTRY_MODEL = typer.Option(None, "--entry-model", metavar="NAME", rich_help_panel="Target",
    help="The model name clients send to the --entry, where it differs from the one the engines serve (a gateway's model group or "
         "alias). \\[default: the engines' model]")
ENGINE = typer.Option("auto", "--engine", metavar="NAME", rich_help_panel="Target",
    help=f"The engine kind: {ENGINE_HELP}; auto detects it from what the server answers.")
MODEL = typer.Option(None, "--model", metavar="NAME", rich_help_panel="Target",
    help="Model name the engines must serve (and the OpenAI `model` field).")
LOGS = typer.Option(None, "--log", metavar="URL=PATH", rich_help_panel="Target",
    help="URL=PATH of an engine's or the router's log: an independent capacity source, read for danger lines. Repeatable.")
API_KEY_ENV = typer.Option(None, "--api-key-env", metavar="VAR", rich_help_panel="Target",
    help="Name of the environment variable holding the API key.")
API_KEY_FILE = typer.Option(None, "--api-key-file", metavar="PATH", rich_help_panel="Target", help="File holding the API key.")
HEADERS = typer.Option(None, "--header", metavar="'NAME: VALUE'", rich_help_panel="Target",
    help="Extra request header 'Name: value'. Repeatable.")
SECRET_HEADERS = typer.Option(None, "--secret-header", metavar="NAME", rich_help_panel="Target",
    help="NAME of a --header whose value is a secret (kept out of every output; Authorization, *token*, *key*, cookies are already). "
         "Repeatable.")
CA_BUNDLE = typer.Option(None, "--ca-bundle", metavar="PATH", rich_help_panel="Target",
    help="CA bundle for engines behind TLS with a private CA.")
CLIENT_CERT = typer.Option(None, "--client-cert", metavar="PATH", rich_help_panel="Target",
    help="Client certificate (PEM) for gateways that require mutual TLS; the key may be inside it.")
CLIENT_KEY = typer.Option(None, "--client-key", metavar="PATH", rich_help_panel="Target",
    help="Private key (PEM, unencrypted) for --client-cert.")
TENANT_A_KEY_ENV = typer.Option(None, "--tenant-a-key-env", metavar="VAR", rich_help_panel="Isolation",
    help="Environment variable holding synthetic tenant A's API key (isolation probes, canaries).")
TENANT_B_KEY_ENV = typer.Option(None, "--tenant-b-key-env", metavar="VAR", rich_help_panel="Isolation",
    help="Environment variable holding synthetic tenant B's API key (isolation probes, canaries).")
TENANT_HEADER = typer.Option(None, "--tenant-header", metavar="NAME", rich_help_panel="Isolation",
    help="Header NAME the deployment reads the tenant from; tenants send NAME: a and NAME: b.")
NAME = typer.Option(None, "--name", metavar="NAME", rich_help_panel="Output",
                    help="The deployment's name: the `deployment` label of every Prometheus series (and SARIF's per-deployment "
                         "path). \\[default: the entry URL, else the first endpoint]")

# The report and record options of the commands that write them (check, demo, review, fleet, verify).
FORMAT = typer.Option("table", "--format", metavar="FORMAT", rich_help_panel="Output", help=f"One of: {FORMAT_HELP}.")
OUTPUT = typer.Option(None, "--output", metavar="PATH", rich_help_panel="Output", help="Write the report here instead of stdout.")
QUIET = typer.Option(False, "--quiet", "-q", rich_help_panel="Output",
                     help="Leave the passing checks out of the table (the verdict line still counts them).")
ADVISORIES = typer.Option(None, "--advisories", metavar="DIR", rich_help_panel="Probes",
                          help="Extra folder of advisory YAML files (checks/advisories/SCHEMA.md). Repeatable.")
# The promise, not the engine's own length: `demo`'s --context-length sets the demo engines' served
# length instead and is declared there.
CONTEXT_LENGTH = typer.Option(None, "--context-length", metavar="N", rich_help_panel="Target",
                              help="Context length promised to users; the larger of it and what each engine serves is checked. "
                                   "\\[default: what the engine serves]")
SIGN_KEY = typer.Option(None, "--sign-key", metavar="PATH", rich_help_panel="Record",
                        help="Private key file that signs what this command writes (or set KVPREFLIGHT_SIGN_KEY to its path).")
ALLOW_INSECURE_KEY = typer.Option(False, "--allow-insecure-key", rich_help_panel="Record",
                                  help="Use a private key file (--sign-key, --client-key) that others can read (by default "
                                       "refused, as ssh refuses one: chmod 600 it).")
SUBJECTS = typer.Option(None, "--subject", metavar="NAME=sha256:HEX", rich_help_panel="Record",
                        help="NAME=sha256:HEX every record is about (image, config, model revision). Repeatable.")
UNSIGNED = typer.Option(False, "--unsigned", rich_help_panel="Record", help="Write the records unsigned (verify will refuse them).")


def in_panel(option: Any, panel: str | None) -> Any:
    """`option` listed under another --help panel (None: the plain table of a command that groups no
    options), its flag and help unchanged."""
    moved = copy.copy(option)
    moved.rich_help_panel = panel
    return moved
