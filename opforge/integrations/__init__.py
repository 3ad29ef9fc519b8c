"""Adapters that make other libraries use opforge's ops."""
