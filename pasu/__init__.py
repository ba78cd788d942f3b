"""PASU: pilot-assisted speech understanding on the edge, with offloading to the cloud."""

__version__ = "0.1.0"
