"""Talking to the running service from the CLI: port and token from the state dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from dispatcher.errors import ServiceError
from dispatcher.service import PORT_FILE, TOKEN_FILE, read_state_file


class Client:
    def __init__(self, state_dir: Path, timeout_s: float = 30.0) -> None:
        port = read_state_file(state_dir, PORT_FILE)
        token = read_state_file(state_dir, TOKEN_FILE)
        if not port or not port.isdigit():
            raise ServiceError(
                f"the dispatcher is not running for state dir {state_dir} (no port file); "
                "start it with `python -m dispatcher` (or --demo)"
            )
        if not token:
            raise ServiceError(f"no token in {state_dir / TOKEN_FILE}; restart the dispatcher")
        self.base_url = f"http://127.0.0.1:{port}"
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, json: Any = None) -> Any:
        try:
            response = self._http.request(method, path, json=json)
        except httpx.ConnectError as exc:
            raise ServiceError(
                f"the dispatcher does not answer on {self.base_url}: it is not running "
                "(start it with `python -m dispatcher`)"
            ) from exc
        except httpx.HTTPError as exc:
            raise ServiceError(f"request to the dispatcher failed: {exc}") from exc
        if response.status_code in (401, 403):
            raise ServiceError(
                "the dispatcher refused our token: it is stale (the service restarted with "
                "another state dir?) — check DISPATCHER_STATE_DIR"
            )
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text
            raise ServiceError(f"{response.status_code}: {message}")
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.content

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, json: Any = None) -> Any:
        return self.request("POST", path, json=json if json is not None else {})
