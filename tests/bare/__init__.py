"""Test support: a bare interpreter (sitecustomize.py), put first on PYTHONPATH by `make test-bare` and tests."""
