"""Runs made to answer a question: many configs in one process (batch), a recommendation verified by
re-running it (verify), a grid of switches (sweep), and a search for the fastest setting (tune)."""
