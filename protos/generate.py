"""Regenerate the Python protobuf / gRPC code in server/dwsearch/v1 from protos/.

Run as `python protos/generate.py` (or `make protos`). The generated package is
`dwsearch.v1` (server/dwsearch/v1/); never edit it by hand. `--check` exits 1 when the
checked-in code differs from what the protos produce.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PROTO_DIR = PROTO_ROOT / "dwsearch" / "v1"
TARGET = ROOT / "server" / "dwsearch" / "v1"
HEADER = '"""Generated from protos/dwsearch/v1 by protos/generate.py. Do not edit."""\n'


def generate(out_dir: Path) -> list[Path]:
    """Generate into out_dir (a stand-in for server/dwsearch/v1); return the files written."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_DIR.glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for src in sorted((Path(tmp) / "dwsearch" / "v1").iterdir()):
            dst = out_dir / src.name
            shutil.copyfile(src, dst)
            written.append(dst)
        init = out_dir / "__init__.py"
        init.write_text(HEADER)
        written.append(init)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when server/dwsearch/v1 is stale")
    args = parser.parse_args()
    if not args.check:
        for old in TARGET.glob("*_pb2*.py*"):
            old.unlink()
        generate(TARGET)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = sorted(p.name for p in generate(Path(tmp)))
        current = sorted(p.name for p in TARGET.iterdir() if p.is_file())
        _, mismatch, errors = filecmp.cmpfiles(tmp, TARGET, fresh, shallow=False)
        stale = sorted(set(mismatch) | set(errors) | (set(current) ^ set(fresh)))
    if stale:
        print("server/dwsearch/v1 is stale; run `make protos`:", ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
