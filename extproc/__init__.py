"""The gateway's external-processing (ext_proc) gRPC service and its pure request rules."""
