"""`cmemu k8s`: the Kubernetes manifests of a preset (emulator/runtime/k8sgen.py), written into a
directory that `kubectl apply -f DIR` takes whole, and `cmemu up --from-k8s DIR` runs locally."""

from __future__ import annotations

import argparse
from pathlib import Path

from cmemu.emulator.cli.up import add_preset_arg
from cmemu.emulator.model.topology import DNS_LABEL
from cmemu.emulator.runtime import k8sgen
from cmemu.emulator.runtime.serve import PER


def cmd_k8s(args: argparse.Namespace) -> int:
    written = k8sgen.write(
        args.preset, args.per, Path(args.output), namespace=args.namespace, image=args.image
    )
    for path in written:
        secret = path.name == k8sgen.SECRETS_FILE
        note = " (the token: keep it out of version control)" if secret else ""
        print(f"wrote {path}{note}")
    print(f"apply: kubectl apply -f {args.output}   run locally: cmemu up --from-k8s {args.output}")
    return 0


def _namespace(text: str) -> str:
    if not DNS_LABEL.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a DNS label (a-z, 0-9, -)")
    return text


def k8s_args(p: argparse.ArgumentParser) -> None:
    add_preset_arg(p)
    p.add_argument(
        "--per",
        choices=PER,
        default="node",
        help="one pod per node (default: its devices on consecutive ports) or per device",
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="DIR",
        help="the directory to write (new, empty, or an earlier `cmemu k8s` output, whose "
        "token is kept)",
    )
    p.add_argument(
        "--namespace",
        type=_namespace,
        default=k8sgen.DEFAULT_NAMESPACE,
        help=f"the namespace of every object (default {k8sgen.DEFAULT_NAMESPACE})",
    )
    p.add_argument(
        "--image",
        default=k8sgen.DEFAULT_IMAGE,
        help=f"the emulator's image, pushed where the cluster pulls from (default "
        f"{k8sgen.DEFAULT_IMAGE}, built by compose/Dockerfile)",
    )
