"""The pieces of `procmesh.convert`, split by what they map; import them from `procmesh.convert`."""
