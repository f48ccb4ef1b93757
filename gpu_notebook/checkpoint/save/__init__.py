"""The save pipeline behind :meth:`Checkpointer.save`, run on a background thread:

1. ``plan``: split the snapshot's leaves into chunks, each paired with the chunk of the last committed snapshot it
   may be a delta against (``lineage``), and find the chunks already in the store.
2. ``encode``: per chunk, on the I/O threads: hash it (BLAKE3 of the raw bytes), reuse it if the store has those
   bytes, else encode it as a lossless delta (or in full for a base) and upload it; small frames are packed.
3. ``commit``: write the manifest last, create-only (rank 0 gathers the shards of a sharded save).

``persist`` runs the three in order and retries a failed attempt.
"""
