"""PASU protos package (installed as pasu.protos)."""
