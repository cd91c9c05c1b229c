"""Talking to the running service from the CLI: port and token from the state dir.

Deliberately light: it does not import the service (the CLI starts in a
fraction of the time), so the two state-file names are repeated here; a test
checks they match what `dispatcher.service` writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from dispatcher.errors import ServiceError

PORT_FILE = "port"  # == dispatcher.service.PORT_FILE
TOKEN_FILE = "token"  # == dispatcher.service.TOKEN_FILE


class ServiceUnavailable(ServiceError):
    """No dispatcher answers for this state dir (not started, crashed, or stopped)."""


class StaleToken(ServiceError):
    """A dispatcher answers but refuses the token found in the state dir."""


class ApiError(ServiceError):
    """The service understood the request and said no (4xx), or failed (5xx)."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def _read(state_dir: Path, name: str) -> str | None:
    try:
        return (state_dir / name).read_text().strip()
    except OSError:
        return None


class Client:
    def __init__(self, state_dir: Path, timeout_s: float = 30.0) -> None:
        self.state_dir = state_dir
        port = _read(state_dir, PORT_FILE)
        if not port or not port.isdigit():
            raise ServiceUnavailable(
                f"the dispatcher is not running (no port file in state dir {state_dir}); "
                "start it with `python -m dispatcher` (add --demo for the bundled demo "
                "backends), or point DISPATCHER_STATE_DIR / --state-dir at the dir it uses"
            )
        token = _read(state_dir, TOKEN_FILE)
        if not token:
            raise StaleToken(
                f"no token in {state_dir / TOKEN_FILE} (it is written at every start); "
                "restart the dispatcher, or check that you may read that file"
            )
        self.port = int(port)
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
        except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
            raise ServiceUnavailable(
                f"the dispatcher does not answer on {self.base_url}: it is not running, "
                f"or it stopped without removing {self.state_dir / PORT_FILE}; start it "
                "with `python -m dispatcher`"
            ) from exc
        except httpx.TimeoutException as exc:
            raise ServiceUnavailable(
                f"the dispatcher on {self.base_url} did not answer in time "
                f"({exc.__class__.__name__})"
            ) from exc
        except httpx.HTTPError as exc:
            raise ServiceError(
                f"request to the dispatcher failed: {exc.__class__.__name__}"
            ) from exc
        kind, message = self._error_of(response)
        if response.status_code in (401, 403) and kind in ("unauthorized", "forbidden"):
            raise StaleToken(
                f"the dispatcher on {self.base_url} refused the token from "
                f"{self.state_dir / TOKEN_FILE}: it is stale (the service was restarted with "
                "another state dir, or another program took the port). Use the state dir the "
                "running dispatcher writes to (DISPATCHER_STATE_DIR / --state-dir), or restart it"
            )
        if response.status_code >= 400:
            raise ApiError(response.status_code, kind, message)
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.content

    @staticmethod
    def _error_of(response: httpx.Response) -> tuple[str, str]:
        if response.status_code < 400:
            return "", ""
        try:
            error = response.json()["error"]
            return str(error["kind"]), str(error["message"])
        except (ValueError, KeyError, TypeError):
            return "http", f"HTTP {response.status_code}: {response.text[:200]}"

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, json: Any = None) -> Any:
        return self.request("POST", path, json=json if json is not None else {})

    def resolve(self, task_or_job: str) -> tuple[str, dict[str, Any]]:
        """("task"|"job", its answer) for an id that names either."""
        if not task_or_job or "/" in task_or_job or "?" in task_or_job:
            raise ApiError(400, "invalid", f"not a task or job id: {task_or_job!r}")
        try:
            return "task", self.get(f"/v1/tasks/{task_or_job}")
        except ApiError as exc:
            if exc.status != 404:
                raise
        try:
            return "job", self.get(f"/v1/jobs/{task_or_job}")
        except ApiError as exc:
            if exc.status != 404:
                raise
        raise ApiError(404, "not_found", f"no task or job with id {task_or_job!r}")
