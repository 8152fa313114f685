"""The typer declarations of the options `check` and `watch` share, each written once. A command's
parameter is named as its `CheckOptions` field (`endpoints` for --endpoint), so that
`options_from(locals())` builds the options with no field copied by hand."""

from __future__ import annotations

import typer

from kvpreflight.engine_kinds import engine_kinds
from kvpreflight.model import AUTO_ENGINE

ENGINE_HELP = ", ".join([AUTO_ENGINE, *engine_kinds()])

ENDPOINTS = typer.Option(None, "--endpoint", metavar="URL|ROLE=URL", rich_help_panel="Target", help="Engine URL, or ROLE=URL (prefill, decode, unified) to override the role it reports. Repeatable.")
ENTRY = typer.Option(None, "--entry", metavar="URL", rich_help_panel="Target", help="Client-facing URL (router, load balancer, gateway) where probes are sent. A router that lists its workers (builtin, smg, vllm-router) names the engines and their roles when no --endpoint is given. [default: each unified endpoint itself]")
ENTRY_API = typer.Option("native", "--entry-api", metavar="native|openai", rich_help_panel="Target", help="The routes the --entry serves: the engines' own, or only the OpenAI API (a gateway such as the LiteLLM proxy; probes go to its /v1/completions naming the model the engines serve).")
ENTRY_MODEL = typer.Option(None, "--entry-model", metavar="NAME", rich_help_panel="Target", help="The model name clients send to the --entry, where it differs from the one the engines serve (a gateway's model group or alias). [default: the engines' model]")
ENGINE = typer.Option("auto", "--engine", metavar="NAME", rich_help_panel="Target", help=f"The engine kind: {ENGINE_HELP}; auto detects it from what the server answers.")
MODEL = typer.Option(None, "--model", metavar="NAME", rich_help_panel="Target", help="Model name the engines must serve (and the OpenAI `model` field).")
LOGS = typer.Option(None, "--log", metavar="URL=PATH", rich_help_panel="Target", help="URL=PATH of an engine's or the router's log: an independent capacity source, read for danger lines. Repeatable.")
API_KEY_ENV = typer.Option(None, "--api-key-env", metavar="VAR", rich_help_panel="Target", help="Name of the environment variable holding the API key.")
API_KEY_FILE = typer.Option(None, "--api-key-file", metavar="PATH", rich_help_panel="Target", help="File holding the API key.")
HEADERS = typer.Option(None, "--header", metavar="'NAME: VALUE'", rich_help_panel="Target", help="Extra request header 'Name: value'. Repeatable.")
SECRET_HEADERS = typer.Option(None, "--secret-header", metavar="NAME", rich_help_panel="Target", help="NAME of a --header whose value is a secret (kept out of every output; Authorization, *token*, *key*, cookies are already). Repeatable.")
CA_BUNDLE = typer.Option(None, "--ca-bundle", metavar="PATH", rich_help_panel="Target", help="CA bundle for engines behind TLS with a private CA.")
CLIENT_CERT = typer.Option(None, "--client-cert", metavar="PATH", rich_help_panel="Target", help="Client certificate (PEM) for gateways that require mutual TLS; the key may be inside it.")
CLIENT_KEY = typer.Option(None, "--client-key", metavar="PATH", rich_help_panel="Target", help="Private key (PEM, unencrypted) for --client-cert.")
TENANT_A_KEY_ENV = typer.Option(None, "--tenant-a-key-env", metavar="VAR", rich_help_panel="Isolation", help="Environment variable holding synthetic tenant A's API key (isolation probes, canaries).")
TENANT_B_KEY_ENV = typer.Option(None, "--tenant-b-key-env", metavar="VAR", rich_help_panel="Isolation", help="Environment variable holding synthetic tenant B's API key (isolation probes, canaries).")
TENANT_HEADER = typer.Option(None, "--tenant-header", metavar="NAME", rich_help_panel="Isolation", help="Header NAME the deployment reads the tenant from; tenants send NAME: a and NAME: b.")
