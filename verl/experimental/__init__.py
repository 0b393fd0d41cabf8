"""Interfaces upstream marks experimental; kept at upstream's import paths so user code imports them unchanged."""
