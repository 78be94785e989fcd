"""The Docker engine, through its command line: the containers of one compose project, their
state, the faults done to them (kill, pause, restart, stop with a grace period, network
disconnect and reconnect, `tc netem` inside), and their deaths as `docker events` reports them.

The CLI, not the SDK: it is there wherever an engine is (the SDK is one more dependency), it
speaks every engine version, and each call is one subprocess awaited on the event loop, never a
blocking socket. Containers are named by their compose service (the label compose sets); a
device or service id hosted by a container (one per node: its devices are network aliases)
resolves to it through the servers table the launcher gives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from cmemu.emulator.model.errors import NotFoundError, PreconditionError, UnavailableError, quote

PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"
CALL_TIMEOUT_S = 120.0  # a `docker stop` waits out its grace period
DOWN_TIMEOUT_S = 900.0  # creating or removing hundreds of containers on a busy engine
NETEM_DEVICE = "eth0"


class DockerError(PreconditionError):
    """A docker command failed: its stderr says why."""


async def docker(*args: str, timeout_s: float = CALL_TIMEOUT_S) -> str:
    """`docker ARGS...`'s stdout; DockerError with its stderr when it exits non-zero."""
    return await run_command(["docker", *args], timeout_s=timeout_s)


async def run_command(
    argv: list[str], *, timeout_s: float = CALL_TIMEOUT_S, env: Mapping[str, str] | None = None
) -> str:
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else None,
        )
    except FileNotFoundError as exc:
        raise PreconditionError(f"{argv[0]} is not installed: {exc}") from exc
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise UnavailableError(
            f"`{' '.join(argv[:4])} ...` did not end in {timeout_s:g} s"
        ) from None
    if proc.returncode != 0:
        message = err.decode(errors="replace").strip() or out.decode(errors="replace").strip()
        raise DockerError(f"`{' '.join(argv[:3])} ...` failed: {message[-500:]}")
    return out.decode()


async def engine_version() -> str | None:
    """The engine's version, or None when no engine answers (no CLI, no daemon, no access)."""
    try:
        out = await docker("version", "--format", "{{.Server.Version}}", timeout_s=15.0)
    except (PreconditionError, UnavailableError):
        return None
    return out.strip() or None


def engine_answers() -> str | None:
    """engine_version for a caller with no event loop yet (the CLI, before it starts one)."""
    try:
        done = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            capture_output=True, text=True, timeout=15.0, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def compose_command() -> list[str]:
    """The compose tool: docker-compose (Debian's v1), else the `docker compose` plugin."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        return ["docker", "compose"]
    raise PreconditionError(
        "no compose tool: apt-get install docker-compose (or the Docker Compose plugin)"
    )


@dataclass(frozen=True, kw_only=True)
class Container:
    """A container as the engine reports it: its state, health and exit code."""

    name: str  # the engine's name (project_service_1)
    service: str  # the compose service
    state: str  # created, running, paused, restarting, exited, dead
    health: str  # healthy, unhealthy, starting, or "" without a healthcheck
    exit_code: int
    pid: int
    networks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # name -> aliases


def _container(doc: Mapping[str, object]) -> Container:
    config = doc.get("Config") or {}
    labels = (config.get("Labels") if isinstance(config, dict) else None) or {}
    state = doc.get("State") or {}
    assert isinstance(state, dict)
    nets = (doc.get("NetworkSettings") or {}).get("Networks") or {}  # type: ignore[attr-defined]
    return Container(
        name=str(doc.get("Name", "")).lstrip("/"),
        service=str(labels.get(SERVICE_LABEL, "")),
        state=str(state.get("Status", "")),
        health=str((state.get("Health") or {}).get("Status", "")),
        exit_code=int(state.get("ExitCode") or 0),
        pid=int(state.get("Pid") or 0),
        networks={k: tuple((v or {}).get("Aliases") or ()) for k, v in nets.items()},
    )


@dataclass(frozen=True, kw_only=True)
class ContainerEvent:
    """A container's lifecycle event (`docker events`): die carries the exit code."""

    action: str  # die, start, kill, pause, unpause, stop, restart, health_status: healthy...
    service: str
    name: str
    exit_code: int | None


class DockerEngine:
    """The containers of one compose project, and what can be done to them."""

    def __init__(
        self,
        project: str,
        *,
        servers: Mapping[str, tuple[str, ...]] | None = None,
        networks: Mapping[str, Mapping[str, tuple[str, ...]]] | None = None,
    ) -> None:
        self.project = project
        self.servers = dict(servers or {})  # compose service -> device and service ids it hosts
        # compose service -> the engine's networks it joins and its aliases on each (what a
        # reconnect restores: compose gives them at creation, `docker network connect` needs
        # them again)
        self.networks = {k: dict(v) for k, v in (networks or {}).items()}

    # --- finding containers ----------------------------------------------------------------

    async def containers(self) -> list[Container]:
        ids = (
            await docker("ps", "-aq", "--filter", f"label={PROJECT_LABEL}={self.project}")
        ).split()
        if not ids:
            return []
        return [_container(d) for d in json.loads(await docker("inspect", *ids))]

    def hosted(self, service: str) -> tuple[str, ...]:
        """The device and service ids a compose service hosts (none: the broker)."""
        return tuple(self.servers.get(service, ()))

    def services_of(self, target: str) -> list[str]:
        """The compose services a target names: a service itself, the one hosting a device or
        service id, or every one hosting a device of a node (`n07`)."""
        if target in self.servers:
            return [target]
        hosting = [s for s, hosted in self.servers.items() if target in hosted]
        if hosting:
            return hosting
        prefix = f"{target}-"
        node = [
            s for s, hosted in self.servers.items() if any(h.startswith(prefix) for h in hosted)
        ]
        if node:
            return node
        raise NotFoundError(
            f"no container of project {self.project} hosts {quote(target)} (a compose service, "
            "a device or service id, or a node)",
            field="target",
            subject=target,
            reason="CONTAINER_NOT_FOUND",
        )

    async def container(self, service: str) -> Container:
        for c in await self.containers():
            if c.service == service:
                return c
        raise NotFoundError(
            f"service {quote(service)} of project {self.project} has no container",
            subject=service,
            reason="CONTAINER_NOT_FOUND",
        )

    async def sweep(self) -> list[str]:
        """Remove whatever of the project is left (containers, then networks and volumes, by
        the label compose gives them): what a `down` that failed half-way leaves. What it
        removed."""
        label = f"label={PROJECT_LABEL}={self.project}"
        removed: list[str] = []
        for kind, listing in (("container", ["ps", "-aq"]), ("network", ["network", "ls", "-q"]),
                              ("volume", ["volume", "ls", "-q"])):  # fmt: skip
            ids = (await docker(*listing, "--filter", label)).split()
            if ids:
                remove = ["rm", "-f"] if kind == "container" else [kind, "rm"]
                await docker(*remove, *ids, timeout_s=DOWN_TIMEOUT_S)
                removed += [f"{kind} {i[:12]}" for i in ids]
        return removed

    # --- faults ----------------------------------------------------------------------------

    async def kill(self, service: str, signal: str = "KILL") -> None:
        await docker("kill", "--signal", signal, (await self.container(service)).name)

    async def pause(self, service: str) -> None:
        await docker("pause", (await self.container(service)).name)

    async def unpause(self, service: str) -> None:
        await docker("unpause", (await self.container(service)).name)

    async def stop(self, service: str, grace_s: float) -> None:
        """SIGTERM, then SIGKILL after the grace period (the emulator drains on SIGTERM)."""
        await docker("stop", "--time", str(round(grace_s)), (await self.container(service)).name)

    async def start(self, service: str) -> None:
        await docker("start", (await self.container(service)).name)

    async def restart(self, service: str, grace_s: float) -> None:
        await docker("restart", "--time", str(round(grace_s)), (await self.container(service)).name)

    async def disconnect(self, service: str) -> None:
        """Take the container off every network it is on: nothing reaches it, it reaches
        nothing, and its published ports go with its network."""
        c = await self.container(service)
        for net in c.networks:
            await docker("network", "disconnect", "--force", net, c.name)

    async def reconnect(self, service: str) -> None:
        """Back on the networks compose gave it, with their aliases."""
        c = await self.container(service)
        wanted = self.networks.get(service)
        if not wanted:
            raise NotFoundError(f"no networks recorded for {quote(service)}", subject=service)
        for net, aliases in wanted.items():
            if net in c.networks:
                continue
            flags = [a for alias in aliases for a in ("--alias", alias)]
            await docker("network", "connect", *flags, net, c.name)

    async def netem(
        self, service: str, *, delay_ms: float, jitter_ms: float, loss_pct: float
    ) -> None:
        """`tc qdisc ... netem` on the container's interface: every packet it sends is late
        (and some lost). Needs iproute2 in the image and NET_ADMIN for the service."""
        argv = ["tc", "qdisc", "replace", "dev", NETEM_DEVICE, "root", "netem"]
        if delay_ms:
            argv += ["delay", f"{delay_ms:g}ms"] + ([f"{jitter_ms:g}ms"] if jitter_ms else [])
        if loss_pct:
            argv += ["loss", f"{loss_pct:g}%"]
        await self._exec(service, argv)

    async def clear_netem(self, service: str) -> None:
        await self._exec(service, ["tc", "qdisc", "del", "dev", NETEM_DEVICE, "root"])

    async def _exec(self, service: str, argv: list[str]) -> None:
        c = await self.container(service)
        try:
            await docker("exec", c.name, *argv)
        except DockerError as exc:
            text = str(exc)
            why = (
                "the service lacks the NET_ADMIN capability (cap_add)"
                if "Operation not permitted" in text
                else "the image has no iproute2"
                if "not found" in text
                else text
            )
            raise PreconditionError(f"tc in {c.name}: {why}", reason="NETEM_UNSUPPORTED") from exc

    # --- deaths ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def events(self) -> AsyncIterator[asyncio.Queue[ContainerEvent]]:
        """The project's container events as they happen (`docker events`), in a queue, while
        the block runs; the watcher process ends with it."""
        proc = await asyncio.create_subprocess_exec(
            "docker", "events", "--format", "{{json .}}",
            "--filter", "type=container", "--filter", f"label={PROJECT_LABEL}={self.project}",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        queue: asyncio.Queue[ContainerEvent] = asyncio.Queue()

        async def pump() -> None:
            assert proc.stdout is not None
            async for line in proc.stdout:
                event = parse_event(line.decode(errors="replace"))
                if event is not None:
                    queue.put_nowait(event)

        task = asyncio.create_task(pump(), name=f"docker-events-{self.project}")
        try:
            yield queue
        finally:
            task.cancel()
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def parse_event(line: str) -> ContainerEvent | None:
    """One `docker events --format '{{json .}}'` line; None for a line that is not one."""
    try:
        doc = json.loads(line)
    except json.JSONDecodeError:
        return None
    attrs = (doc.get("Actor") or {}).get("Attributes") or {}
    action = str(doc.get("Action") or doc.get("status") or "")
    if not action:
        return None
    code = attrs.get("exitCode")
    return ContainerEvent(
        action=action.split(":", maxsplit=1)[0].strip() if action.startswith("exec_") else action,
        service=str(attrs.get(SERVICE_LABEL, "")),
        name=str(attrs.get("name", "")),
        exit_code=int(code) if code is not None and str(code).lstrip("-").isdigit() else None,
    )
