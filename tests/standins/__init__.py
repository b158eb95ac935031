"""Loopback stand-ins for cloud services, modelled on Google's API documentation; used by the
tests and scripts/sandbox.py: stdlib only."""
