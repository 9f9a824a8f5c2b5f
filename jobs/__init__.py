"""Pipeline jobs: each module is one job, runnable as ``python -m jobs.<name>``."""
