"""Instruments: trainer hooks that measure a run (one file each, a tiny shared base). Import them from their
modules: this package loads none, so reading the machine's facts (`machine`) needs no torch."""
