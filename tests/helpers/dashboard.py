"""optuna-dashboard's WSGI app, called in-process (no server, no port)."""

from __future__ import annotations

import io
import json
from typing import Any
from wsgiref.util import setup_testing_defaults


def wsgi_call(app: Any, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[str, Any]:
    """``METHOD PATH`` (a JSON ``body``) through the WSGI ``app``; returns (status line, JSON answer)."""
    environ: dict[str, Any] = {}
    setup_testing_defaults(environ)
    data = b"" if body is None else json.dumps(body).encode()
    environ.update({"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": "", "wsgi.input": io.BytesIO(data),
                    "CONTENT_LENGTH": str(len(data)), "CONTENT_TYPE": "application/json"})
    status: list[str] = []
    chunks = app(environ, lambda s, headers, exc_info=None: status.append(s))
    raw = b"".join(chunks)
    return status[0], (json.loads(raw) if raw else None)


def api_trials(app: Any, name: str) -> tuple[int, dict[int, dict[str, Any]]]:
    """Study ``name``'s id and its trials by number, as the dashboard's API gives them."""
    status, studies = wsgi_call(app, "GET", "/api/studies")
    assert status.startswith("200"), status
    (sid,) = [s["study_id"] for s in studies["study_summaries"] if s["study_name"] == name]
    status, detail = wsgi_call(app, "GET", f"/api/studies/{sid}")
    assert status.startswith("200"), status
    return sid, {t["number"]: t for t in detail["trials"]}
