"""PASU cloud package (installed as pasu.cloud)."""
