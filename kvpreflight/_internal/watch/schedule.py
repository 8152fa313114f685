"""The rules between `watch`'s options, checked before anything is read or sent: exactly one source
of deployments, positive counts, the rounds to run, the metrics address and the record/key pair.
The CLI parses and passes the values; every decision between them is here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvpreflight._internal.watch.service import DEFAULT_LISTEN, Listen, parse_listen
from kvpreflight.errors import ConfigError, naming


@dataclass(frozen=True, kw_only=True)
class WatchSchedule:
    interval_s: float
    max_rounds: int | None  # None: until stopped (SIGTERM, Ctrl-C)
    max_tokens_per_hour: int | None
    full_every_s: float | None
    listen: Listen | None  # None: no metrics server

    @property
    def bounded(self) -> bool:
        """A run of a fixed number of rounds exits with its last round's code, as `check` does."""
        return self.max_rounds is not None


def watch_schedule(*, targets: bool, spec: Path | None, inventory: Path | None, interval: float, once: bool,
                   rounds: int | None, max_tokens_per_hour: int | None, full_every: str | None, canaries: bool,
                   record: Path | None, key: Path | None, textfile: Path | None, listen: str | None) -> WatchSchedule:
    """`targets`: an --endpoint or --entry was given. Raises ConfigError naming the flags at fault."""
    from kvpreflight._internal.watch.budget import parse_every
    from kvpreflight.targets import positive

    given = [flag for flag, on in (("--endpoint/--entry", targets), ("--spec", spec is not None),
                                   ("--inventory", inventory is not None)) if on]
    if not given:
        raise ConfigError("no --endpoint given; pass the URL of every engine, --entry ROUTER (a router that lists its "
                          "workers), --spec SPEC.yaml or --inventory FLEET.yaml")
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)} both name what to watch; give one of --endpoint/--entry, --spec, --inventory")
    for flag, value in (("--interval", interval), ("--rounds", rounds), ("--max-tokens-per-hour", max_tokens_per_hour)):
        try:
            positive(value)
        except ConfigError as exc:
            raise exc.under(flag) from None
    full_every_s = None
    if full_every is not None:
        with naming("--full-every"):
            full_every_s = parse_every(full_every)
        if not canaries:
            raise ConfigError("--full-every sends requests and --no-canaries sends none; drop one of them")
    if once and rounds is not None:
        raise ConfigError("--once is --rounds 1; pass one of them")
    if (record is None) != (key is None):
        raise ConfigError("--record FILE and --key PUB go together: the record is only believed once its signature is verified")
    if textfile is not None and not textfile.is_dir():
        raise ConfigError(f"--textfile {textfile}: not a folder")
    try:  # one round (cron) serves no metrics unless asked to
        where = parse_listen(listen if listen is not None else ("off" if once else DEFAULT_LISTEN))
    except ConfigError as exc:
        raise exc.under("--listen") from None
    return WatchSchedule(interval_s=interval, max_rounds=1 if once else rounds, max_tokens_per_hour=max_tokens_per_hour,
                         full_every_s=full_every_s, listen=where)
