"""pytest plugin: collects programs/**/test.toml manifests (being built for the regression issue)."""
