"""PASU models package (installed as pasu.models)."""
