"""Talking to the running service from the CLI: port and token from the state dir.

Deliberately light, so that every CLI command starts fast: the standard
library's http.client (one short connection per request to 127.0.0.1), and
no import of the service. The two state-file names are therefore repeated
here; a test checks they match what `dispatcher.service` writes.
"""

from __future__ import annotations

import hashlib
import http.client
import json as jsonlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from dispatcher.errors import ServiceError
from dispatcher.invocation import cli_command

PORT_FILE = "port"  # == dispatcher.service.core.PORT_FILE
TOKEN_FILE = "token"  # == dispatcher.service.statedir.TOKEN_FILE
FULL_ID_CHARS = 32  # uuid4().hex, as dispatcher.models.new_id makes them
DOWNLOAD_CHUNK_BYTES = 1 << 16


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
                f"start it with `{cli_command()}` (add --demo for the bundled demo "
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
        self.timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    def close(self) -> None:
        """Nothing is held open between requests; kept for `with` blocks."""

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, json: Any = None) -> Any:
        headers = dict(self._headers)
        body = None
        if json is not None:
            body = jsonlib.dumps(json).encode()
            headers["Content-Type"] = "application/json"
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout_s)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            status = response.status
            content_type = response.getheader("content-type") or ""
            data = response.read()
        except TimeoutError as exc:
            raise ServiceUnavailable(
                f"the dispatcher on {self.base_url} did not answer within {self.timeout_s:.0f}s"
            ) from exc
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            raise ServiceUnavailable(
                f"the dispatcher does not answer on {self.base_url}: it is not running, "
                f"or it stopped without removing {self.state_dir / PORT_FILE}; start it "
                f"with `{cli_command()}`"
            ) from exc
        finally:
            connection.close()
        kind, message = self._error_of(status, data)
        if status in (401, 403) and kind in ("unauthorized", "forbidden"):
            raise StaleToken(
                f"the dispatcher on {self.base_url} refused the token from "
                f"{self.state_dir / TOKEN_FILE}: it is stale (the service was restarted with "
                "another state dir, or another program took the port). Use the state dir the "
                "running dispatcher writes to (DISPATCHER_STATE_DIR / --state-dir), or restart it"
            )
        if status >= 400:
            raise ApiError(status, kind, message)
        if content_type.startswith("application/json"):
            try:
                return jsonlib.loads(data)
            except ValueError as exc:
                raise ServiceError(f"the dispatcher answered {path} with broken JSON") from exc
        return data

    @staticmethod
    def _error_of(status: int, data: bytes) -> tuple[str, str]:
        if status < 400:
            return "", ""
        try:
            error = jsonlib.loads(data)["error"]
            return str(error["kind"]), str(error["message"])
        except (ValueError, KeyError, TypeError):
            text = data[:200].decode("utf-8", "replace")
            return "http", f"HTTP {status}: {text}"

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, json: Any = None) -> Any:
        return self.request("POST", path, json=json if json is not None else {})

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def resolve(self, task_or_job: str) -> tuple[str, dict[str, Any]]:
        """("task"|"job", its answer) for an id, or a unique prefix, that names either."""
        if not task_or_job.strip():
            raise ApiError(400, "invalid", "give a task or job id")
        safe = quote(task_or_job, safe="")
        found: list[tuple[str, dict[str, Any]]] = []
        for kind in ("task", "job"):
            try:
                found.append((kind, self.get(f"/v1/{kind}s/{safe}")))
            except ApiError as exc:
                if exc.status != 404:
                    raise
            if found and len(task_or_job) >= FULL_ID_CHARS:
                break  # a whole id names one thing; only a prefix can name both
        if not found:
            raise ApiError(404, "not_found", f"no task or job with id {task_or_job!r}")
        if len(found) > 1:
            raise ApiError(
                409,
                "ambiguous",
                f"{task_or_job!r} starts both task {found[0][1]['id']} and job "
                f"{found[1][1]['id']}; give more characters",
            )
        return found[0]

    def download(self, path: str, dest: Path) -> tuple[int, str]:
        """Stream a GET into `dest` (whole or not at all); its size and sha256."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout_s)
        partial = dest.with_name(dest.name + ".part")
        digest = hashlib.sha256()
        size = 0
        try:
            connection.request("GET", path, headers=self._headers)
            response = connection.getresponse()
            if response.status >= 400:
                kind, message = self._error_of(response.status, response.read())
                raise ApiError(response.status, kind, message)
            with partial.open("wb") as handle:
                while chunk := response.read(DOWNLOAD_CHUNK_BYTES):
                    handle.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
            partial.replace(dest)
        except (ConnectionError, http.client.HTTPException, TimeoutError) as exc:
            raise ServiceUnavailable(
                f"the download of {path} from {self.base_url} broke off: {exc}"
            ) from exc
        finally:
            connection.close()
            partial.unlink(missing_ok=True)
        return size, digest.hexdigest()


def wait_until_serving(
    state_dir: Path, *, alive: Callable[[], bool], timeout_s: float, poll_s: float = 0.05
) -> bool:
    """Wait until the dispatcher of `state_dir` answers `/healthz` with the token it wrote.

    For whoever just started it (scripts, tests, benchmarks): `alive` says
    whether that process still runs, so a service that exited ends the wait
    at once. False when it exited or `timeout_s` passed.
    """
    deadline = time.monotonic() + timeout_s
    while alive() and time.monotonic() < deadline:
        try:
            Client(state_dir, timeout_s=2.0).get("/healthz")
            return True
        except ServiceError:
            time.sleep(poll_s)  # not up yet: no port or token file, or not listening yet
    return False
