"""The control plane: schema and migrations, catalog, operator CLI, launcher."""
