"""Bundled sample stories (markdown) for the demo: recurring characters, costume changes."""
