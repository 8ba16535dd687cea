"""Generated from proto/procmesh/v1 by `make proto`; do not edit."""
