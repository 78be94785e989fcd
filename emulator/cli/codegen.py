"""Regenerate the Python wire code in cmemu/v1/ from protos/, or check that it has not drifted.

    python -m cmemu.emulator.cli.codegen           # rewrite cmemu/v1/*_pb2*.py(i)
    python -m cmemu.emulator.cli.codegen --check   # exit 1 listing the files that differ

The generated code is committed so that a plain `pip install` needs no protoc; this module is the
one way to produce it, so a reviewer can always reproduce it byte for byte.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = ROOT / "protos"
PACKAGE_DIR = Path("cmemu") / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def _protos() -> list[Path]:
    return sorted((PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) with the mypy-protobuf plugins into out_dir."""
    protos = _protos()
    plugin_dir = Path(sys.executable).parent
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--plugin=protoc-gen-mypy={plugin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={plugin_dir / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *[str(p.relative_to(PROTO_ROOT)) for p in protos],
    ]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return sorted(
        p for p in (out_dir / PACKAGE_DIR).iterdir() if p.name.endswith(GENERATED_SUFFIXES)
    )


def _committed() -> dict[str, Path]:
    return {
        p.name: p for p in (ROOT / PACKAGE_DIR).iterdir() if p.name.endswith(GENERATED_SUFFIXES)
    }


def drift() -> list[str]:
    """Names of generated files that differ from, are missing in, or are extra in cmemu/v1/."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p for p in generate(Path(tmp))}
        committed = _committed()
        differ = [
            name
            for name in sorted(fresh.keys() | committed.keys())
            if name not in fresh
            or name not in committed
            or not filecmp.cmp(fresh[name], committed[name], shallow=False)
        ]
    return differ


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cmemu.emulator.cli.codegen", description=__doc__
    )
    parser.add_argument("--check", action="store_true", help="report drift instead of rewriting")
    args = parser.parse_args(argv)
    if args.check:
        differ = drift()
        if differ:
            print("generated code drifted from protos/: " + ", ".join(differ), file=sys.stderr)
            print("run: python -m cmemu.emulator.cli.codegen", file=sys.stderr)
            return 1
        print("generated code matches protos/")
        return 0
    target = ROOT / PACKAGE_DIR
    for stale in _committed().values():
        stale.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(Path(tmp)):
            shutil.copyfile(path, target / path.name)
            print(f"wrote {PACKAGE_DIR / path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
