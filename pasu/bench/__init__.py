"""Benchmarks that print the figures the issues ask for (`pasu bench ...`)."""
