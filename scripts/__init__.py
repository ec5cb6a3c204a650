"""Development scripts: the launcher (dev.py), the embedded store, the bundled model, the readiness wait."""
