"""Running the service itself: serve, the demo run, and the dashboard link."""

from __future__ import annotations

import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from dispatcher.cli.output import console, err
from dispatcher.cli.plumbing import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    fail,
    handled,
    load_settings,
    options,
    service_client,
)
from dispatcher.cli.progress import summary, watch_job
from dispatcher.cli.service_client import Client
from dispatcher.cli.tasks import create_job
from dispatcher.errors import ConfigError, DispatcherError
from dispatcher.invocation import cli_command
from dispatcher.tasks.batchfile import read_batch_lines

if TYPE_CHECKING:
    from dispatcher.profiles import Profile
    from dispatcher.service.core import Service
    from dispatcher.settings import Settings

# What `--demo` provides to the bundled profiles (see demo/bootstrap.py start_demos).
DEMO_VARIABLES = ("DEMO_API_URL", "DEMO_WEB_URL", "DEMO_COMFY_URL")

BATCH_SAMPLE = Path(__file__).resolve().parents[2] / "demo" / "sample-batch.jsonl"

LogFormat = Annotated[
    str | None,
    typer.Option("--log-format", help="text or json (default: DISPATCHER_LOG_FORMAT, else text)."),
]
LogLevel = Annotated[str | None, typer.Option("--log-level", help="DEBUG, INFO, WARNING...")]
DemoFlag = Annotated[bool, typer.Option("--demo", help="Also run the bundled demo backends.")]
PortOption = Annotated[int | None, typer.Option("--port", help="Port for the local API.")]


def migrate(
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            help="sqlite:///<path> or postgresql://... (default: DISPATCHER_DATABASE_URL, "
            "else the SQLite file in the state dir).",
        ),
    ] = None,
) -> None:
    """Apply the database migrations, print the schema version reached, and exit.

    Safe while other hosts start on the same PostgreSQL database: migrations
    run under an advisory lock. `serve` also migrates at start.
    """
    import asyncio

    from dispatcher.store import migrate_only

    settings = load_settings(database_url=database_url, state_dir=options.get("state_dir"))
    url = settings.resolved_database_url
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    try:
        version = asyncio.run(migrate_only(url))
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    except DispatcherError as exc:
        fail(str(exc), EXIT_FAILED)
    console.print(f"schema version {version}")


def make_service(settings: Settings) -> Service:
    """The service, handed the demo's start-up step when the settings ask for
    the demo (the service itself never imports the demo)."""
    from dispatcher.service.core import Service

    if not settings.demo:
        return Service(settings)
    from demo.bootstrap import Demo

    return Service(settings, demo=Demo())


def serve(
    demo: DemoFlag = False,
    port: PortOption = None,
    log_format: LogFormat = None,
    log_level: LogLevel = None,
) -> None:
    """Serve until SIGTERM (also the default).

    What `python -m dispatcher` does with no command; SIGTERM stops running
    tasks at their checkpoints and leaves them recoverable.
    """
    from dispatcher.logs import FORMATS, setup_logging

    if log_format is not None and log_format not in FORMATS:
        fail(f"--log-format must be one of {', '.join(FORMATS)}", EXIT_USAGE)
    settings = load_settings(
        demo=demo or None,
        port=port,
        log_format=log_format,
        log_level=log_level,
        state_dir=options.get("state_dir"),
    )
    try:
        setup_logging(settings.log_level, settings.log_format)
    except ValueError as exc:
        fail(f"invalid log level {settings.log_level!r}: {exc}", EXIT_USAGE)
    from dispatcher.service import eventloop
    from dispatcher.service.signals import serve_forever

    try:
        eventloop.run(serve_forever(make_service(settings)), settings.event_loop)
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    except DispatcherError as exc:
        fail(str(exc), EXIT_FAILED)
    except KeyboardInterrupt:
        pass


def dashboard() -> None:
    """Print a one-time dashboard URL.

    The code in it is valid for 2 minutes and works once; the page trades it
    for a session cookie. The token itself never leaves the state dir.
    """
    with service_client() as client:
        code = client.post("/v1/dashboard-code")["code"]
        url = f"{client.base_url}/v1/session?code={code}"
        port = client.port
    sys.stdout.write(url + "\n")
    sys.stdout.flush()
    err.print(
        f"open it within 2 minutes; it works once. From another machine, tunnel first: "
        f"ssh -N -L {port}:127.0.0.1:{port} <this host>"
    )


def demo_run(
    exit_when_done: Annotated[bool, typer.Option(help="Stop once the sample batch ends.")] = False,
    batch_file: Annotated[Path, typer.Option(help="The sample batch.")] = BATCH_SAMPLE,
) -> None:
    """Demo: serve, run the sample batch, keep serving.

    Starts the service with the bundled demo backends, prints a dashboard URL,
    runs the sample batch to completion with live progress, then keeps serving.
    """
    import asyncio

    from dispatcher.logs import setup_logging
    from dispatcher.service import eventloop
    from dispatcher.service.collector import settle_after_start
    from dispatcher.service.signals import reloading_on_hangup

    settings = load_settings(demo=True, state_dir=options.get("state_dir"))
    setup_logging("WARNING", settings.log_format)
    with handled():
        lines = read_batch_lines(batch_file)

    def drive(url: str) -> str:
        # A thread of its own: the blocking client must not stall the service's loop.
        with Client(settings.state_dir) as client:
            code = client.post("/v1/dashboard-code")["code"]
            console.print(f"dispatcher running on {url} (state dir {settings.state_dir})")
            console.print(f"dashboard (open within 2 minutes): {url}/v1/session?code={code}")
            known = {
                m
                for lane in client.get("/v1/lanes")
                if not lane.get("invalid")
                for m in lane["models"]
            }
            runnable = [line for line in lines if line.task["model"] in known]
            skipped = sorted({line.task["model"] for line in lines} - known)
            if skipped:
                err.print(
                    f"[yellow]skipping[/yellow] {len(lines) - len(runnable)} task(s) for "
                    f"models not loaded here: {', '.join(skipped)}"
                )
            if not runnable:
                return "nothing to run"
            job = create_job(client, "demo", batch_file, runnable)
            job = watch_job(client, job["id"])
            summary(job, console)
            return str(job["state"])

    async def run() -> int:
        # SIGTERM stops the demo as it stops `serve`: running tasks at their
        # checkpoints, the browsers closed, nothing left behind.
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stopping.set)
        service = make_service(settings)
        try:
            await service.start()
            settle_after_start()
            with reloading_on_hangup(service):
                return await serve_demo(service, stopping)
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            await service.stop()

    async def serve_demo(service: Service, stopping: asyncio.Event) -> int:
        driving = asyncio.ensure_future(asyncio.to_thread(drive, service.url))
        stopped = asyncio.ensure_future(stopping.wait())
        await asyncio.wait({driving, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if stopping.is_set():
            err.print(
                "stopping: running tasks stop at their checkpoints; the next start resumes them"
            )
            driving.cancel()  # its thread ends on its own once the service is gone
            return EXIT_OK
        stopped.cancel()
        state = driving.result()
        if exit_when_done:
            return EXIT_OK if state == "success" else EXIT_FAILED
        console.print(
            f"still serving; try `{cli_command()} batch "
            "demo/sample-batch.csv` or `... dashboard` in another shell "
            f"(DISPATCHER_STATE_DIR={settings.state_dir}). Ctrl-C or SIGTERM stops; SIGHUP reloads."
        )
        await stopping.wait()
        err.print("stopping")
        return EXIT_OK

    code = EXIT_OK
    with handled():
        try:
            code = eventloop.run(run(), settings.event_loop)
        except KeyboardInterrupt:
            code = EXIT_OK
    raise typer.Exit(code)


def check(
    directory: Annotated[
        Path | None,
        typer.Argument(help="A profiles dir (default: the configured DISPATCHER_PROFILES_DIR)."),
    ] = None,
    demo: DemoFlag = False,
    live: Annotated[
        bool,
        typer.Option(
            "--live",
            help="Also ask each ComfyUI server (GET /object_info) whether it can run "
            "the profile's workflows: node classes, mapped inputs, value types; "
            "and each gradio app whether its endpoint's parameters fit the mapping.",
        ),
    ] = False,
) -> None:
    """Validate every profile in a dir and list every problem (file, key, why).

    One line per valid profile, one per problem and one per profile skipped
    for a `${NAME}` set nowhere; exit 2 when any file is wrong or no profile
    is usable (the service would not start), 0 otherwise. Needs no running
    service. With --demo, the demo's `${DEMO_*_URL}` variables count as provided.
    With --live, each ComfyUI profile is checked against its servers too
    (exit 2 on any problem or a server that cannot be reached).
    """
    from dispatcher.profiles import read_profiles
    from dispatcher.tasks.webfields import uncarried_fingerprint_fields

    settings = load_settings(demo=demo or None, state_dir=options.get("state_dir"))
    where = directory if directory is not None else settings.profiles_dir
    variables = dict.fromkeys(DEMO_VARIABLES, "http://127.0.0.1:1") if demo else {}
    try:
        found = read_profiles(where, variables)
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    for name, profile in sorted(found.profiles.items()):
        console.print(f"ok       {escape(name)} ({profile.kind.value}, {escape(profile.source)})")
        for param in uncarried_fingerprint_fields(profile):
            err.print(
                f"warning  {escape(name)}: fingerprinted param `{escape(param)}` reaches no "
                "control of the page (neither the prompt nor a [web.fields] entry): tasks "
                "differing only in it are told apart, yet the page gets the same input"
            )
    for skip in found.skipped:
        err.print(f"skipped  {escape(skip.file)}: {escape(skip.why)}")
    for problem in found.problems:
        spot = f"{escape(problem.file)}: `{escape(problem.key)}`"
        err.print(f"invalid  {spot}: {escape(problem.why)}")
    files = len({p.file for p in found.problems})
    if found.problems:
        err.print(f"{len(found.problems)} problem(s) in {files} file(s) of {where}")
        raise typer.Exit(EXIT_USAGE)
    if not found.profiles:
        # The service refuses to start with no profile: so does its check.
        fail(
            f"no profile loaded from {where}: "
            + (
                f"{len(found.skipped)} skipped (see above), none usable"
                if found.skipped
                else "it holds no *.toml file"
            ),
            EXIT_USAGE,
        )
    skipped = f", {len(found.skipped)} skipped" if found.skipped else ""
    console.print(f"{len(found.profiles)} profile(s) valid in {where}{skipped}")
    if live:
        comfy_bad = _check_comfy_live(found.profiles, settings.http_timeout_s)
        gradio_bad = _check_gradio_live(found.profiles)
        if comfy_bad or gradio_bad:
            raise typer.Exit(EXIT_USAGE)


def _check_gradio_live(profiles: Mapping[str, Profile]) -> int:
    """`check --live`: each gradio app asked for its endpoint's parameters."""
    import asyncio

    from apirunner.gradio_check import check_gradio_live

    checked, problems = asyncio.run(check_gradio_live(profiles))
    for problem in problems:
        err.print(
            f"live     {escape(problem.profile)} ({escape(problem.provider)}): "
            f"{escape(problem.why)}"
        )
    bad = {p.profile for p in problems}
    for name in checked:
        if name not in bad:
            console.print(f"live ok  {escape(name)}")
    if problems:
        err.print(f"{len(problems)} live problem(s) in {len(bad)} profile(s)")
    return len(problems)


def _check_comfy_live(profiles: dict[str, Any], timeout_s: float) -> int:
    """`check --live`: each ComfyUI server asked (GET /object_info) about the workflows."""
    from dispatcher.cli.livecheck import live_check

    results = live_check(profiles, timeout_s)
    bad = 0
    for result in results:
        spot = f"{escape(result.profile)} on {escape(result.server)}"
        if not result.problems:
            console.print(f"live ok  {spot}: {escape(result.checked)}")
        for problem in result.problems:
            bad += 1
            err.print(f"live bad {spot}: {escape(problem)}")
    if bad:
        err.print(f"{bad} problem(s) found on the servers")
    return bad
