"""Is an engine ready? One GET on its ready URL; 2xx means yes. Never through a proxy: the
engines are on this machine, and an HTTP proxy from the environment would answer for them."""

from __future__ import annotations

import urllib.error
import urllib.request

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def probe(url: str, timeout_s: float = 2.0) -> tuple[bool, str]:
    """(ready, what came back), e.g. (False, "HTTP 503") or (False, "connection refused")."""
    try:
        with _OPENER.open(urllib.request.Request(url, method="GET"), timeout=max(timeout_s, 0.05)) as response:
            return 200 <= response.status < 300, f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except urllib.error.URLError as exc:
        reason = exc.reason
        text = getattr(reason, "strerror", None) or str(reason)
        return False, text.lower()
    except (TimeoutError, OSError) as exc:
        return False, (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__).lower()
