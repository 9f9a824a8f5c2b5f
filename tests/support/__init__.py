"""Test support that runs outside pytest too (on test hosts, from bench scripts)."""
