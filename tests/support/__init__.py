"""Test support: real service processes on port 0 and the clusters built from them."""
