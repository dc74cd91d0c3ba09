"""Pydantic models for every contract in DESIGN §4."""
