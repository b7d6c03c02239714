"""xds-protos ships older copies of the OTLP protos at the module paths of opentelemetry-proto, which the
OpenTelemetry SDK's exporter needs (extproc/tracing.py); the install (Makefile, Dockerfile) leaves
opentelemetry-proto's on disk.  Every module of both distributions must then import together, Envoy's
included: the newer OTLP files still carry every message Envoy's protos use."""
from __future__ import annotations

import subprocess
import sys

# importlib.metadata lists a distribution's files; every *.py is imported, in a fresh interpreter
# (warnings are errors there too: a gencode/runtime mismatch warns)
PROGRAM = """
import importlib, sys
from importlib.metadata import distribution
for dist in sys.argv[1:]:
    for f in distribution(dist).files or ():
        if f.suffix == ".py" and f.parts[0] != "test":  # test.v1 is shadowed by the standard library's test
            importlib.import_module(".".join(f.with_suffix("").parts).removesuffix(".__init__"))
from opentelemetry.proto.trace.v1 import trace_pb2
print(len(sys.modules), trace_pb2.ScopeSpans.DESCRIPTOR.full_name)
"""


def test_xds_protos_and_opentelemetry_proto_import_together() -> None:
    r = subprocess.run([sys.executable, "-W", "error", "-c", PROGRAM, "xds-protos", "opentelemetry-proto",
                        "opentelemetry-exporter-otlp-proto-grpc"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    modules, scope_spans = r.stdout.split()
    assert int(modules) > 1800 and scope_spans == "opentelemetry.proto.trace.v1.ScopeSpans"
