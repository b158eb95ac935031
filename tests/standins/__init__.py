"""Loopback stand-ins for cloud services (cloud.md section 6.5): test code, stdlib only."""
