"""The pure resume domain: completion reports, the decision table, settings, typed errors.

Nothing in this package imports dagster or sqlalchemy (a test pins it), so the judge can
be reasoned about and property-tested in isolation.
"""
