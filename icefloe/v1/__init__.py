"""Generated gRPC/protobuf modules of the ``icefloe.v1`` API (``proto/icefloe/v1``).

Do not edit the ``*_pb2*`` files: regenerate them with ``scripts/gen-proto.sh``;
``tests/core/test_proto.py`` fails when they are out of date.
"""
