"""GET a JSON document from a health server in a test (status and error answers alike)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from sidecar.health import HealthServer


def get(h: HealthServer, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{h.port}{path}", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
