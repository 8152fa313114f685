"""One module per CLI command, each with `register(app)`. Keep module-level imports light."""
