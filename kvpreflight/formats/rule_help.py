"""What each check id proves and how to fix a finding: the help that SARIF rules carry (GitHub code
scanning shows it beside every alert) and docs/checks.md lists. One entry per stable id, `check`'s
and `review`'s; an id without one (a newer check) gets a generic entry, never none.
"""

from __future__ import annotations

from dataclasses import dataclass

# docs/checks.md has one section per id, anchored by the id itself.
DOCS_URL = "https://github.com/OWNER/kvpreflight/blob/main/docs/checks.md"
INFORMATION_URL = "https://github.com/OWNER/kvpreflight"


@dataclass(frozen=True)
class RuleHelp:
    summary: str  # one line: what the check proves
    description: str  # what it measures and when it fails
    fix: str  # what to do about a failure

    def markdown(self, check_id: str) -> str:
        return f"**{check_id}**: {self.description}\n\n**Fix:** {self.fix}\n\nDetails: [{check_id}]({help_uri(check_id)})"

    def text(self) -> str:
        return f"{self.description} Fix: {self.fix}"


RULES: dict[str, RuleHelp] = {
    "kv-capacity": RuleHelp(
        "Every engine's KV pool holds the context it serves.",
        "Reads each engine's runtime KV pool (allocator log, scheduler API or metrics; the smallest rank counts) "
        "and compares it with the checked context (the larger of the served one and the promised --context-length): below 1.0x fails, "
        "below 1.2x warns (checks/thresholds.yaml). An engine whose start-up log says it cut its longest sequence or "
        "input to fit its KV cache (TensorRT-LLM's clamps) fails, with --capacity-only too.",
        "Give the engine more KV memory (a larger memory fraction, fewer other allocations, more GPUs), or serve a "
        "shorter context; then rerun the check. TensorRT-LLM: start it with --fail_fast_on_attention_window_too_large "
        "so that it refuses to start instead of cutting."),
    "kv-sources-agree": RuleHelp(
        "The KV pool numbers from different sources agree.",
        "Keeps each pool number with its source and origin (allocator log line, scheduler API or metrics, observed "
        "accept/reject boundary). Sources of one origin must agree; a pass needs two origins, one origin warns.",
        "Give kvpreflight a second source (--log URL=PATH for the engine's start-up log, or enable its metrics); if "
        "sources disagree, find which one the engine really enforces."),
    "overcapacity-rejected": RuleHelp(
        "Requests over the pool or over the context are refused, not served.",
        "Sends real over-pool and over-context requests, streamed and not: each must get a length error with zero "
        "tokens while a shorter twin is accepted. HTTP 200 with text, silent truncation, a placeholder, a hang or a 5xx "
        "each fail. Behind a router no KV may reach a decode for a refused request: its counters over the refusal "
        "are read, and a refusal another client's transfer landed beside is sent again in a window of its own.",
        "Make the engine (or its router) refuse prompts longer than its context and pool: set its maximum model "
        "length to what the pool holds, and keep the router from retrying or truncating."),
    "prompt-integrity": RuleHelp(
        "The longest prompt the limits accept is served whole.",
        "Sends the longest prompt the stated limits accept and compares three counts of it: the tokens sent, the "
        "answer's usage, and the engines' own counters over the probe (computed, cache hits, KV received); any "
        "shortfall fails, more is other traffic and is said. An engine whose start-up log warns that it serves a "
        "context past the model's positions (SGLang's and vLLM's override variables) or cut its attention window "
        "(TensorRT-LLM) fails without a probe, with --capacity-only too.",
        "Find what cut or padded the prompt (a gateway limit, a chat template, truncation settings) and remove it, or "
        "state the real limit. On the engine's own warning: lower the served context to the model's positions and "
        "unset the override variable, or give the KV cache room for one whole sequence."),
    "max-tokens-clamp": RuleHelp(
        "max_tokens is honoured, not silently cut.",
        "Warns when the engine silently reduces max_tokens to fit the context (vLLM and llama.cpp do).",
        "Expect shorter answers near the limit, or have the gateway refuse requests whose prompt plus max_tokens "
        "exceed the context."),
    "concurrent-capacity": RuleHelp(
        "Near-limit requests at once succeed or are refused cleanly.",
        "Sends K near-limit requests at once: each must succeed or get a capacity refusal; a 5xx or a truncation fails.",
        "Size the pool for the concurrency you serve, or cap concurrency (scheduler limits, router admission) so "
        "overload is refused, not broken."),
    "engine-healthy-after": RuleHelp(
        "The engines are healthy after the probes.",
        "Reads health, sends a small request and checks used-token gauges are back to idle after the check's last "
        "probe; an engine that was up at the start and is down now fails, and so does one that stopped answering at "
        "any point of the run, whatever its health says later.",
        "Read the engine's log around the probe that hurt it (the report names it); an engine that a long request can "
        "crash or leak KV into will do so in production."),
    "tenant-isolation": RuleHelp(
        "No tenant sees another tenant's data.",
        "Two synthetic tenants with fresh canaries through the entry: normal, boundary and over-capacity input, client "
        "disconnects, load near the pool. Any canary seen by the other tenant fails; a model that cannot echo is "
        "inconclusive, never a pass.",
        "Treat a failure as a data leak: stop serving, find the KV reuse path that crossed tenants (prefix cache, "
        "P/D transfer, a recycled slot) and upgrade or reconfigure the engine; the evidence quotes the canaries."),
    "prefix-cache-isolation": RuleHelp(
        "One tenant never hits another tenant's prefix cache.",
        "Checks the same tenant gets a prefix-cache hit before 'other tenant, no hit' counts; a cross-tenant hit seen by "
        "the answer or by any engine's own counters (a decode's too) fails. Without hit counters a timing audit decides "
        "(Kolmogorov-Smirnov, p < 0.001).",
        "Salt the prefix cache per tenant (a cache salt or namespace), or turn prefix caching off for shared "
        "deployments; on llama.cpp pin tenants to slots with id_slot or force cache_prompt: false."),
    "pd-transfer": RuleHelp(
        "Prefill/decode stacks move the KV instead of recomputing it.",
        "For every probe that reached a decode, its counters show whether the prompt's KV was received, found in its "
        "cache or recomputed; a recompute beyond one page per request or missing KV fails. Danger lines in the logs warn.",
        "Fix the KV transfer (connector configuration, network between prefill and decode, matching page sizes) until "
        "the decode receives the KV; the evidence quotes the counters and log lines."),
    "pd-consistency": RuleHelp(
        "All engines of a deployment serve the same model, context and page size.",
        "Compares what every engine reports: the model (and --model), the served context and the KV page size must "
        "match.",
        "Deploy every engine of the stack from one configuration (same model revision, context length and page size)."),
    "engine-advisories": RuleHelp(
        "No known defect of this engine version and settings applies.",
        "Matches the engine, its version and settings against checks/advisories/*.yaml (for example SGLang < 0.5.21 "
        "with P/D: the intake-reject leak).",
        "Upgrade the engine past the advisory's fixed version, or change the setting it names; the finding names the "
        "advisory."),
    "network-exposure": RuleHelp(
        "No socket of the deployment that carries KV, token ids or KV transfer control listens beyond loopback or "
        "the stated address.",
        "Reads the listening TCP sockets of every process kvpreflight booted (/proc), named by the engine's URL and "
        "the listeners its start-up log names (Mooncake's bootstrap, handshake and TCP transport, SGLang's bootstrap "
        "server, vLLM's and SGLang's KV-events publisher, NIXL's UCX transport); attached, what the --log start-up "
        "logs name. A KV-events "
        "publisher (the token ids of every cached block) beyond loopback or the engines' stated addresses fails; a KV "
        "or transfer-control socket, or one kvpreflight cannot identify, warns; nothing read skips.",
        "Bind the KV-events publisher to loopback or the subscribers' cluster address (--kv-events-config endpoint); "
        "keep UCX on the cluster network (UCX_NET_DEVICES); firewall the KV and transfer ports that the engine binds "
        "to every address whatever it is told (Mooncake) to the peer engines."),
    "kv-capacity-estimate": RuleHelp(
        "The deployment files give each engine a KV pool that holds its context.",
        "Estimates each SGLang, vLLM or llama.cpp engine's KV pool from its flags, the model's config.json and the "
        "GPUs, and compares it with the context it promises: below 1.0x fails, below 1.2x warns.",
        "Change the flag the finding points at (memory fraction, tensor parallelism, context length) until the "
        "estimate holds the context; `kvpreflight check` on the running engines stays the proof."),
    "fleet-run": RuleHelp(
        "Every deployment of the fleet could be checked.",
        "A deployment of the fleet inventory that could not be checked at all (unreachable, failed to boot) is "
        "inconclusive.",
        "Make the deployment reachable from the fleet runner (or fix its boot spec) and rerun the fleet."),
}


def rule_help(check_id: str) -> RuleHelp:
    return RULES.get(check_id) or RuleHelp(
        f"kvpreflight check {check_id}.",
        f"The kvpreflight check {check_id}; its message and evidence say what it found.",
        "Read the finding's message and evidence, and the check's section in the documentation.")


def rule_name(check_id: str) -> str:
    """A readable name distinct from the id (SARIF1001): kv-capacity -> KvCapacity."""
    return "".join(part.capitalize() for part in check_id.split("-"))


def help_uri(check_id: str) -> str:
    return f"{DOCS_URL}#{check_id}"
