"""Server reflection under both names clients use: grpc.reflection.v1 and v1alpha.

grpcio-reflection ships only v1alpha. The v1 protocol is the same messages under a new package, so
we register the v1 file descriptor (v1alpha's with its package renamed, so that `grpcurl describe`
works on it too) and serve it with the same servicer: the bytes on the wire are identical.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer

if TYPE_CHECKING:
    _Generic = grpc.GenericRpcHandler[Any, Any]
else:  # generic in grpc-stubs only
    _Generic = grpc.GenericRpcHandler

V1ALPHA = "grpc.reflection.v1alpha"
V1 = "grpc.reflection.v1"
V1_SERVICE = f"{V1}.ServerReflection"


@cache
def _register_v1_descriptor() -> None:
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = "grpc/reflection/v1/reflection.proto"
    proto.package = V1
    for message in proto.message_type:
        for fld in message.field:
            if fld.HasField("type_name"):
                fld.type_name = fld.type_name.replace(f".{V1ALPHA}.", f".{V1}.")
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(f".{V1ALPHA}.", f".{V1}.")
            method.output_type = method.output_type.replace(f".{V1ALPHA}.", f".{V1}.")
    descriptor_pool.Default().Add(proto)


def enable_reflection(server: grpc.aio.Server, service_names: tuple[str, ...]) -> None:
    server.add_generic_rpc_handlers(_handlers(service_names))


@cache
def _handlers(service_names: tuple[str, ...]) -> tuple[_Generic, ...]:
    """One servicer and its two handlers for every server that serves the same services: the
    servicer keeps nothing of a call, so all of cm384's NPU servers share one (issue 18: two
    dictionaries, two handlers and a servicer per server before)."""
    _register_v1_descriptor()
    names = [*service_names, reflection.SERVICE_NAME, V1_SERVICE]
    servicer = ReflectionServicer(names)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    return tuple(
        grpc.method_handlers_generic_handler(service, {"ServerReflectionInfo": handler})
        for service in (reflection.SERVICE_NAME, V1_SERVICE)
    )
