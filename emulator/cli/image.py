"""`cmemu image build|ls`: the emulator's one image, from a registry or with none
(emulator/runtime/image.py builds it; this parses and prints)."""

from __future__ import annotations

import argparse
from pathlib import Path

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.runtime import image


def cmd_image(args: argparse.Namespace) -> int:
    if args.image_command == "ls":
        for tag in (image.IMAGE, image.BASE_TAG, image.REGISTRY_BASE, image.BROKER_IMAGE):
            labels = image.image_labels(tag)
            if labels is None:
                print(f"{tag:<32} absent")
            else:
                size = image.image_size(tag) / 1e6
                source = labels.get(image.SOURCE_LABEL, "-")
                print(f"{tag:<32} {size:>7.0f} MB  source {source}")
        return 0
    options = image.BuildOptions(
        source=args.source,
        project=image.find_project(Path(args.project) if args.project else None),
        tag=args.tag,
        cache_dir=Path(args.cache_dir) if args.cache_dir else image.default_cache_dir(),
        mirror=args.mirror,
        rebuild_base=args.rebuild_base,
    )
    result = image.build(options, say=lambda line: print(f"cmemu image: {line}", flush=True))
    steps = ", ".join(f"{name} {s:.1f} s" for name, s in result.steps.items())
    print(
        f"built {result.tag} ({result.source}) in {result.seconds:.1f} s ({steps}); "
        f"{result.size_bytes / 1e6:.0f} MB"
    )
    return 0


def _tag(text: str) -> str:
    try:
        return image.check_tag(text)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def image_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="image_command", required=True, metavar="build|ls")
    build = sub.add_parser("build", help="build the emulator's image (registry or air-gapped)")
    build.add_argument(
        "--source",
        choices=image.SOURCES,
        default="auto",
        help="registry: compose/Dockerfile FROM python:3.11-slim; debootstrap: a Debian root "
        "file system made here and a host wheelhouse, no registry; auto (default): the "
        "registry's when its base image can be had, else debootstrap",
    )
    build.add_argument("--tag", type=_tag, default=image.IMAGE, help=f"(default {image.IMAGE})")
    build.add_argument("--project", metavar="DIR", help="the source checkout (default: this one)")
    build.add_argument(
        "--cache-dir", metavar="DIR", help="scratch space (default ~/.cache/cmemu/image)"
    )
    build.add_argument(
        "--mirror", default=image.DEFAULT_MIRROR, help="Debian mirror for debootstrap"
    )
    build.add_argument(
        "--rebuild-base",
        action="store_true",
        help=f"debootstrap again even when {image.BASE_TAG} exists (it is made once and reused)",
    )
    sub.add_parser("ls", help="the emulator's images and bases present in the engine")
