"""Generate the gRPC stubs in ``scaler/_proto`` from ``protos/externalscaler.proto``.

The stubs are committed so that a plain ``pip install .`` ships them; ``tests/test_proto_stubs.py``
fails whenever they and the proto disagree. Run ``python -m scaler.protogen`` after editing the proto.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "protos" / "externalscaler.proto"
OUT = Path(__file__).resolve().parent / "_proto"


def generate(out_dir: Path = OUT, proto: Path = PROTO) -> list[Path]:
    """Run grpcio-tools' protoc and make the grpc module import its sibling relatively."""
    from grpc_tools import protoc  # build-time tool, imported only here

    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{proto.parent}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(proto),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {proto}")
    grpc_module = out_dir / "externalscaler_pb2_grpc.py"
    text = grpc_module.read_text()
    text = re.sub(r"^import externalscaler_pb2 as", "from . import externalscaler_pb2 as", text, flags=re.M)
    grpc_module.write_text(text)
    init = out_dir / "__init__.py"
    if not init.exists():
        init.write_text('"""Generated from protos/externalscaler.proto by scaler.protogen; do not edit."""\n')
    return sorted(out_dir.glob("externalscaler_pb2*"))


if __name__ == "__main__":
    for path in generate():
        print(path.relative_to(ROOT), file=sys.stderr)
