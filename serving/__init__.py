"""mindvl.serving: model packages served through the MindSpore Serving 2.0 protocol (REST and gRPC) and servable layout."""


def __getattr__(name):
    """`from mindvl.serving import Client, ServingError` without importing grpc at `import mindvl.serving`."""
    if name in ("Client", "ServingError"):
        from mindvl.serving import client

        return getattr(client, name)
    raise AttributeError(f"module 'mindvl.serving' has no attribute {name!r}")
