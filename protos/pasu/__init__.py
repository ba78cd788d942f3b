"""Proto package `pasu` (folders follow the proto package names, as protoc expects)."""
