"""The committed gRPC stubs must match protos/externalscaler.proto and ship in a plain install."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from google.protobuf import descriptor_pb2

from scaler import protogen
from scaler._proto import externalscaler_pb2

ROOT = Path(__file__).resolve().parent.parent


def _descriptor_from_proto(tmp_path: Path) -> descriptor_pb2.FileDescriptorProto:
    from grpc_tools import protoc

    out = tmp_path / "set.pb"
    args = ["protoc", f"-I{protogen.PROTO.parent}", f"--descriptor_set_out={out}", str(protogen.PROTO)]
    assert protoc.main(args) == 0
    file_set = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    proto = file_set.file[0]
    for message in proto.message_type:  # protoc adds json_name; generated code omits it
        for field in [*message.field, *(f for nested in message.nested_type for f in nested.field)]:
            field.ClearField("json_name")
    return proto


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    committed = descriptor_pb2.FileDescriptorProto.FromString(externalscaler_pb2.DESCRIPTOR.serialized_pb)
    assert committed == _descriptor_from_proto(tmp_path), (
        "scaler/_proto is stale: run `python -m scaler.protogen` and commit the result"
    )


def test_regenerated_grpc_module_matches_committed(tmp_path: Path) -> None:
    protogen.generate(out_dir=tmp_path)
    fresh = (tmp_path / "externalscaler_pb2_grpc.py").read_text()
    committed = (protogen.OUT / "externalscaler_pb2_grpc.py").read_text()
    strip = lambda text: [ln for ln in text.splitlines() if "GRPC_GENERATED_VERSION =" not in ln]  # noqa: E731
    assert strip(fresh) == strip(committed)


def test_wire_contract_field_numbers() -> None:
    """KEDA's field numbers from DESIGN.md: a KEDA-generated client depends on them."""
    expected = {
        "ScaledObjectRef": {"name": 1, "namespace": 2, "scalerMetadata": 3},
        "IsActiveResponse": {"result": 1},
        "GetMetricSpecResponse": {"metricSpecs": 1},
        "MetricSpec": {"metricName": 1, "targetSize": 2, "targetSizeFloat": 3},
        "GetMetricsRequest": {"scaledObjectRef": 1, "metricName": 2},
        "GetMetricsResponse": {"metricValues": 1},
        "MetricValue": {"metricName": 1, "metricValue": 2, "metricValueFloat": 3},
    }
    messages = externalscaler_pb2.DESCRIPTOR.message_types_by_name
    for message, fields in expected.items():
        got = {f.name: f.number for f in messages[message].fields}
        assert got == fields, message
    assert externalscaler_pb2.DESCRIPTOR.package == "externalscaler"
    service = externalscaler_pb2.DESCRIPTOR.services_by_name["ExternalScaler"]
    assert {m.name for m in service.methods} >= {"IsActive", "StreamIsActive", "GetMetricSpec", "GetMetrics"}


def test_plain_wheel_ships_the_stubs(tmp_path: Path) -> None:
    """A regular (non-editable) build must contain importable stubs, not only the source tree."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)],
        check=True,
    )
    (wheel,) = tmp_path.glob("leadscale-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("scaler/_proto/__init__.py", "scaler/_proto/externalscaler_pb2.py",
                   "scaler/_proto/externalscaler_pb2_grpc.py", "scaler/py.typed"):
        assert needed in names
