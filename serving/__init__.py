"""mindvl.serving: model packages served through the MindSpore Serving 2.0 protocol (REST and gRPC) and servable layout."""
