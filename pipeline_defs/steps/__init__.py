"""The run protocol: step declaration, context, claim-to-publish, leases, mutations, and its
Dagster wiring (the asset factory and the checkpoint IO manager)."""
