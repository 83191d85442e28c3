"""Tutti: collective communication for distributed training (docs/python.md)."""
