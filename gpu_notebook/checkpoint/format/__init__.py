"""The checkpoint format: the store layout and manifests (``manifest``), chunk frames (``codec``, with the C
kernels of ``_planes.c``) and the JSON tree of a saved state (``tree``). ``docs/checkpoint-format.md`` describes
the bytes; everything that reads or writes them lives here."""
