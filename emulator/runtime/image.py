"""The emulator's one image, built with or without a container registry (`cmemu image build`).

- registry: `compose/Dockerfile`, FROM python:3.11-slim, `pip install .` from PyPI; the broker
  is the eclipse-mosquitto image. The default wherever the base image can be had.
- debootstrap (air-gapped): a Debian root file system made by `debootstrap` (python3, its venv
  module, mosquitto and iproute2 from Debian's packages), imported with `docker import` and
  tagged once (BASE_TAG, reused by every later build); then `compose/Dockerfile.airgap` installs
  the emulator into a venv from a wheelhouse that pip fills on the host (`pip wheel`), with
  `--no-index`: the build itself reaches no network. The broker runs from this same image.

Both tag IMAGE; the image's labels say which path made it and whether it holds mosquitto (the
compose launcher reads them to run the broker from it). The builds shell out to docker,
debootstrap and pip: they are commands a person runs, not part of an event loop.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cmemu.emulator.model.errors import InvalidArgumentError, PreconditionError, UnknownNameError

IMAGE = "cloudmatrix-emulator:latest"
REGISTRY_BASE = "python:3.11-slim"
BROKER_IMAGE = "eclipse-mosquitto:2"
SUITE = "bookworm"  # its python3 is 3.11, as the host's: the host's cp311 wheels install inside
BASE_TAG = f"cmemu-base:{SUITE}"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "mosquitto", "iproute2")
SOURCE_LABEL = "io.cmemu.image-source"  # registry | debootstrap
MOSQUITTO_LABEL = "io.cmemu.mosquitto"  # the broker's binary in the image, when it has one
MOSQUITTO_IN_IMAGE = "/usr/sbin/mosquitto"
# what the image build copies of the project (as compose/Dockerfile does)
PROJECT_PARTS = ("pyproject.toml", "README.md", "cmemu", "emulator", "services")
# left out of the rootfs before import: apt's caches and lists are not needed to run
ROOTFS_PRUNE = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man")
PULL_TIMEOUT_S = 60.0
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

Source = Literal["auto", "registry", "debootstrap"]
SOURCES: tuple[Source, ...] = ("auto", "registry", "debootstrap")
Say = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """How to build the emulator's image: from which source, into which tag, with which cache."""

    source: Source = "auto"
    project: Path  # the source checkout (pyproject.toml, compose/)
    tag: str = IMAGE
    cache_dir: Path  # the wheelhouse and the debootstrap scratch directory
    mirror: str = DEFAULT_MIRROR
    rebuild_base: bool = False  # debootstrap again even when BASE_TAG exists


@dataclass(frozen=True, kw_only=True)
class BuildResult:
    """A built image: its tag and size, and how long each step took."""

    tag: str
    source: Source
    seconds: float  # the whole build
    size_bytes: int
    base_seconds: float = 0.0  # debootstrap and import; 0 when BASE_TAG was reused
    steps: dict[str, float] = field(default_factory=dict)  # seconds per step


def run(argv: Sequence[str], *, what: str, stdin: int | None = None) -> str:
    """A command's stdout; a PreconditionError with its stderr's tail when it fails."""
    try:
        done = subprocess.run(list(argv), stdin=stdin, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise PreconditionError(f"{what}: {argv[0]} is not installed ({exc})") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise PreconditionError(f"{what} failed (exit {done.returncode}): {tail}")
    return done.stdout


def image_labels(tag: str) -> dict[str, str] | None:
    """The labels of a local image, or None when the engine has no such image."""
    done = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", tag],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return None
    return dict(json.loads(done.stdout.strip() or "null") or {})


def image_size(tag: str) -> int:
    return int(run(["docker", "image", "inspect", "--format", "{{.Size}}", tag], what="inspect"))


def registry_reachable(say: Say) -> bool:
    """Whether the registry base can be had: present already, or pulled now. An engine with no
    registry answers a pull at once (no such host), so auto costs a second there."""
    if image_labels(REGISTRY_BASE) is not None:
        return True
    try:
        done = subprocess.run(
            ["docker", "pull", "--quiet", REGISTRY_BASE],
            capture_output=True,
            text=True,
            check=False,
            timeout=PULL_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        say(f"pulling {REGISTRY_BASE} did not answer within {PULL_TIMEOUT_S:g} s")
        return False
    if done.returncode != 0:
        say(
            f"no registry: {done.stderr.strip().splitlines()[-1] if done.stderr else 'pull failed'}"
        )
    return done.returncode == 0


def find_project(start: Path | None = None) -> Path:
    """The source checkout: `start`, else the one this package was installed from (editable),
    else the current directory; it must hold pyproject.toml and compose/."""
    candidates = [start] if start else [Path(__file__).resolve().parents[2], Path.cwd()]
    for c in candidates:
        if c is not None and (c / "pyproject.toml").is_file() and (c / "compose").is_dir():
            return c
    raise PreconditionError(
        "cmemu image build needs the project's source (pyproject.toml and compose/): run it in "
        "a checkout or pass --source DIR"
    )


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cmemu" / "image"


def build(options: BuildOptions, say: Say = print) -> BuildResult:
    """Build IMAGE by the chosen path (auto: the registry's when its base can be had)."""
    if options.source not in SOURCES:
        raise UnknownNameError("image source", options.source, SOURCES)
    run(["docker", "version", "--format", "{{.Server.Version}}"], what="the Docker engine")
    source = options.source
    if source == "auto":
        source = "registry" if registry_reachable(say) else "debootstrap"
        say(f"image source: {source}")
    started = time.perf_counter()
    steps: dict[str, float] = {}
    if source == "registry":
        _timed(steps, "docker build", lambda: _build_registry(options))
    else:
        if options.rebuild_base or image_labels(BASE_TAG) is None:
            _timed(steps, "debootstrap and import", lambda: build_base(options, say))
        else:
            say(f"base {BASE_TAG}: reused (--rebuild-base makes it again)")
        with tempfile.TemporaryDirectory(prefix="cmemu-image-") as tmp:
            context = Path(tmp)
            _timed(steps, "wheelhouse", lambda: fill_wheelhouse(options, context, say))
            _timed(steps, "docker build", lambda: _build_airgap(options, context))
    # the image this one replaces, now untagged: removed, as are only the emulator's own
    run(
        ["docker", "image", "prune", "--force", "--filter", f"label={SOURCE_LABEL}"],
        what="removing the replaced image",
    )
    return BuildResult(
        tag=options.tag,
        source=source,
        seconds=time.perf_counter() - started,
        size_bytes=image_size(options.tag),
        base_seconds=steps.get("debootstrap and import", 0.0),
        steps=steps,
    )


def _timed(steps: dict[str, float], name: str, call: Callable[[], object]) -> None:
    t0 = time.perf_counter()
    call()
    steps[name] = time.perf_counter() - t0


def _build_registry(options: BuildOptions) -> None:
    run(
        [
            "docker", "build", "--quiet", "-f", str(options.project / "compose" / "Dockerfile"),
            "--label", f"{SOURCE_LABEL}=registry", "-t", options.tag, str(options.project),
        ],
        what=f"docker build FROM {REGISTRY_BASE}",
    )  # fmt: skip


def build_base(options: BuildOptions, say: Say) -> None:
    """debootstrap a minimal Debian with BASE_PACKAGES, prune it, import it as BASE_TAG."""
    if shutil.which("debootstrap") is None and not Path("/usr/sbin/debootstrap").exists():
        raise PreconditionError(
            "the air-gapped image starts from a Debian root file system: apt-get install "
            "debootstrap (or build with --source registry where a registry is reachable)"
        )
    if os.geteuid() != 0:
        raise PreconditionError("debootstrap needs root: run `cmemu image build` as root (sudo)")
    options.cache_dir.mkdir(parents=True, exist_ok=True)
    rootfs = Path(tempfile.mkdtemp(prefix="rootfs-", dir=options.cache_dir))
    try:
        say(f"debootstrap {SUITE} ({', '.join(BASE_PACKAGES)}) from {options.mirror}")
        run(
            [
                shutil.which("debootstrap") or "/usr/sbin/debootstrap", "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}", SUITE, str(rootfs), options.mirror,
            ],
            what="debootstrap",
        )  # fmt: skip
        for part in ROOTFS_PRUNE:
            target = rootfs / part
            if target.is_dir():
                shutil.rmtree(target)
                target.mkdir()
        say(f"docker import as {BASE_TAG}")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        try:
            run(
                [
                    "docker", "import",
                    "--change", f"ENV PATH={BASE_PATH}",
                    "--change", f"LABEL {SOURCE_LABEL}=debootstrap",
                    "-", BASE_TAG,
                ],
                what="docker import",
                stdin=tar.stdout.fileno(),
            )  # fmt: skip
        finally:
            tar.stdout.close()
            if tar.wait() != 0:
                raise PreconditionError(f"tar of the root file system exited {tar.returncode}")
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)


def fill_wheelhouse(options: BuildOptions, context: Path, say: Say) -> None:
    """The build context: the Dockerfile and wheels/ (the emulator's wheel and every dependency,
    built or fetched by pip on the host, through its cache)."""
    source = context / "src"
    for part in PROJECT_PARTS:
        path = options.project / part
        if path.is_dir():
            shutil.copytree(
                path, source / part, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
            )
        elif path.is_file():
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / part)
        else:
            raise PreconditionError(f"the project has no {part} ({options.project})")
    say("pip wheel: the emulator and its dependencies into the build context")
    run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(context / "wheels"),
         str(source)],
        what="pip wheel",
    )  # fmt: skip
    shutil.rmtree(source)
    shutil.copy2(options.project / "compose" / "Dockerfile.airgap", context / "Dockerfile")


def _build_airgap(options: BuildOptions, context: Path) -> None:
    run(
        [
            "docker", "build", "--quiet", "--network", "none", "--build-arg", f"BASE={BASE_TAG}",
            "--label", f"{SOURCE_LABEL}=debootstrap",
            "--label", f"{MOSQUITTO_LABEL}={MOSQUITTO_IN_IMAGE}",
            "-t", options.tag, str(context),
        ],
        what=f"docker build FROM {BASE_TAG}",
    )  # fmt: skip


def check_tag(tag: str) -> str:
    """An image reference a person typed: NAME[:TAG], lower case."""
    name = tag.split(":", maxsplit=1)[0]
    if not name or name != name.lower() or " " in tag:
        raise InvalidArgumentError(f"{tag!r} is not an image name (name[:tag], lower case)")
    return tag
