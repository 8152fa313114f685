"""Probes send real requests through the entry and record what came back. They never judge."""
