"""PASU device package (installed as pasu.device)."""
